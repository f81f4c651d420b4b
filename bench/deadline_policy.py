"""Finish by the deadline at the least cost (issue 23): every policy on every measured availability trace.

Job: 48 h of work, deadline 52 h or 70 h (slack 4 h / 22 h), restart overhead 3 or 12 min, prices of the
trace's GPU (V100 or K80) from the price book (data/prices.csv, whole VMs of GCE 2019-02 by default).
Each trace (shared/spot-traces/availability, "Can't Be Late", NSDI'24: measured by asking AWS for spot
capacity) is replayed from START_POINTS start ticks spread over it, each after 24 h of history.

Held out: the deadline policy's constants (core/policy.py RESERVE_CYCLES, HOP_GAIN, OUTAGE_SHARE) were
tuned with ``--tune`` on the EVEN start points only; the table reports the ODD start points, which no
tuning saw. The optimum is the offline dynamic program (knows the trace); "share" is the share of the
on-demand-to-optimum saving a policy captured, (cost_on_demand - cost) / (cost_on_demand - cost_optimal),
over the cell's runs summed.

    python bench/deadline_policy.py             # the held-out table
    python bench/deadline_policy.py --tune      # the grid search on the tuning start points
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.core import policy  # noqa: E402
from orchestrator.core.catalog import load_catalog  # noqa: E402
from orchestrator.sim.availability import HISTORY_H, Job, Outcome, load_trace, saving_share, study  # noqa: E402

TRACES = REPO.parent.parent / "shared" / "spot-traces" / "availability"
if not TRACES.exists():
    TRACES = Path("/work/shared/spot-traces/availability")
WORK_H = 48
SLACKS_H = (4, 22)
OVERHEADS_MIN = (3, 12)
START_POINTS = 8
NAMES = policy.DEADLINE_POLICIES


def starts(n_ticks: int, tick_min: int) -> list[int]:
    first = round(HISTORY_H * 60 / tick_min)
    last = n_ticks - round((WORK_H + max(SLACKS_H)) * 60 / tick_min) - 1
    return [first + (last - first) * k // (START_POINTS - 1) for k in range(START_POINTS)]


def prices(trace_name: str, book: str) -> tuple[float, float]:
    gpu = trace_name.split("_")[1]
    pb = load_catalog().price_book(book)
    spot, od = pb.gpu_hourly(gpu, True), pb.gpu_hourly(gpu, False)
    assert spot is not None and od is not None, f"no {gpu} price in book {book}"
    return spot, od


def run_all(parity: int, book: str) -> dict[tuple[str, int, int], list[dict[str, Outcome]]]:
    cells: dict[tuple[str, int, int], list[dict[str, Outcome]]] = defaultdict(list)
    for path in sorted(TRACES.glob("*/*/*.json")):
        tr = load_trace(path)
        spot, od = prices(tr.name, book)
        label = f"{path.parent.parent.name}/{tr.name}"
        for k, start in enumerate(starts(len(tr.counts), tr.tick_min)):
            if k % 2 != parity:
                continue
            for slack, ovh in itertools.product(SLACKS_H, OVERHEADS_MIN):
                job = Job(WORK_H * 60, (WORK_H + slack) * 60, ovh, spot, od)
                cells[label, slack, ovh].append({o.policy: o for o in study(job, tr, start, NAMES)})
    return cells


def share(runs: list[dict[str, Outcome]], name: str) -> float | None:
    return saving_share(*(sum(r[n].cost_usd for r in runs) for n in (name, "on-demand", "optimal")))


def score(cells: dict[tuple[str, int, int], list[dict[str, Outcome]]]) -> tuple[int, int, int, float]:
    """(deadlines missed, runs dearer than uniform-progress, cells under 80% share, mean share)."""
    missed = sum(not r["deadline"].deadline_met for runs in cells.values() for r in runs)
    dearer = sum(r["deadline"].cost_usd > r["uniform-progress"].cost_usd + 1e-6 for runs in cells.values()
                 for r in runs)
    shares = [s for runs in cells.values() if (s := share(runs, "deadline")) is not None]
    return missed, dearer, sum(s < 0.8 for s in shares), sum(shares) / max(1, len(shares))


def tune(book: str) -> None:
    grid = {"RESERVE_CYCLES": (0.25, 0.5, 1.0), "HOP_GAIN": (1.0, 2.0, 4.0), "OUTAGE_SHARE": (1.0, 3.0)}
    print("tuning on the even start points: missed, dearer than UP, cells < 80%, mean share")
    for values in itertools.product(*grid.values()):
        for key, v in zip(grid, values, strict=True):
            setattr(policy, key, v)
        print(dict(zip(grid, values, strict=True)), score(run_all(0, book)), flush=True)


def table(book: str) -> None:
    cells = run_all(1, book)
    head = f"{'trace':34} {'slack':>5} {'ovh':>4} " + " ".join(f"{n:>17}" for n in NAMES)
    print(f"Held-out start points ({START_POINTS // 2} per trace); per policy: mean cost $, deadlines met, "
          "share of the optimum's saving")
    print(head)
    for (label, slack, ovh), runs in cells.items():
        parts = []
        for n in NAMES:
            cost = sum(r[n].cost_usd for r in runs) / len(runs)
            met = sum(r[n].deadline_met for r in runs)
            s = share(runs, n)
            parts.append(f"{cost:7.1f} {met}/{len(runs)} {'' if s is None else f'{100 * s:4.0f}%':>5}")
        print(f"{label:34} {slack:>4}h {ovh:>3}m " + " ".join(f"{p:>17}" for p in parts))
    missed, dearer, low, mean = score(cells)
    runs_n = sum(len(r) for r in cells.values())
    worst = min((s, k) for k, runs in cells.items() if (s := share(runs, "deadline")) is not None)
    above = [k for k, runs in cells.items() if sum(r["deadline"].cost_usd - r["uniform-progress"].cost_usd
                                                    for r in runs) > 1e-6]
    print(f"\ndeadline policy: mean cost above uniform-progress in {len(above)} of {len(cells)} cells "
          f"({', '.join(f'{k[0]} {k[1]}h {k[2]}m' for k in above) or 'none'})")
    print(f"deadline policy over {runs_n} held-out runs: {missed} deadlines missed; dearer than uniform-progress "
          f"in {dearer}; {low} of {len(cells)} cells under 80% of the optimum's saving (worst {100 * worst[0]:.0f}% "
          f"on {worst[1]}); mean share {100 * mean:.0f}%")
    for n in NAMES:
        print(f"  {n:17} share of the saving over all runs: "
              f"{100 * (share([r for runs in cells.values() for r in runs], n) or 0):.0f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--book", default="2019-02", help="price book (data/price_books.csv)")
    args = ap.parse_args()
    tune(args.book) if args.tune else table(args.book)


if __name__ == "__main__":
    main()
