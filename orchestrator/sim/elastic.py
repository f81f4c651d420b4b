"""A multi-worker job on a 16-node spot availability trace (issue 23, item 2: elastic shrink with on-demand
top-up instead of all-or-nothing).

The trace says at each tick how many of 16 requested spot VMs could be had (k). The job has N workers and
``Job.work_min`` minutes of work on the whole cluster; prices in ``Job`` are per VM. Model (``decide.elastic``):
n running workers progress n/N as fast (data parallel, elastic shrink); every change of membership restarts
the whole cluster for the overhead (billed for every VM, no progress); a spot VM is lost at the first tick
the trace has fewer than the job runs, and the survivors restart (or the policy picks anew).

Policies, one replay (``replay``) for all, so their costs compare exactly:
- ``uniform-progress`` and ``deadline``: ``decide.deadline``'s all-or-nothing decisions, spot meaning k >= N, the
  whole cluster on spot, on on-demand or idle (the single-VM simulator with N-fold prices: tests);
- ``elastic``: ``decide.elastic.elastic_policy``;
- ``on-demand``: the whole cluster on on-demand from the start;
- ``optimal``: the offline least cost (``optimal_cost``), a lower bound; see there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Final

import numpy as np

from orchestrator.decide import deadline as policy
from orchestrator.decide import policies
from orchestrator.decide.deadline import AvailabilityLog, Mode
from orchestrator.decide.elastic import IDLE, ElasticState, Members, elastic_policy, kept_through
from orchestrator.model.availability import AvailabilityTrace, AvailabilityTraceError
from orchestrator.sim.availability import (
    HISTORY_H,
    OUTLOOK_STARTS,
    Job,
    Outcome,
    Outlook,
    outlook_starts,
    summed,
)

ONLINE: Final = policies.COUNTED_ONLINE
POLICIES: Final = policies.COUNTED_POLICIES
_EPS: Final = 1e-9

Decide = Callable[[ElasticState], Members]


def _label(m: Members) -> str:
    return "idle" if m == IDLE else f"{m.spot}s+{m.on_demand}od"


def replay(job: Job, workers: int, counts: tuple[int, ...], tick: int, decide: Decide, name: str,
           history: tuple[int, ...] = ()) -> Outcome:
    """Replay ``counts`` (spot VMs obtainable per tick, from the job's start) under ``decide``. Past the
    deadline (or the trace's end, which has no spot) the job finishes on the whole cluster on on-demand.
    ``history``: the counts before the start, whose stretches (per level of spot VMs) the policy has seen.
    On replica groups (``job.change_min``) a change costs the workers that stay a pause and the joiners their boot,
    as the daemon's elastic count reckons it (``decide.elastic._slack_after``)."""
    n_all, full = workers, Members(0, workers)
    t, w, cost, i = 0, 0.0, 0.0, 0
    groups: list[tuple[int, float]] = []  # (workers, minutes before they train) of what runs
    running, due = IDLE, False
    below, logs = _seen_before(history, n_all)
    out = Outcome(name, 0.0, 0.0, False)
    while True:
        k = counts[i] if i < len(counts) else 0
        if running.spot > k:  # preempted: the survivors must restart (replica groups: pause) to go on
            running, due, groups = Members(k, running.on_demand), True, []
        age = i - 1 - below[min(k, n_all)]  # ticks before this one with at least min(k, N) spot VMs
        for level in range(k + 1, n_all + 1):
            below[level] = i
        level = min(k, n_all)
        left = logs[level].seen(tick / 60).up_left(age * tick / 60) if level else 0.0
        full_seen = logs[n_all].seen(tick / 60)
        for lv, log in enumerate(logs):
            log.add(k >= lv)
        r = max((d for _, d in groups), default=0.0)
        if t >= job.deadline_min:
            c = full
        else:
            c = decide(ElasticState(
                workers=n_all, elapsed_h=t / 60, work_done_h=w / 60, work_h=job.work_min / 60,
                deadline_h=job.deadline_min / 60, overhead_h=job.overhead_min / 60, tick_h=tick / 60,
                running=running, spot_can=k, restart_due=due, overhead_left_h=r / 60,
                spot_age_h=age * tick / 60, spot_left_h=left, spot_usd_per_h=job.spot_usd_per_h,
                on_demand_usd_per_h=job.on_demand_usd_per_h, seen_full=full_seen,
                change_h=None if job.change_min is None else job.change_min / 60))
        if c.spot > min(k, n_all) or c.workers > n_all or min(c.spot, c.on_demand) < 0:
            raise AssertionError(f"{name} chose {c} at tick {i} with {k} spot VMs for {n_all} workers")
        if not out.timeline or out.timeline[-1][1] != _label(c):
            out.timeline.append((t, _label(c)))
        if c != running or due:
            groups = _changed(job, running, c)
        running, due = c, False
        price = (c.spot * job.spot_usd_per_h + c.on_demand * job.on_demand_usd_per_h) / 60
        out.work_at.append((t, w))
        if c.workers:
            need = _finish_in(groups, (job.work_min - w) * n_all)
            if need <= tick + _EPS:
                t_end, cost = t + need, cost + price * need
                break
            w += sum(n * max(0.0, tick - d) for n, d in groups) / n_all
            groups = [(n, max(0.0, d - tick)) for n, d in groups]
        cost += price * tick
        t += tick
        i += 1
    out.work_at.append((t_end, job.work_min))
    out.timeline.append((t_end, "done"))
    out.cost_usd, out.finish_min, out.deadline_met = cost, t_end, t_end <= job.deadline_min + _EPS
    return out


def _changed(job: Job, before: Members, after: Members) -> list[tuple[int, float]]:
    """What runs after a change from ``before`` (after any preemption) to ``after``: elastic torchrun restarts every
    worker for the overhead; on replica groups the workers kept pause for ``change_min`` and the joiners boot."""
    if after.workers == 0:
        return []
    if job.change_min is None:
        return [(after.workers, float(job.overhead_min))]
    kept = kept_through(before, after)
    return [(n, d) for n, d in ((kept, job.change_min), (after.workers - kept, float(job.overhead_min))) if n]


def _finish_in(groups: list[tuple[int, float]], left: float) -> float:
    """Minutes until ``left`` worker-minutes are done by ``groups`` (each trains after its delay)."""
    t, rate, done = 0.0, 0, 0.0
    for n, d in sorted(groups, key=lambda g: g[1]):
        if rate and done + rate * (d - t) >= left - _EPS:
            break
        done, t, rate = done + rate * (d - t), d, rate + n
    return t + (left - done) / rate if rate else math.inf


def _seen_before(history: tuple[int, ...], n_all: int) -> tuple[list[int], list[AvailabilityLog]]:
    """What ``replay``'s policy has seen at the start, per level of spot VMs (0..``n_all``): the last tick of
    ``history`` with fewer than it (-1: none yet; ticks before the start count negative) and the stretches with at
    least that many."""
    below = [-1] * (n_all + 1)
    logs = [AvailabilityLog() for _ in range(n_all + 1)]
    for j, seen in enumerate(history):
        for level, log in enumerate(logs):
            log.add(seen >= level)
        for level in range(seen + 1, n_all + 1):
            below[level] = j - len(history)
    return below, logs


def all_or_nothing(name: str, job: Job, history: tuple[int, ...] = ()) -> Decide:
    """``decide.deadline``'s single-VM decision for the whole cluster: spot can be had when k >= N. The
    ``deadline`` policy reads the stretches of k >= N seen in ``history`` and during the run."""
    log = AvailabilityLog()
    ages = {"up": 0, "down": 0}
    primed = {"n": -1}

    def decide(p: ElasticState) -> Members:
        n = p.workers
        if primed["n"] != n:  # the history's meaning depends on N; a decide is used for one job
            for c in history:
                log.add(c >= n)
            primed["n"] = n
        a = p.spot_can >= n
        ages["up"], ages["down"] = (ages["up"] + 1, 0) if a else (0, ages["down"] + 1)
        mode = {Members(n, 0): Mode.SPOT, Members(0, n): Mode.ON_DEMAND}.get(p.running, Mode.IDLE)
        if p.restart_due:
            mode = Mode.IDLE  # the cluster was preempted (the survivors are of no use all-or-nothing)
        # the ages of the stretches of k >= N since the job's start (the state's spot_age_h counts the history too)
        prog = replace(p, spot_usd_per_h=job.spot_usd_per_h, on_demand_usd_per_h=job.on_demand_usd_per_h).whole(
            mode, max(0, ages["up"] - 1) * p.tick_h, max(0, ages["down"] - 1) * p.tick_h)
        seen = log.seen(p.tick_h) if name == "deadline" else policy.DEFAULT_AVAILABILITY
        log.add(a)
        choice = policies.decide_one(name, prog, seen)
        return {Mode.SPOT: Members(n, 0), Mode.ON_DEMAND: Members(0, n), Mode.IDLE: IDLE}[choice]

    return decide


def optimal_cost(job: Job, workers: int, counts: tuple[int, ...], tick: int) -> float | None:
    """The offline optimum's cost (knows the trace), None when nothing finishes in time. Backward dynamic
    programming over (tick, work done, spot VMs, on-demand VMs, overhead still to run), every membership
    with at most min(k, N) spot VMs allowed at each tick, vectorised over the memberships and the work.

    Work is coarsened to units of one worker-tick (tick / N minutes of full-cluster work), so a tick's
    progress is exact except in a tick that pays part of a restart (e.g. 3 of 5 minutes), where it is
    rounded UP. Rounding up only helps the job, so the result is a lower bound on the exact optimum, below
    every online policy's cost by construction; the error is at most one unit per restart."""
    big_n, d = workers, job.overhead_min
    g = big_n  # units per full-cluster tick
    m_units = math.ceil(job.work_min * g / tick)
    n_ticks = math.ceil(job.deadline_min / tick)
    mem = [(s, o) for s in range(big_n + 1) for o in range(big_n + 1 - s)]  # mem[0] is idle
    spot = np.array([s for s, _ in mem])
    n = np.array([s + o for s, o in mem])
    price = np.array([s * job.spot_usd_per_h + o * job.on_demand_usd_per_h for s, o in mem]) / 60
    rs = sorted({0, *(d - j * tick for j in range(1, d // tick + 1) if d - j * tick > 0)})
    r_idx = {r: j for j, r in enumerate(rs)}
    rcs = sorted({*rs, d})
    prog = {rc: -(-(max(0, tick - rc) * n * g) // (big_n * tick)) for rc in rcs}  # ceil: see above
    per_unit = (tick / g * big_n / np.maximum(n, 1))[:, None]  # minutes per unit of work
    tick_cost = price[:, None] * tick
    shift = {rc: np.minimum(np.arange(m_units + 1)[None, :] + prog[rc][:, None], m_units) for rc in rcs}
    nxt = np.full((len(rs), len(mem), m_units + 1), np.inf)  # [overhead left, membership, work]
    nxt[:, :, m_units] = 0.0
    spare = nxt.copy()
    for i in range(n_ticks - 1, -1, -1):
        k = min(counts[i] if i < len(counts) else 0, big_n)
        room = min(tick, job.deadline_min - i * tick)
        lo, hi = max(0, m_units - (n_ticks - i) * g), min(m_units - 1, i * g)  # reachable and still finishable
        cur, spare = spare, nxt
        cur[:, :, max(0, hi + 1):m_units] = np.inf  # bands move down the work as time goes back: clear above
        if lo <= hi:
            w = np.arange(lo, hi + 1)[None, :]
            tail = max(lo, m_units - g)  # only the last g units can finish within a tick
            run = {}
            for rc in rcs:
                v = np.take_along_axis(nxt[r_idx[max(0, rc - tick)]], shift[rc][:, lo:hi + 1], axis=1)
                v += tick_cost
                if tail <= hi:  # row 0, idle, is no run
                    fin_min = rc + (m_units - w[:, tail - lo:]) * per_unit[1:]
                    v[1:, tail - lo:] = np.where(fin_min <= room + _EPS, price[1:, None] * fin_min, v[1:, tail - lo:])
                v[0] = np.inf
                run[rc] = v
            ok = (spot <= k) & (n > 0)
            best = nxt[0, 0, lo:hi + 1].copy()  # to idle: free
            if ok.any():
                best = np.minimum(best, run[d][ok].min(axis=0))  # any change of membership restarts
            for j, r in enumerate(rs):
                keep = run[r]
                keep[~ok] = np.inf  # go on as is (not possible once preempted)
                np.minimum(keep, best[None, :], out=cur[j, :, lo:hi + 1])
        nxt = cur
    v0 = float(nxt[0, 0, 0])
    return v0 if math.isfinite(v0) else None


def run_elastic(job: Job, workers: int, trace: AvailabilityTrace, start_tick: int,
                names: tuple[str, ...] = POLICIES, history_h: float = HISTORY_H) -> dict[str, Outcome]:
    """Every named policy for an N-worker job on ``trace`` from ``start_tick`` (the ``deadline`` and ``elastic``
    policies have seen the ``history_h`` hours before it). ``optimal`` is a cost only (no timeline)."""
    if not 0 <= start_tick < len(trace.counts):
        raise AvailabilityTraceError(f"start tick {start_tick} is outside the trace (0..{len(trace.counts) - 1})")
    tick = trace.tick_min
    counts = trace.counts[start_tick:]
    history = trace.counts[max(0, start_tick - round(history_h * 60 / tick)):start_tick]
    out: dict[str, Outcome] = {}
    for name in names:
        if name == "optimal":
            cost = optimal_cost(job, workers, counts, tick)
            out[name] = Outcome(name, math.inf if cost is None else cost, math.nan, cost is not None)
        elif name == "on-demand":
            out[name] = replay(job, workers, counts, tick, lambda p: Members(0, p.workers), name)
        elif name == "elastic":
            out[name] = replay(job, workers, counts, tick, elastic_policy, name, history)
        else:
            out[name] = replay(job, workers, counts, tick, all_or_nothing(name, job, history), name)
    return out


def elastic_outlook(job: Job, workers: int, traces: list[AvailabilityTrace], starts: int = OUTLOOK_STARTS) -> Outlook:
    """``plan``'s row for the elastic policy: its mean cost and chance of meeting the deadline from the start ticks
    of the other rows, with no history (as a launch's daemon runs it: ``decide.deadline_elastic``). ``job``: the whole
    cluster's prices, here split over its ``workers`` VMs."""
    per_vm = replace(job, spot_usd_per_h=job.spot_usd_per_h / workers,
                     on_demand_usd_per_h=job.on_demand_usd_per_h / workers)
    return summed("elastic", [run_elastic(per_vm, workers, tr, start, ("elastic",), history_h=0.0)["elastic"]
                              for tr in traces for start in outlook_starts(job, tr, starts)])
