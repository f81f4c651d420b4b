"""One availability trace, one start: where the deadline policy's money goes against the offline optimum's.

For a cell that bench/deadline_policy.py lists under 80% of the optimum's saving: the spot trace tick by tick
('#' spot can be had, '.' it cannot) under what each policy runs ('s' spot, 'o' on-demand, 'i' idle or
restarting), and the hours and cost of each. Start K is bench/deadline_policy.py's K-th start point (odd K:
held out from the tuning).

    python bench/deadline_timeline.py us-west-2b_v100_8 --slack 4 --overhead 12 --start 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from deadline_policy import TRACES, WORK_H, prices, starts  # noqa: E402

from orchestrator.sim.availability import Job, Outcome, load_trace, study  # noqa: E402

WIDTH = 120  # ticks a line
NAMES = ("uniform-progress", "deadline", "optimal")


def modes(o: Outcome, ticks: int, tick_min: int) -> str:
    """The first letter of the mode run at each tick ('-' before the first choice, ' ' once finished)."""
    out, j, cur = [], 0, "-"
    for i in range(ticks):
        t = i * tick_min
        while j < len(o.timeline) and o.timeline[j][0] <= t + 1e-9:
            cur = str(o.timeline[j][1])[0]
            j += 1
        out.append(cur if t < o.finish_min else " ")
    return "".join(out)


def hours(o: Outcome) -> str:
    spans: dict[str, float] = {}
    ends = [*o.timeline[1:], (o.finish_min, None)]
    for (t0, m), (t1, _) in zip(o.timeline, ends, strict=True):
        if t1 <= t0:
            continue
        spans[str(m)] = spans.get(str(m), 0.0) + (t1 - t0) / 60
    return ", ".join(f"{k} {v:.1f} h" for k, v in sorted(spans.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="a trace's name, e.g. us-west-2b_v100_8")
    ap.add_argument("--slack", type=int, default=4, help="hours of slack on the 48 h job")
    ap.add_argument("--overhead", type=int, default=12, help="restart overhead, minutes")
    ap.add_argument("--start", type=int, default=1, help="bench/deadline_policy.py's start point (0-7)")
    ap.add_argument("--book", default="2019-02", help="price book")
    args = ap.parse_args()
    found = sorted(TRACES.glob(f"*/*/{args.trace}.json"))
    if not found:
        print(f"no trace {args.trace!r} under {TRACES}", file=sys.stderr)
        return 2
    tr = load_trace(found[0])
    spot, od = prices(tr.name, args.book)
    start = starts(len(tr.counts), tr.tick_min)[args.start]
    job = Job(WORK_H * 60, (WORK_H + args.slack) * 60, args.overhead, spot, od)
    runs = {o.policy: o for o in study(job, tr, start, ("on-demand", *NAMES))}
    print(f"{found[0].parent.parent.name}/{tr.name}, start point {args.start} (tick {start}), slack {args.slack} h, "
          f"overhead {args.overhead} min; spot ${spot}/h, on-demand ${od}/h")
    print(f"  {'on-demand alone':17} ${runs['on-demand'].cost_usd:6.1f}")
    for n in NAMES:
        print(f"  {n:17} ${runs[n].cost_usd:6.1f}  {hours(runs[n])}; {len(runs[n].timeline)} changes")
    ticks = (WORK_H + args.slack) * 60 // tr.tick_min
    avail = "".join("#" if x else "." for x in tr.available()[start:start + ticks])
    rows = {n: modes(runs[n], ticks, tr.tick_min) for n in NAMES}
    for i in range(0, ticks, WIDTH):
        print(f"{i * tr.tick_min / 60:5.1f} h  {'spot':17} {avail[i:i + WIDTH]}")
        for n in NAMES:
            print(f"{'':8} {n:17} {rows[n][i:i + WIDTH]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
