"""Finishing by a deadline on spot VMs whose availability comes from a measured trace (issue 23).

A trace (shared/spot-traces, "Can't Be Late", NSDI'24) says at each tick how many spot VMs could be had.
A job needs ``work`` of training; each tick a policy picks spot (if it can be had), on-demand or nothing.
Starting a VM (from nothing, after a preemption, or switching pricing) costs the restart overhead: time
billed at that VM's price without progress. A spot VM is lost at the first tick the trace has none.

Time is counted in whole minutes of cloud time, so the offline optimum (``sim.optimum``'s, on a market set of
one) and the online policies share one exact model: ``run_policy`` replays the optimum's choices to the same
cost (tests/test_deadline_policy.py).
The online policies are ``decide.deadline``'s pure decision functions, the same the daemon applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from orchestrator.costmodel import Calibration
from orchestrator.decide import deadline as policy
from orchestrator.decide import policies
from orchestrator.decide.deadline import Mode, Progress
from orchestrator.model.availability import AvailabilityTrace, AvailabilityTraceError, load_trace
from orchestrator.model.paths import data_dir
from orchestrator.model.spec import JobSpec
from orchestrator.sim.deadline_job import Job, Outcome, boot_bill, boot_ticks, price_per_min
from orchestrator.sim.engine import NoRevocations, simulate
from orchestrator.sim.from_spec import cluster_from_spec
from orchestrator.sim.market_replay import Now, replay
from orchestrator.sim.optimum import optimal_multi

# The trace loader and the job, for the callers here.
__all__ = ["AvailabilityTrace", "AvailabilityTraceError", "Job", "Outcome", "boot_bill", "boot_ticks", "load_trace",
           "price_per_min"]
HISTORY_H: Final = policy.HISTORY_H  # the availability a policy may have seen before the job starts
OUTLOOK_STARTS: Final = 24  # start ticks per trace behind plan's figures per policy


def run_policy(name: str, job: Job, avail: tuple[bool, ...], tick: int, *, history: tuple[bool, ...] = (),
               choices: list[Mode] | None = None, learn: bool = True) -> Outcome:
    """Replay ``avail`` (one per tick from the job's start) under the named online policy (or the given
    ``choices``, one per tick): ``sim.market_replay``'s loop on a market set of one. Past the deadline, or past the
    trace's end, it finishes on on-demand. ``learn``: the deadline policy reads the up and down stretches seen so
    far (``history``, then the ticks it lived through); else it keeps ``decide.deadline.DEFAULT_AVAILABILITY``.
    The daemon learns as ``learn=True, history=()`` does: from the ticks of the job alone."""
    learn = learn and name in policies.LEARNING_POLICIES

    def decide(now: Now) -> tuple[Mode, int]:
        p = progress_at(job, tick, now.t, now.w, now.r, now.mode, now.a[0], down=now.down, up=now.ups[0])
        c = _decide(name, p, now.any_log.seen(tick / 60) if learn else policy.DEFAULT_AVAILABILITY)
        return c, 0 if c == Mode.SPOT else -1

    one = None if choices is None else [(c, 0 if c == Mode.SPOT else -1) for c in choices]
    return replay(job, (avail,), tick, decide, name=name, history=(history,) if learn else (), choices=one,
                  zone_labels=False)


def progress_at(job: Job, tick: int, t: int, w: int, r: int, mode: Mode, available: bool, *, down: int, up: int,
                hops: bool = True) -> Progress:
    """The policy's state at minute ``t`` of a replay (work done ``w``, ``r`` minutes of the start still to run),
    spot out for ``down`` ticks or up for ``up``, this one included: every simulator builds it here (one market;
    ``sim.multizone``'s base of its market set). ``hops``: the job's make-before-break what-if applies."""
    hop = job.hop_overhead_min if hops else None
    return Progress(elapsed_h=t / 60, work_done_h=w / 60, work_h=job.work_min / 60, deadline_h=job.deadline_min / 60,
                    overhead_h=job.overhead_min / 60, mode=mode, spot_available=available, tick_h=tick / 60,
                    overhead_left_h=r / 60, outage_h=max(0, down - 1) * tick / 60,
                    spot_up_h=max(0, up - 1) * tick / 60, spot_usd_per_h=job.spot_usd_per_h,
                    on_demand_usd_per_h=job.on_demand_usd_per_h, hop_overhead_h=None if hop is None else hop / 60)


def _decide(name: str, p: Progress, seen: policy.Availability) -> Mode:
    return policies.decide_one(name, p, seen)


def study(job: Job, trace: AvailabilityTrace, start_tick: int = 0, names: tuple[str, ...] = policies.DEADLINE_POLICIES,
          need: int = 1, prior: bool = True, history_h: float = HISTORY_H) -> list[Outcome]:
    """Every named policy on ``trace`` from ``start_tick``; the learning policies have seen the ``history_h``
    hours before it (the others need no history), or with ``prior=False`` only the ticks of the job, as the
    daemon decides when no earlier job in its spot market recorded the stretches before it."""
    if not 0 <= start_tick < len(trace.counts):
        raise AvailabilityTraceError(f"--start-tick {start_tick} is outside the trace (0..{len(trace.counts) - 1})")
    tick = trace.tick_min
    full = trace.available(need)
    avail = full[start_tick:]
    history = full[max(0, start_tick - round(history_h * 60 / tick)):start_tick] if prior and history_h > 0 else ()
    out = []
    for name in names:
        if name == "optimal":
            opt = optimal_multi(job, (avail,), tick)  # one market: a market set of one
            if opt is None:
                o = run_policy("optimal", job, avail, tick, choices=[Mode.ON_DEMAND])
                o.deadline_met = False
            else:
                o = run_policy("optimal", job, avail, tick, choices=[mode for mode, _ in opt[1]])
            out.append(o)
        else:
            seen = history if name in policies.LEARNING_POLICIES else ()
            out.append(run_policy(name, job, avail, tick, history=seen))
    return out


def saving_share(cost: float, on_demand: float, optimal: float) -> float | None:
    """The share of the on-demand-to-optimum saving a policy captured (1 = as cheap as the optimum)."""
    gap = on_demand - optimal
    return None if gap <= 1e-9 else (on_demand - cost) / gap + 0.0  # + 0.0: on-demand itself shows 0, not -0


@dataclass(frozen=True)
class DeadlineFigures:
    """A spec's job as the deadline policies see it, in seconds of its own clock (local: wall seconds)."""

    work_s: float  # predicted no-revocation time, less the first start (every start pays the overhead)
    overhead_s: float  # boot + start-up (restore) + the checkpoint on the notice or drain (no step is lost)
    spot_usd_per_h: float  # the spot-planned slots on spot, the others as planned
    on_demand_usd_per_h: float  # the spot-planned slots on on-demand
    time_scale: float  # cloud seconds per second of the job's clock (local provider)


def deadline_figures(spec: JobSpec, price_book: str | None = None,
                     calibration: Calibration | None = None) -> DeadlineFigures:
    """Work, restart overhead and prices of ``spec``'s planned cluster, from the simulator's accounting
    (``calibration``: the one the job is planned with; None: the shipped one)."""
    cluster = cluster_from_spec(spec, price_book=price_book, calibration=calibration)
    base = simulate(replace(cluster, enforce_limits=False), NoRevocations())
    start_s = cluster.boot_delay_s + cluster.spot_extra_boot_s + cluster.startup_s
    # No step is lost at a restart: a preemption's notice and a hop's drain (decide.reconcile) both checkpoint first,
    # and training pauses for that one save.
    fixed = sum(s.price_per_hour for s in cluster.slots if not s.spot)
    return DeadlineFigures(
        work_s=base.wall_time_s - start_s, overhead_s=start_s + cluster.checkpoint_cost_s,
        spot_usd_per_h=fixed + sum(s.price_per_hour for s in cluster.slots if s.spot),
        on_demand_usd_per_h=fixed + sum(s.od_price for s in cluster.slots if s.spot),
        time_scale=cluster.time_scale)


def spot_on_gpu(spec: JobSpec, gpu: str) -> JobSpec:
    """``spec`` with its spot worker groups on another GPU type, on that type's usual machine type: where the
    deadline policy moves them (``policy.also_gpus``, ``simulate --also-trace``). On-demand groups stay."""
    assert spec.cluster is not None
    workers = [w.model_copy(update={"gpu": gpu, "machine_type": None}) if w.spot else w for w in spec.cluster.workers]
    return spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"workers": workers})})


def on_gpu_figures(spec: JobSpec, gpu: str, work_s: float, price_book: str | None = None,
                   calibration: Calibration | None = None) -> tuple[float, float]:
    """The job with its spot workers on ``gpu`` (``spot_on_gpu``), as planned: its speed there (``work_s``, its
    work on its own GPU types, over the work there) and its cluster's spot price per hour there."""
    there = deadline_figures(spot_on_gpu(spec, gpu), price_book, calibration)
    return work_s / there.work_s, there.spot_usd_per_h


@dataclass(frozen=True)
class Outlook:
    policy: str
    mean_cost_usd: float
    p_deadline_met: float
    runs: int


def bundled_traces(counted: bool = False) -> list[Path]:
    """The availability traces shipped in data/spot-availability (each with its source in data/SOURCES.md); with
    ``counted``, those that counted up to 16 spot VMs (16-node/) instead of asking for one."""
    return sorted((data_dir() / "spot-availability" / ("16-node" if counted else "")).glob("*.json"))


def outlook(job: Job, traces: list[AvailabilityTrace], starts: int = OUTLOOK_STARTS,
            names: tuple[str, ...] = policies.ONLINE_POLICIES) -> list[Outlook]:
    """Each online policy's mean cost and chance of meeting the deadline, replayed from ``starts`` start ticks
    spread over each trace (after ``HISTORY_H`` of trace): what ``plan`` prints. The deadline policy sees only
    the job's own ticks, as the daemon that will run it does."""
    runs: dict[str, list[Outcome]] = {n: [] for n in names}
    for tr in traces:
        for start in outlook_starts(job, tr, starts):
            for o in study(job, tr, start, names, prior=False):
                runs[o.policy].append(o)
    return [summed(n, rs) for n, rs in runs.items() if rs]


def outlook_starts(job: Job, trace: AvailabilityTrace, starts: int = OUTLOOK_STARTS) -> list[int]:
    """``starts`` start ticks spread over the trace, each after HISTORY_H of it and a deadline before its end."""
    first = min(len(trace.counts) - 1, round(HISTORY_H * 60 / trace.tick_min))
    last = max(first, len(trace.counts) - 1 - math.ceil(job.deadline_min / trace.tick_min))
    return [first + (last - first) * k // max(1, starts - 1) for k in range(starts)]


def summed(name: str, runs: list[Outcome]) -> Outlook:
    return Outlook(name, sum(o.cost_usd for o in runs) / len(runs), sum(o.deadline_met for o in runs) / len(runs),
                   len(runs))
