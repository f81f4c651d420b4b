"""The deadline studies' one simulator loop: a job replayed tick by tick over a market set's availability.

One market is a market set of one (``sim.availability.run_policy``); several zones or GPU types are more
(``sim.multizone.run_multi``). Each tick: a spot VM is lost where its market has none, the decider (or the given
choices) picks idle, on-demand or spot in a market, and the tick runs in the optimum's model (``sim.optimum``: its
mode switches, make-before-break standbys and per-market speed and price), so the optimum's choices replay to its
cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.decide.deadline import AvailabilityLog, Mode
from orchestrator.sim.deadline_job import Job, Outcome, boot_bill, price_per_min
from orchestrator.sim.optimum import Grid, Market, Standby, aligned, markets_of, minutes_for, switch, work_in


@dataclass(frozen=True)
class Now:
    """Where a replay stands at a tick's decision (``r``: minutes of the start still to run; ``zone``: the spot
    VM's market, -1 unless spot; ``ups``: ticks each market has been up, this one included; ``down``: ticks spot as
    fast as the job's own GPU has been out everywhere; the logs: the ticks before this one)."""

    t: int
    w: int
    r: int
    mode: Mode
    zone: int
    a: tuple[bool, ...]
    ups: tuple[int, ...]
    down: int
    logs: tuple[AvailabilityLog, ...]
    any_log: AvailabilityLog


Decider = Callable[[Now], tuple[Mode, int]]  # (mode, market; -1 unless spot)


def _mode(g: Grid, m: int) -> tuple[Mode, int]:
    return (Mode.IDLE, -1) if m == 0 else (Mode.ON_DEMAND, -1) if m == g.od else (Mode.SPOT, m - 1)


def _step(g: Grid, m: int, t: int, w: int, r: int, cost: float) -> tuple[int, int, int, float, bool]:
    """One tick running mode ``m`` from time ``t``, work done ``w`` and restart overhead still to run ``r``
    (minutes): the new (t, w, r, cost) and whether the job finished within the tick (then ``t`` is when)."""
    if m == 0:
        return t + g.tick, w, r, cost, False
    speed = g.speed(m)
    price = price_per_min(g.job, Mode.ON_DEMAND) if m == g.od else (g.ms[m - 1].spot_usd_per_h or 0.0) / 60
    need = r + minutes_for(speed, g.job.work_min - w)
    if need <= g.tick:
        return t + need, w, r, cost + price * need, True
    return t + g.tick, w + work_in(speed, max(0, g.tick - r)), max(0, r - g.tick), cost + price * g.tick, False


def _logs(k: int, history: tuple[tuple[bool, ...], ...], fast: list[int]
          ) -> tuple[tuple[AvailabilityLog, ...], AvailabilityLog]:
    """Each market's log of the ``history`` ticks, and the log of spot as fast as the job's own GPU anywhere."""
    logs = tuple(AvailabilityLog() for _ in range(k))
    any_log = AvailabilityLog()
    for z, h in enumerate(history):
        for x in h:
            logs[z].add(x)
    for xs in zip(*history, strict=True) if history else ():
        any_log.add(any(xs[z] for z in fast))
    return logs, any_log


def replay(job: Job, avails: tuple[tuple[bool, ...], ...], tick: int, decide: Decider, *, name: str,
           markets: tuple[Market, ...] | None = None, history: tuple[tuple[bool, ...], ...] = (),
           choices: list[tuple[Mode, int]] | None = None, zone_labels: bool = True) -> Outcome:
    """Replay the markets' availability (one tuple per market, from the job's start) under ``decide`` (or the
    given ``choices``, one (mode, market) per tick). Past the deadline, or past the traces' end, it finishes on
    on-demand. ``history``: each market's ticks before the start, which the decider has seen. ``zone_labels``:
    the timeline names spot's market (``spot@1``)."""
    g = Grid(job, tick, markets_of(job, len(avails), markets, tick))
    fast = [z for z in range(g.k) if g.ms[z].speed >= 1.0]  # the outages the rule reads: of spot as fast as its own
    logs, any_log = _logs(g.k, history, fast)
    t, w, r, i, cost, down, m = 0, 0, 0, 0, 0.0, 0, 0
    ups = (0,) * g.k
    sb: Standby | None = None
    out = Outcome(name, 0.0, 0.0, False)
    while True:
        a = aligned(avails, i)
        if 1 <= m <= g.k and not a[m - 1]:
            m, r = 0, 0  # preempted
        if sb is not None and not a[sb[0]]:
            sb = None  # preempted while it booted (or before it took over)
        ups = tuple(u + 1 if x else 0 for u, x in zip(ups, a, strict=True))
        down = 0 if any(a[z] for z in fast) else down + 1
        if choices is not None:
            c, cz = choices[i] if i < len(choices) else (Mode.ON_DEMAND, -1)
        elif t >= job.deadline_min:
            c, cz = Mode.ON_DEMAND, -1
        else:
            c, cz = decide(Now(t, w, r, *_mode(g, m), a, ups, down, logs, any_log))
        if c == Mode.SPOT and not a[cz]:
            raise AssertionError(f"{name} chose spot in market {cz} at tick {i}, when none could be had")
        for z in range(g.k):
            logs[z].add(a[z])
        any_log.add(any(a[z] for z in fast))
        m, r, sb = switch(g, m, 0 if c == Mode.IDLE else g.od if c == Mode.ON_DEMAND else cz + 1, r, sb)
        if sb is not None:
            cost += boot_bill(job, tick, sb[1] + 1, g.ms[sb[0]].spot_usd_per_h)
        mode, zone = _mode(g, m)
        label = f"spot@{zone}" if mode == Mode.SPOT and zone_labels else mode.value
        if not out.timeline or out.timeline[-1][1] != label:  # a preemption into waiting shows too
            out.timeline.append((t, label))
        out.work_at.append((t, w))
        t, w, r, cost, done = _step(g, m, t, w, r, cost)
        if done:
            break
        i += 1
    out.work_at.append((t, job.work_min))
    out.timeline.append((t, "done"))
    out.cost_usd, out.finish_min, out.deadline_met = cost, t, t <= job.deadline_min
    return out
