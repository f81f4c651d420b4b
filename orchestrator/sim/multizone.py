"""Finishing by a deadline while holding several zones (or GPU types) at once (issue 23, item 2).

The job may run its spot VM in any of K zones, each with its own measured availability trace (aligned
tick for tick). A spot VM in zone z is lost at the first tick z has none; starting a VM anywhere (from
nothing, after a preemption, on another zone or switching pricing) costs the restart overhead, as in
``sim.availability``. The online policy is ``decide.deadline``'s deadline decision, fed with "can spot be had
in any zone", and ``decide.deadline.choose_zone`` for where: after a preemption it moves to a zone that has
spot instead of waiting. The offline optimum is ``sim.optimum``'s, over the modes idle, on-demand and spot in
each zone (one zone: ``sim.availability``'s, a market set of one).

A trace may also be another GPU type's (a ``Market``: its speed and spot price; on-demand runs the job's own GPU).
The rule then reads the markets at least as fast as the job's GPU as its spot, priced per hour of the job's work;
while it waits, a slower GPU's spot is taken where it pays (``decide.deadline_markets``). The optimum covers every
market (``simulate --also-trace``, the bench's ``deadline-markets``).
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.decide import deadline_markets
from orchestrator.decide.deadline import AvailabilityLog, Mode
from orchestrator.model.availability import AvailabilityTrace
from orchestrator.sim.availability import (
    OUTLOOK_STARTS,
    Job,
    Outcome,
    Outlook,
    outlook_starts,
    progress_at,
    summed,
)
from orchestrator.sim.market_replay import Now, replay
from orchestrator.sim.optimum import Market, markets_of, minutes_for, optimal_multi, work_in

__all__ = ["Market", "minutes_for", "optimal_multi", "work_in"]  # the optimum's, for the callers here


def run_multi(job: Job, avails: tuple[tuple[bool, ...], ...], tick: int, *,
              history: tuple[tuple[bool, ...], ...] = (), choices: list[tuple[Mode, int]] | None = None,
              name: str = "deadline-zones", markets: tuple[Market, ...] | None = None) -> Outcome:
    """Replay the zones' availability (one tuple per zone, from the job's start) under the deadline policy
    with zone moves (or the given ``choices``: (mode, zone) per tick): ``sim.market_replay``'s loop. ``history``:
    each zone's ticks before the start, which the policy has seen. ``markets``: each trace's GPU speed and spot
    price (default: the job's GPU and price in every zone). Zone moves have no make-before-break hops."""
    ms = markets_of(job, len(avails), markets, tick)

    def decide(now: Now) -> tuple[Mode, int]:
        return _decide(job, tick, now.t, now.w, now.r, now.mode, now.zone, now.a, now.ups, now.down, now.logs,
                       now.any_log, ms)

    return replay(replace(job, hop_overhead_min=None), avails, tick, decide, name=name, markets=markets,
                  history=history, choices=choices)


def _decide(job: Job, tick: int, t: int, w: int, r: int, mode: Mode, zone: int, a: tuple[bool, ...],
            ups: tuple[int, ...], down: int, logs: tuple[AvailabilityLog, ...], any_log: AvailabilityLog,
            ms: tuple[Market, ...]) -> tuple[Mode, int]:
    """``decide.deadline_markets.decide`` over the markets (with one GPU type: ``choose_zone`` over the zones)."""
    views = {str(z): deadline_markets.MarketView(ms[z].speed, ms[z].spot_usd_per_h or 0.0, logs[z].seen(tick / 60),
                                                 (ups[z] - 1) * tick / 60 if a[z] else None) for z in range(len(a))}
    base = progress_at(job, tick, t, w, r, mode, False, down=down, up=1, hops=False)  # spot: the markets say
    c, where = deadline_markets.decide(base, views, str(zone) if mode == Mode.SPOT else None, any_log.seen(tick / 60))
    return c, int(where) if where is not None else -1


def zones_outlook(job: Job, traces: list[AvailabilityTrace], starts: int = OUTLOOK_STARTS,
                  markets: tuple[Market, ...] | None = None, name: str = "deadline-zones") -> Outlook:
    """``plan``'s row for a job holding the traces' zones (or ``markets``: GPU types) at once (replayed tick for
    tick from the same start ticks as ``outlook``'s): the deadline policy with moves, learning each market only
    during the job, as the daemon does (``decide.deadline_zones``, ``decide.deadline_gpus``)."""
    avails = tuple(t.available() for t in traces)
    return summed(name, [run_multi(job, tuple(a[start:] for a in avails), traces[0].tick_min, markets=markets)
                         for start in outlook_starts(job, traces[0], starts)])


def study_multi(job: Job, avails: tuple[tuple[bool, ...], ...], tick: int, start: int,
                history_ticks: int, markets: tuple[Market, ...] | None = None) -> tuple[Outcome, Outcome]:
    """The deadline policy with zone moves and the optimum over the same zones (``markets``: as ``run_multi``'s),
    from tick ``start`` (the policy has seen ``history_ticks`` before it)."""
    now = tuple(a[start:] for a in avails)
    hist = tuple(a[max(0, start - history_ticks):start] for a in avails)
    online = run_multi(job, now, tick, history=hist, markets=markets)
    # The zone moves' replay has no make-before-break hops: the optimum it is judged against has none either.
    opt = optimal_multi(replace(job, hop_overhead_min=None), now, tick, markets=markets)
    if opt is None:
        best = run_multi(job, now, tick, choices=[(Mode.ON_DEMAND, -1)], name="optimal-zones", markets=markets)
        best.deadline_met = False
    else:
        best = run_multi(job, now, tick, choices=opt[1], name="optimal-zones", markets=markets)
    return online, best
