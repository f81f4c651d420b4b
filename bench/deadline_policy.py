"""Finish by the deadline at the least cost (issue 23): every policy on every measured availability trace.

Job: 48 h of work, deadline 52 h or 70 h (slack 4 h / 22 h), restart overhead 3 or 12 min, prices of the
trace's GPU (V100 or K80) from the price book (data/prices.csv, whole VMs of GCE 2019-02 by default).
Each trace (shared/spot-traces/availability, "Can't Be Late", NSDI'24: measured by asking AWS for spot
capacity) is replayed from START_POINTS start ticks spread over it, each after 24 h of history.

Held out: the deadline policy's constants (deadline.py LINE_WAIT, LINE_HOP, HOP_GAIN, HOP_BUDGET, WAIT_SHORT) were
tuned with ``--tune`` on the EVEN start points only, scored both as the simulator runs the policy and as the
daemon then did (no history at all; it now learns the stretches it sees during the job, which no
retuning has scored); the table reports the ODD start points, which no tuning saw. Today (2019-02
prices, 2026-12-02): 0 deadlines missed, 8 of 44 cells dearer than uniform-progress (6 at 22 h / 12 min), 8 under
80% of the optimum's saving (all with the 12-minute overhead), 93% of the saving over all runs (uniform-progress
88%). Per setting (slack x overhead over every trace) the share is >= 80% in all four for ``deadline`` and for the
daemon's path (``deadline-in-job``), but the ``GOAL per setting`` line fails at 4 h / 12 min and 22 h / 12 min on
traces whose mean is above uniform-progress. On the tuning (even) points slack 4 h with the 12-minute overhead
captures 77% (76% in-job), so that setting's held-out 84% (81%) is no wide margin.

The baseline ``uniform-progress`` is the paper's, checked rule by rule against its authors' code: sky_spot's
strategies/rc_cr_threshold.py (with rc_threshold.py and strategy.py's strong guarantee), run by its own
env.py TraceEnv and simulate.py ``_simulate_one``, from andylizf/skynomad-artifact at commit 62b9aaa (a scratch
run, none of that code here). On this bench's windows (11 traces x 32 start points x 4 settings, 1408 runs) it
runs the same mode in every tick of every run, and costs the same once the finishing tick is billed whole as
theirs is. The version before issue 53 went idle from on-demand when spot was out (the paper stays on
on-demand) and cost 1.2-5.4% more than the authors' per setting, which inflated the lead. The ``lead over
uniform-progress`` lines state the issue's goal per setting (mean cost below uniform-progress's, every deadline
met; ``GOAL vs uniform-progress``): held out, 5.3%, 3.8%, 0.4%, -0.3% at 4 h / 3 min, 4 h / 12 min, 22 h / 3 min,
22 h / 12 min (in-job 4.9%, 2.8%, 0.4%, -0.2%; against the old baseline 7.8%, 5.5%, 4.9%, 5.5%), so NOT MET at
22 h / 12 min; with ``--starts 32`` 5.9%, 4.1%, 0.3%, 0.4% (in-job 5.3%, 3.6%, 0.3%, 0.3%), MET.
``--lead`` prints that lead alone, with the standard error of the paired per-run saving: at 22 h / 12 min
-0.27 +- 0.30% held out, +0.42 +- 0.22% with ``--starts 32``, level within the error; the variants of the rule
tried against it (none ahead in every setting held out): docs/simulator.md.
``--starts 32`` holds out 16 start points per trace instead of 4, none of them a point the constants were tuned on
(their jobs overlap in time with each other and with the tuning runs, which could only flatter the policy). There
(2026-11-30; uniform-progress rerun 2026-12-02) the per-setting goal fails, narrowly: 79.6% at slack 4 h with the
12-minute overhead (78.1% in-job), and the traces whose mean is dearer than uniform-progress are 0, 0, 1 and 4 of 11
(the old baseline: one, us-west-2a k80_1 at 22 h / 3 min), 11 cells under 80%, 89% of the saving over all runs
(uniform-progress 84%; the old one 77%).
``--ceiling`` bounds what any setting of those constants can do: each cell tuned on its own held-out runs (the
test data) still leaves 5 of the 8 cells under 80% (2026-11-29: 37, 57, 67, 70 and 73%, all with the 12-minute
overhead, four of them on the K80 traces, where the optimum saves $1-7 on $35), and ``--mpc`` reaches none of
those 5 either: per cell, the goal needs information these policies do not have, not other constants.
``--oracle-stats`` bounds what learning the market can add: the learning policies start from the stretches of the
WHOLE trace (the 26 days after the start included), so they know how long spot stays and stays away there, only
not when. It does not help (2026-11-29, with ``--mpc``): the deadline rule leaves 9 cells under 80% (8 without),
deadline-mpc 7. What the optimum knows and they lack is the path itself: which blip is a blip.
``--overlap-hops F`` is a what-if the daemon does not do: make-before-break hops. From on-demand, spot boots a
standby spot VM while the on-demand one trains (billed at the spot price; lost, with only its boot's money, when
spot goes meanwhile), and once it is up the hop loses only F x the overhead (the product's own overheads of GCE
jobs are 97-99% boot: sim.from_spec). Every policy and the optimum get it alike; the zones columns do not model it.
It does not pay on these traces (2026-11-29, held out): mean cost per run, deadline policy $51.66 without, $51.70 /
$51.64 / $51.81 at F = 0.1 / 0.25 / 0.5; the optimum's $49.51 without, $49.55 / $49.51 / $49.55 with. The slack a
hop saves is paid for in boot money and in the ticks the job trains on on-demand while the standby boots. Cells
under 80%: 7, 5 and 7 (8 without); the per-cell goal stays out of reach.
``--mpc`` adds the model-predictive trial policy ``deadline-mpc`` (decide/deadline_mpc.py: a semi-Markov
availability model fitted to the stretches seen, the MDP to the deadline solved by backward dynamic
programming; its settings were also chosen on the even start points), with its own goal line (~15x slower). The
optimum is the offline dynamic program (knows the trace); "share" is the share of the on-demand-to-optimum
saving a policy captured, (cost_on_demand - cost) / (cost_on_demand - cost_optimal), over the cell's runs
summed. The goal line checks the issue's goal per cell: every deadline met, mean cost <= uniform-progress,
>= 80% of the saving; each cell that misses it is listed with its absolute figures.

Several zones at once: "deadline-zones" is the same policy holding every zone of the trace's group (same GPU
and VM size, same region, same collection, equal length: measured over the same days), moving to a zone
that has spot instead of waiting (sim/multizone.py); its share is against "optimal-zones", the offline
optimum over the same zones. "deadline-zones-in-job" is the same without the 24 h of history, as the daemon
decides on GCE where the advisor says which zones have spot (decide/deadline_zones.py: each zone's stretches
seen during the job). The 16-node traces are read as "at least one VM could be had".

Zones and GPU types at once: "deadline-markets" holds every trace of the same VM size, region and collection, of
either GPU type (us-west-2a/b x K80/V100, measured over the same days), each with its own speed (the job's GPU's
measured step time over that GPU's: data/measurements/icac19-gce-resnet32-tf.csv, ResNet-32, 64.6 ms on a V100,
216 ms on a K80) and spot price (the same book); on-demand runs the job's own GPU (sim/multizone.py Market). Its
share is against "optimal-markets", the offline optimum over the same markets; "deadline-markets-in-job" learns
each market's stretches during the job only. decide/deadline_markets.py SLOWER_VALUE (a slower GPU's work is worth
the spot price plus this share of on-demand's premium) was set on the EVEN start points (0.25, 0.5 and 1 gave 83.5%
of the markets' optimum there, 0 gave 82.6%; 10 of 32 cells under 80% for each, the 8-GPU traces' cells); the
table's are the odd ones (2026-11-29: 94%, no cell under 80%, 2 cells dearer than uniform-progress by $0.1-0.2): the
difference between the halves says the per-cell result is not robust.

    python bench/deadline_policy.py             # the held-out table
    python bench/deadline_policy.py --tune      # the grid search on the tuning start points
    python bench/deadline_policy.py --ceiling   # each cell's best grid point on the held-out points (a bound)
    python bench/deadline_policy.py --lead --starts 32   # the lead over uniform-progress per setting, +- its error
    python bench/deadline_policy.py --oracle-stats --mpc   # a bound: knowing the trace's stretch statistics ahead
    python bench/deadline_policy.py --overlap-hops 0.25   # what-if: make-before-break hops (they do not pay here)
    python bench/deadline_timeline.py TRACE --slack 4 --overhead 12 --start 5   # one run's timeline vs the optimum
"""

from __future__ import annotations

import argparse
import csv
import itertools
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.decide import deadline_mpc as core_mpc  # noqa: E402
from orchestrator.decide import knobs, policies  # noqa: E402
from orchestrator.model.catalog import load_catalog  # noqa: E402
from orchestrator.sim.availability import HISTORY_H, Job, Outcome, load_trace, run_policy, saving_share, study  # noqa: E402,E501
from orchestrator.sim.multizone import Market, run_multi, study_multi  # noqa: E402

TRACES = REPO.parent.parent / "shared" / "spot-traces" / "availability"
if not TRACES.exists():
    TRACES = Path("/work/shared/spot-traces/availability")
WORK_H = 48
SLACKS_H = (4, 22)
OVERHEADS_MIN = (3, 12)
START_POINTS = 8
NAMES = policies.DEADLINE_POLICIES
NO_HISTORY = "deadline-in-job"  # as the daemon decides: the stretches seen during the job, none before
OVERLAP_HOPS: float | None = None  # --overlap-hops: a hop's share of the overhead when its spot VM boots alongside
ORACLE_STATS = False  # --oracle-stats: the learning policies' history is the WHOLE trace, future included (a bound)
ZONES_IN_JOB = "deadline-zones-in-job"  # as the daemon decides on GCE: each zone's stretches seen during the job
ZONES = policies.ZONE_POLICIES  # the deadline policy moving between a group's zones; their optimum
MARKETS = policies.MARKET_POLICIES  # ... between every zone and GPU type of the region; their optimum
MARKETS_IN_JOB = "deadline-markets-in-job"  # the same, each market's stretches seen during the job only
STEP_TIMES = REPO / "data" / "measurements" / "icac19-gce-resnet32-tf.csv"  # measured step per GPU: the speeds


def zone_group(path: Path) -> list[Path]:
    """The traces of the same GPU (and VM size) in the other zones of the same region and collection,
    measured over the same days (equal length): the zones a job may move between. One alone: no group."""
    zone, rest = path.stem.split("_", 1)
    region = zone.rstrip("abcdefgh")
    group = sorted(p for p in path.parent.glob(f"{region}*_{rest}.json")
                   if len(load_trace(p).counts) == len(load_trace(path).counts))
    return group if len(group) > 1 else []


def market_group(path: Path) -> list[Path]:
    """Every trace of the same VM size in the same region and collection, of any GPU type, over the same days:
    the markets (zone, GPU type) a job may move between. Only where there are two GPU types; else none."""
    zone, _gpu, size = path.stem.split("_")
    region = zone.rstrip("abcdefgh")
    group = sorted(p for p in path.parent.glob(f"{region}*_*_{size}.json")
                   if len(load_trace(p).counts) == len(load_trace(path).counts))
    return group if len({p.stem.split("_")[1] for p in group}) > 1 else []


def step_ms() -> dict[str, float]:
    """The measured single-worker step time of each GPU type (ICAC'19, ResNet-32 on CIFAR-10, GCE 2019)."""
    with STEP_TIMES.open(newline="") as fh:
        return {r["gpu"]: float(r["step_ms"]) for r in csv.DictReader(fh) if r["step_ms"]}


def markets(path: Path, group: list[Path], book: str) -> tuple[Market, ...]:
    """Each market of ``group`` as the job on ``path``'s GPU sees it: its speed (the job's GPU's measured step time
    over its own) and spot price."""
    own, steps = path.stem.split("_")[1], step_ms()
    return tuple(Market(steps[own] / steps[p.stem.split("_")[1]], prices(p.stem, book)[0]) for p in group)


def starts(n_ticks: int, tick_min: int, points: int | None = None) -> list[int]:
    """``points`` (default START_POINTS) start ticks spread over a trace, each after HISTORY_H of history and before
    the job's end."""
    points = points or START_POINTS
    first = round(HISTORY_H * 60 / tick_min)
    last = n_ticks - round((WORK_H + max(SLACKS_H)) * 60 / tick_min) - 1
    return [first + (last - first) * k // (points - 1) for k in range(points)]


def prices(trace_name: str, book: str) -> tuple[float, float]:
    gpu = trace_name.split("_")[1]
    pb = load_catalog().price_book(book)
    spot, od = pb.gpu_hourly(gpu, True), pb.gpu_hourly(gpu, False)
    assert spot is not None and od is not None, f"no {gpu} price in book {book}"
    return spot, od


Cells = dict[tuple[str, int, int], list[dict[str, Outcome]]]


def run_all(parity: int, book: str, zones: bool = False, names: tuple[str, ...] | None = None,
            no_history: bool = False) -> Cells:
    """Every trace, slack and overhead on the start points of the given parity (``names``: these policies,
    default NAMES); ``zones``: also the deadline policy over the trace's zone group (computed once per group
    and start, shown on each member) and, as ``no_history``, the deadline policy without the 24 h of history
    before the start (it learns from what it sees during the job, as the daemon does)."""
    cells: Cells = defaultdict(list)
    multi: dict[tuple[tuple[Path, ...], int, int, int], tuple[Outcome, ...]] = {}
    for path in sorted(TRACES.glob("*/*/*.json")):
        tr = load_trace(path)
        spot, od = prices(tr.name, book)
        label = f"{path.parent.parent.name}/{tr.name}"
        group = tuple(zone_group(path)) if zones else ()
        avails = tuple(load_trace(p).available() for p in group)
        mgroup = tuple(market_group(path)) if zones else ()
        if mgroup:  # the job's own market first: a tie in choose_zone keeps it
            mgroup = (path, *(p for p in mgroup if p != path))
            m_avails, mk = tuple(load_trace(p).available() for p in mgroup), markets(path, list(mgroup), book)
        for k, start in enumerate(starts(len(tr.counts), tr.tick_min)):
            if k % 2 != parity:
                continue
            for slack, ovh in itertools.product(SLACKS_H, OVERHEADS_MIN):
                job = Job(WORK_H * 60, (WORK_H + slack) * 60, ovh, spot, od,
                          None if OVERLAP_HOPS is None else round(OVERLAP_HOPS * ovh))
                run = {o.policy: o for o in study(job, tr, start, NAMES if names is None else names)}
                if ORACLE_STATS:  # the same policies, knowing the trace's stretches (not their order) in advance
                    for name in (n for n in (NAMES if names is None else names) if n in policies.LEARNING_POLICIES):
                        run[name] = run_policy(name, job, tr.available()[start:], tr.tick_min, history=tr.available())
                if zones or no_history:  # as the daemon decides: only the stretches seen during the job
                    run[NO_HISTORY] = run_policy("deadline", job, tr.available()[start:], tr.tick_min, history=())
                if group:
                    key = (group, start, slack, ovh)
                    if key not in multi:
                        history = round(HISTORY_H * 60 / tr.tick_min)
                        multi[key] = (*study_multi(job, avails, tr.tick_min, start, history),
                                      run_multi(job, tuple(a[start:] for a in avails), tr.tick_min,
                                                name=ZONES_IN_JOB))
                    run.update({o.policy: o for o in multi[key]})
                if mgroup:
                    history = round(HISTORY_H * 60 / tr.tick_min)
                    got = study_multi(job, m_avails, tr.tick_min, start, history, markets=mk)
                    run.update({MARKETS[0]: replace(got[0], policy=MARKETS[0]),
                                MARKETS[1]: replace(got[1], policy=MARKETS[1]),
                                MARKETS_IN_JOB: run_multi(job, tuple(a[start:] for a in m_avails), tr.tick_min,
                                                          markets=mk, name=MARKETS_IN_JOB)})
                cells[label, slack, ovh].append(run)
    return cells


def share(runs: list[dict[str, Outcome]], name: str, best: str = "optimal") -> float | None:
    return saving_share(*(sum(r[n].cost_usd for r in runs) for n in (name, "on-demand", best)))


def mean(runs: list[dict[str, Outcome]], name: str) -> float:
    return sum(r[name].cost_usd for r in runs) / len(runs)


def score(cells: Cells, name: str = "deadline") -> tuple[int, int, int, float]:
    """(deadlines missed, cells dearer than uniform-progress, cells under 80% share, mean share)."""
    missed = sum(not r[name].deadline_met for runs in cells.values() for r in runs)
    dearer = sum(mean(runs, name) > mean(runs, "uniform-progress") + 1e-6 for runs in cells.values())
    shares = [s for runs in cells.values() if (s := share(runs, name)) is not None]
    return missed, dearer, sum(s < 0.8 for s in shares), sum(shares) / max(1, len(shares))


GRID = {"LINE_WAIT": (0.5, 1.0, 2.0), "LINE_HOP": (0.5, 1.0), "HOP_GAIN": (0.75, 1.0, 1.25),
        "HOP_BUDGET": (0.75, 1.0, 1.5), "WAIT_SHORT": (0.0, 2.0, 3.0, 4.0)}


def tune(book: str) -> None:
    """The grid search, on the EVEN start points only. Each point is scored twice: as the simulator runs the
    policy (stretches learned from 24 h of history) and as the daemon does (``NO_HISTORY``: only what it saw
    during the job); the policies that do not read the constants are run once."""
    grid = GRID
    print("tuning on the EVEN start points: (missed, cells dearer than UP, cells < 80%, mean share) learning; "
          "the same without history")
    fixed = run_all(0, book, names=tuple(n for n in NAMES if n != "deadline"))
    best: tuple[tuple[int, int, int, float], dict[str, float]] | None = None
    for values in itertools.product(*grid.values()):
        for key, v in zip(grid, values, strict=True):
            setattr(knobs, key, v)
        cells = run_all(0, book, names=("deadline",), no_history=True)
        for cell, runs in cells.items():
            for run, base in zip(runs, fixed[cell], strict=True):
                run.update(base)
        got, bare, point = score(cells), score(cells, NO_HISTORY), dict(zip(grid, values, strict=True))
        print(point, got, bare, flush=True)
        # the goal's order, over both: deadlines, then cost vs UP, then share
        rank = (got[0] + bare[0], got[1] + bare[1], got[2] + bare[2], -got[3])
        if best is None or rank < best[0]:
            best = (rank, point)
    print("pick (fewest missed, then cells dearer than UP, then cells < 80%, over both; then the highest mean "
          "share learning):", best[1] if best else None)


def ceiling(book: str) -> None:
    """What the rule family can reach in each cell at best: every point of the tuning grid on the HELD-OUT (odd)
    start points themselves, each cell keeping its own best point. This is tuning on the test data, cell by
    cell (not a policy anyone can run: it knows which constants suit the trace ahead), so a cell under 80% here
    is out of reach of any one setting of the rule's constants, not only of the one tuned on the even points."""
    fixed = run_all(1, book, names=("on-demand", "optimal", "uniform-progress"))
    best: dict[tuple[str, int, int], tuple[float, dict[str, float]]] = {}
    for values in itertools.product(*GRID.values()):
        for key, v in zip(GRID, values, strict=True):
            setattr(knobs, key, v)
        for cell, runs in run_all(1, book, names=("deadline",)).items():
            for run, base in zip(runs, fixed[cell], strict=True):
                run.update(base)
            s = share(runs, "deadline")
            if s is not None and (cell not in best or s > best[cell][0]):
                best[cell] = (s, dict(zip(GRID, values, strict=True)))
    n = len(list(itertools.product(*GRID.values())))
    print(f"CEILING of the deadline rule: each cell's best share over the {n} points of the --tune grid, chosen on "
          "the HELD-OUT (odd) start points themselves (tuning on the test data, per cell)")
    for (label, slack, ovh), (s, point) in sorted(best.items(), key=lambda kv: kv[1][0]):
        if s < 0.8:
            print(f"  {label} {slack}h {ovh}m: at best {100 * s:.0f}% of the saving ({point})")
    low = sum(s < 0.8 for s, _ in best.values())
    print(f"cells under 80% even so: {low} of {len(best)} (every other cell reaches 80% at some grid point)")


def _cell(runs: list[dict[str, Outcome]], name: str, best: str = "optimal") -> str:
    met = sum(r[name].deadline_met for r in runs)
    s = share(runs, name, best)
    return f"{mean(runs, name):7.1f} {met}/{len(runs)} {'-' if s is None else f'{100 * s:.0f}%':>5}"


def table(book: str) -> None:
    cells = run_all(1, book, zones=True)
    print(f"HELD OUT: the ODD start points ({START_POINTS // 2} per trace, each after {HISTORY_H:.0f} h of history); "
          "the deadline policy's constants were tuned on the EVEN ones only (--tune).")
    print("Per policy: mean cost $, deadlines met, share of the on-demand-to-optimum saving. deadline-zones: the "
          "deadline policy free to move between the zones of the trace's group; its share is against "
          "optimal-zones, the offline optimum over the same zones.")
    print(f"{'trace':30} {'slack':>5} {'ovh':>4} " + " ".join(f"{n:>17}" for n in (*NAMES, *ZONES, *MARKETS)))
    for (label, slack, ovh), runs in cells.items():
        parts = [_cell(runs, n) for n in NAMES]
        for online, best in (ZONES, MARKETS):
            if online in runs[0]:
                parts += [_cell(runs, online, best), f"{mean(runs, best):7.1f}"]
            elif best == MARKETS[1] and ZONES[0] in runs[0]:
                parts += ["", ""]
        print(f"{label:30} {slack:>4}h {ovh:>3}m " + " ".join(f"{p:>17}" for p in parts))
    _goal(cells)


def _goal(cells: Cells) -> None:
    if NAMES[-1] in policies.TRIAL_POLICIES:
        _trial_goal(cells, NAMES[-1])
    missed, dearer, low, avg = score(cells)
    runs_n = sum(len(r) for r in cells.values())
    print(f"\ndeadline policy over {runs_n} held-out runs in {len(cells)} cells: {missed} deadlines missed; mean cost "
          f"above uniform-progress in {dearer} cells; under 80% of the optimum's saving in {low} cells; mean "
          f"share {100 * avg:.0f}%")
    for (label, slack, ovh), runs in cells.items():
        s, up, dl = share(runs, "deadline"), mean(runs, "uniform-progress"), mean(runs, "deadline")
        if s is None or s < 0.8 or dl > up + 1e-6:
            od, opt = mean(runs, "on-demand"), mean(runs, "optimal")
            print(f"  {label} {slack}h {ovh}m: on-demand ${od:.1f}, optimum ${opt:.1f} (saving ${od - opt:.1f}), "
                  f"uniform-progress ${up:.1f}, deadline ${dl:.1f} "
                  f"({'-' if s is None else f'{100 * s:.0f}%'} of the saving)")
    for n in NAMES:
        print(f"  {n:17} share of the saving over all runs: "
              f"{100 * (share([r for runs in cells.values() for r in runs], n) or 0):.0f}%")
    every = [r for runs in cells.values() for r in runs]
    print(f"  {NO_HISTORY:17} share of the saving over all runs: {100 * (share(every, NO_HISTORY) or 0):.0f}% "
          f"(the deadline policy without the stretches seen in the {HISTORY_H:.0f} h before the start: it learns "
          f"only from those seen during the job, as the daemon does; "
          f"{sum(not r[NO_HISTORY].deadline_met for r in every)} deadlines missed, "
          f"mean cost above uniform-progress in "
          f"{sum(mean(runs, NO_HISTORY) > mean(runs, 'uniform-progress') + 1e-6 for runs in cells.values())} cells)")
    zoned = [r for runs in cells.values() for r in runs if ZONES[0] in r]
    if zoned:
        print(f"  {ZONES[0]:17} share of the zones' optimum's saving over its {len(zoned)} runs: "
              f"{100 * (share(zoned, ZONES[0], ZONES[1]) or 0):.0f}% (deadline on the same runs, one zone: "
              f"{100 * (share(zoned, 'deadline') or 0):.0f}% of the one-zone optimum's); mean cost "
              f"${sum(r[ZONES[0]].cost_usd for r in zoned) / len(zoned):.1f} vs deadline "
              f"${sum(r['deadline'].cost_usd for r in zoned) / len(zoned):.1f}, uniform-progress "
              f"${sum(r['uniform-progress'].cost_usd for r in zoned) / len(zoned):.1f}; "
              f"{sum(not r[ZONES[0]].deadline_met for r in zoned)} deadlines missed")
        print(f"  {ZONES_IN_JOB:17} share of the zones' optimum's saving over the same runs: "
              f"{100 * (share(zoned, ZONES_IN_JOB, ZONES[1]) or 0):.0f}% (as the daemon decides where GCE's advisor "
              f"says which zones have spot: each zone's stretches seen during the job, none before); mean cost "
              f"${sum(r[ZONES_IN_JOB].cost_usd for r in zoned) / len(zoned):.1f}; "
              f"{sum(not r[ZONES_IN_JOB].deadline_met for r in zoned)} deadlines missed")
        groups = sorted({" + ".join(f"{p.parent.parent.name}/{p.stem}" for p in zone_group(p))
                         for p in TRACES.glob("*/*/*.json")} - {""})
        print("  zone groups (same GPU and VM size, same region, same collection): " + "; ".join(groups))
    _markets_line(cells)
    _per_setting(cells)
    _lead(cells)
    goal = missed == 0 and dearer == 0 and low == 0
    print(f"GOAL (every deadline met, mean cost <= uniform-progress in every cell, >= 80% of the saving in every "
          f"cell): {'MET' if goal else 'NOT MET'} -- {missed} missed, {dearer} cells above uniform-progress, "
          f"{low} cells under 80%")


def _markets_line(cells: Cells) -> None:
    """The deadline policy holding every zone and GPU type of the region against the optimum over the same."""
    held = {k: v for k, v in cells.items() if MARKETS[0] in v[0]}
    every = [r for runs in held.values() for r in runs]
    if not every:
        return
    low = [(k, s) for k, v in held.items() if (s := share(v, *MARKETS)) is not None and s < 0.8]
    dearer = [k for k, v in held.items() if mean(v, MARKETS[0]) > mean(v, "uniform-progress") + 1e-6]
    print(f"  {MARKETS[0]:17} share of the markets' optimum's saving over its {len(every)} runs: "
          f"{100 * (share(every, *MARKETS) or 0):.0f}% (every zone and GPU type of the region at once; speeds from "
          f"the measured step times, {STEP_TIMES.relative_to(REPO)}); mean cost "
          f"${sum(r[MARKETS[0]].cost_usd for r in every) / len(every):.1f} vs deadline "
          f"${sum(r['deadline'].cost_usd for r in every) / len(every):.1f} on its own GPU and zone, uniform-progress "
          f"${sum(r['uniform-progress'].cost_usd for r in every) / len(every):.1f}, the markets' optimum "
          f"${sum(r[MARKETS[1]].cost_usd for r in every) / len(every):.1f}; "
          f"{sum(not r[MARKETS[0]].deadline_met for r in every)} deadlines missed; mean cost above uniform-progress "
          f"in {len(dearer)} of {len(held)} cells; under 80% of the markets' optimum's saving in {len(low)} cells"
          + "".join(f"\n    under 80%: {lbl} {sl}h {ov}m: {100 * x:.0f}%" for (lbl, sl, ov), x in low)
          + "".join(f"\n    dearer than uniform-progress on its own GPU and zone: {lbl} {sl}h {ov}m: "
                    f"${mean(held[lbl, sl, ov], MARKETS[0]):.2f} vs ${mean(held[lbl, sl, ov], 'uniform-progress'):.2f}"
                    for lbl, sl, ov in dearer))
    print(f"  {MARKETS_IN_JOB:17} share of the markets' optimum's saving over the same runs: "
          f"{100 * (share(every, MARKETS_IN_JOB, MARKETS[1]) or 0):.0f}% (each market's stretches seen during the job, "
          f"none before); mean cost ${sum(r[MARKETS_IN_JOB].cost_usd for r in every) / len(every):.1f}; "
          f"{sum(not r[MARKETS_IN_JOB].deadline_met for r in every)} deadlines missed; under 80% in "
          f"{sum((x := share(v, MARKETS_IN_JOB, MARKETS[1])) is not None and x < 0.8 for v in held.values())} cells")
    for slack, ovh in sorted({(sl, ov) for _, sl, ov in held}):
        runs = [r for k, v in held.items() if k[1:] == (slack, ovh) for r in v]
        got, in_job = share(runs, *MARKETS) or 0.0, share(runs, MARKETS_IN_JOB, MARKETS[1]) or 0.0
        print(f"    per setting, slack {slack:>2}h overhead {ovh:>2}m: {100 * got:.0f}% of the markets' optimum's "
              f"saving over {len(runs)} runs (in-job {100 * in_job:.0f}%)")
    groups = sorted({" + ".join(p.stem for p in market_group(p)) for p in TRACES.glob("*/*/*.json")} - {""})
    print("  market groups (same VM size, region and collection; every GPU type): " + "; ".join(groups))


def _per_setting(cells: Cells) -> None:
    """The goal read per setting of the issue (slack x overhead) over every trace, beside the per-cell line:
    deadlines missed, runs and traces dearer than uniform-progress, share of the saving over the setting's runs."""
    print("per setting over every trace (deadline | deadline-in-job): missed, runs dearer than uniform-progress, "
          "traces whose mean is dearer, share of the optimum's saving over the setting's runs")
    ok = True
    for slack, ovh in sorted({(s, o) for _, s, o in cells}):
        group = {k: v for k, v in cells.items() if k[1:] == (slack, ovh)}
        every = [r for runs in group.values() for r in runs]
        parts = []
        for name in ("deadline", NO_HISTORY):
            missed = sum(not r[name].deadline_met for r in every)
            runs_up = sum(r[name].cost_usd > r["uniform-progress"].cost_usd + 1e-6 for r in every)
            traces_up = sum(mean(v, name) > mean(v, "uniform-progress") + 1e-6 for v in group.values())
            s = share(every, name) or 0.0
            parts.append(f"{missed} missed, {runs_up}/{len(every)} runs, {traces_up}/{len(group)} traces, "
                         f"{100 * s:.1f}%")
            ok = ok and missed == 0 and traces_up == 0 and s >= 0.8
        print(f"  slack {slack:>2}h overhead {ovh:>2}m: {parts[0]:41} | {parts[1]}")
    print(f"GOAL per setting (every deadline met, no trace's mean cost above uniform-progress, >= 80% of the saving "
          f"over the setting's runs; both paths): {'MET' if ok else 'NOT MET'}")


def _lead(cells: Cells) -> None:
    """The issue's goal for the product's policy: per setting (slack x overhead, over every trace's runs), its mean
    cost below uniform-progress's (the paper's, as its authors' simulator runs it), every deadline met."""
    print("lead over uniform-progress per setting (mean cost over every trace's runs; lead: how much cheaper)")
    ok = True
    for slack, ovh in sorted({(s, o) for _, s, o in cells}):
        every = [r for k, runs in cells.items() if k[1:] == (slack, ovh) for r in runs]
        up = sum(r["uniform-progress"].cost_usd for r in every) / len(every)
        parts = []
        for name in ("deadline", NO_HISTORY):
            cost, met = sum(r[name].cost_usd for r in every) / len(every), sum(r[name].deadline_met for r in every)
            parts.append(f"{name} ${cost:.2f} lead {100 * (1 - cost / up):+.1f}%, {met}/{len(every)} met")
            ok = ok and cost < up and met == len(every)
        print(f"  slack {slack:>2}h overhead {ovh:>2}m: uniform-progress ${up:.2f}; " + "; ".join(parts))
    print(f"GOAL vs uniform-progress (mean cost below it in every setting, no deadline missed; both paths): "
          f"{'MET' if ok else 'NOT MET'}")


def lead(book: str) -> None:
    """The issue's goal alone, fast: per setting, the deadline policy's lead over uniform-progress on the HELD-OUT
    (odd) start points and, for comparison, on the tuning (even) ones, with the standard error of the mean of the
    paired per-run differences (the runs of one trace overlap in time, so the true error is larger)."""
    for parity, what in ((1, "HELD OUT (odd)"), (0, "tuning (even)")):
        cells = run_all(parity, book, names=("uniform-progress", "deadline"), no_history=True)
        print(f"{what} start points, {START_POINTS // 2} per trace: lead over uniform-progress per setting, "
              "mean +- standard error of the paired per-run saving")
        for slack, ovh in sorted({(s, o) for _, s, o in cells}):
            every = [r for k, runs in cells.items() if k[1:] == (slack, ovh) for r in runs]
            up = statistics.mean(r["uniform-progress"].cost_usd for r in every)
            parts = []
            for name in ("deadline", NO_HISTORY):
                saved = [r["uniform-progress"].cost_usd - r[name].cost_usd for r in every]
                se = statistics.stdev(saved) / len(saved) ** 0.5
                parts.append(f"{name} {100 * statistics.mean(saved) / up:+.2f} +- {100 * se / up:.2f}%, "
                             f"{sum(r[name].deadline_met for r in every)}/{len(every)} met")
            print(f"  slack {slack:>2}h overhead {ovh:>2}m: uniform-progress ${up:.2f}; " + "; ".join(parts))


def _trial_goal(cells: Cells, name: str) -> None:
    missed, dearer, low, avg = score(cells, name)
    every = [r for runs in cells.values() for r in runs]
    print(f"\n{name} (trial): {missed} deadlines missed; mean cost above uniform-progress in {dearer} cells; under "
          f"80% of the saving in {low} cells; mean cell share {100 * avg:.0f}%; share over all runs "
          f"{100 * (share(every, name) or 0):.0f}%; {core_mpc.SOLVES[0]} MDPs solved (one a model refit)")
    for (label, slack, ovh), runs in cells.items():
        s, up, x = share(runs, name), mean(runs, "uniform-progress"), mean(runs, name)
        if s is None or s < 0.8 or x > up + 1e-6:
            print(f"  {label} {slack}h {ovh}m: uniform-progress ${up:.1f}, deadline ${mean(runs, 'deadline'):.1f}, "
                  f"{name} ${x:.1f} ({'-' if s is None else f'{100 * s:.0f}%'} of the saving)")


def predictability() -> None:
    """How much a spot stretch's length can be told from what came before it, trace by trace: Spearman's rank
    correlation between each up stretch's length and the outage just before it, the up stretch before that, and the
    longer of the two up stretches before it. What an online policy reads beyond the stretch's own age."""
    print("PREDICTABILITY of a spot stretch's length (ticks) from what preceded it: Spearman's rho over each trace's "
          "up stretches")
    for path in sorted(TRACES.glob("*/*/*.json")):
        tr = load_trace(path)
        runs: list[tuple[bool, int]] = []
        for avail, group in itertools.groupby(tr.available()):
            runs.append((avail, len(list(group))))
        rows = [(n, runs[i - 1][1], runs[i - 2][1], max(runs[i - 2][1], runs[i - 4][1] if i >= 4 else 0))
                for i, (up, n) in enumerate(runs) if up and i >= 3]
        length, *before = zip(*rows, strict=True)
        rho = [float(spearmanr(length, b).statistic) for b in before]
        print(f"  {path.parent.parent.name}/{tr.name}: {len(rows)} stretches, median {statistics.median(length):.0f} "
              f"ticks; rho with the outage before {rho[0]:+.2f}, the stretch before {rho[1]:+.2f}, the longer of the "
              f"two before {rho[2]:+.2f}")


def main() -> None:
    global NAMES, OVERLAP_HOPS, ORACLE_STATS, START_POINTS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--overlap-hops", type=float, metavar="F",
                    help="what-if: hops from on-demand to spot boot a standby spot VM while on-demand trains, then "
                         "lose only F x the overhead (every policy and the optimum alike; not the zones columns)")
    ap.add_argument("--ceiling", action="store_true",
                    help="each cell's best share over the tuning grid on the held-out points (tuning on test data)")
    ap.add_argument("--mpc", action="store_true", help="also the model-predictive trial policy deadline-mpc")
    ap.add_argument("--lead", action="store_true",
                    help="only the lead over uniform-progress per setting, with its standard error (fast)")
    ap.add_argument("--oracle-stats", action="store_true",
                    help="a bound: the learning policies read the whole trace's stretches, its future included")
    ap.add_argument("--book", default="2019-02", help="price book (data/price_books.csv)")
    ap.add_argument("--predictability", action="store_true",
                    help="how well a spot stretch's length follows from what preceded it (rank correlations)")
    ap.add_argument("--starts", type=int, default=START_POINTS, metavar="N",
                    help=f"start points per trace (default {START_POINTS}); the odd half is held out. With 32 the "
                         "held-out starts share no start tick with the 8-point ones the "
                         "constants were tuned on; their jobs overlap in time with the tuning runs")
    args = ap.parse_args()
    if args.starts < 4 or args.starts % 2:
        ap.error("--starts: an even number, 4 or more (half tune, half held out)")
    START_POINTS = args.starts
    ORACLE_STATS = args.oracle_stats
    if ORACLE_STATS:
        print("BOUND: the learning policies (deadline, deadline-mpc) start from the stretches of the WHOLE trace, the "
              "26 days after the start included (the job's own ticks then counted twice): they know how long spot "
              "stays and stays away there, not when. No online policy can know this; it bounds what learning can add.")
    if args.mpc:
        NAMES = (*NAMES, *policies.TRIAL_POLICIES)
    if args.overlap_hops is not None:
        if not 0 <= args.overlap_hops < 1:
            ap.error("--overlap-hops: a share of the overhead, from 0 up to (not including) 1")
        OVERLAP_HOPS = args.overlap_hops
        print(f"WHAT-IF: a hop from on-demand to spot boots a standby spot VM while the on-demand one trains (billed "
              f"at the spot price) and then loses {args.overlap_hops:.2f} x the overhead; every policy and the optimum "
              "alike. The daemon does not hop this way.")
    if args.predictability:
        predictability()
    elif args.ceiling:
        ceiling(args.book)
    elif args.lead:
        lead(args.book)
    else:
        tune(args.book) if args.tune else table(args.book)


if __name__ == "__main__":
    main()
