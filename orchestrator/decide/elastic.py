"""Finishing a multi-worker job by a deadline with elastic shrink and on-demand top-up (issue 23, item 2).

A data-parallel job of N workers may run on fewer: n workers progress n/N as fast (elastic shrink; the
global batch is kept by more accumulation steps, so the work in full-cluster hours is unchanged). At each
decision point k spot VMs can be had; the job runs ``spot`` of them (at most min(k, N)) and tops up with
``on_demand`` VMs. Any change of membership (a start, a grow, a shrink, a preemption that the job rides
out) restarts the whole cluster (elastic torchrun): the restart overhead, billed for every VM, no progress; on
torchft replica groups (``change_h``) only the joiners boot, and the workers that stay pause for a quorum.

The all-or-nothing policies of ``decide.deadline`` see "spot can be had" as k >= N and run the whole cluster
on one pricing; ``elastic_policy`` is the product's decision for the elastic case. When all or none of the N
spot VMs can be had it decides as ``decide.deadline.deadline_policy`` (there is nothing to shrink onto); in
between it runs the spot VMs there are and sizes the on-demand top-up from the line of uniform progress.
Pure: the simulator (``sim.elastic``) and a daemon apply the same function to the same state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from orchestrator.decide import knobs
from orchestrator.decide.deadline import DEFAULT_AVAILABILITY, Availability, Mode, Progress, Standing, deadline_policy


@dataclass(frozen=True)
class Members:
    """What the cluster runs: spot and on-demand VMs (one worker each)."""

    spot: int = 0
    on_demand: int = 0

    @property
    def workers(self) -> int:
        return self.spot + self.on_demand


IDLE: Final = Members()


def kept_through(before: Members, after: Members) -> int:
    """The workers of ``before`` that go on in ``after`` on replica groups: as many of each billing as both have."""
    return min(after.spot, before.spot) + min(after.on_demand, before.on_demand)


@dataclass(frozen=True)
class ElasticState(Standing):
    """Where an N-worker job stands (hours from its start; work in full-cluster hours): a count of spot VMs over the
    same market the one-market ``Progress`` reads (``whole``: that view, for the whole cluster)."""

    workers: int  # N, the job's full size
    elapsed_h: float
    work_done_h: float
    work_h: float
    deadline_h: float
    overhead_h: float  # one restart of the cluster: boot + restore + lost steps
    tick_h: float  # time until the next decision
    running: Members  # what runs now, after any preemption this tick
    spot_can: int  # spot VMs that can be had now (k)
    restart_due: bool = False  # a preemption shrank the cluster: whatever runs next restarts
    overhead_left_h: float = 0.0
    spot_age_h: float = 0.0  # how long at least min(k, N) spot VMs could be had
    spot_left_h: float = 2.0  # how much longer they are expected to last (from the stretches seen)
    spot_usd_per_h: float = 0.3  # per VM
    on_demand_usd_per_h: float = 1.0
    seen_full: Availability = field(default=DEFAULT_AVAILABILITY)  # stretches with >= N spot VMs seen so far
    # torchft replica groups: a change of membership costs the workers that stay only this (a quorum's pause), and
    # a joiner its boot (``overhead_h``); None: every change restarts the whole cluster (elastic torchrun).
    change_h: float | None = None

    def kept(self, m: Members) -> int:
        """Workers of ``m`` that run now and go on through a change to ``m`` (replica groups; else none)."""
        return 0 if self.change_h is None else kept_through(self.running, m)

    def whole(self, mode: Mode, spot_up_h: float, outage_h: float = 0.0) -> Progress:
        """The job as one market of N VMs at once, all or nothing (spot can be had: k >= N; prices N-fold):
        what ``decide.deadline``'s one-market policies read. ``mode``: what the whole cluster runs."""
        n = self.workers
        return Progress(elapsed_h=self.elapsed_h, work_done_h=self.work_done_h, work_h=self.work_h,
                        deadline_h=self.deadline_h, overhead_h=self.overhead_h, mode=mode,
                        spot_available=self.spot_can >= n, tick_h=self.tick_h, overhead_left_h=self.overhead_left_h,
                        outage_h=outage_h, spot_up_h=spot_up_h, spot_usd_per_h=n * self.spot_usd_per_h,
                        on_demand_usd_per_h=n * self.on_demand_usd_per_h)




def _slack_after(p: ElasticState, m: Members) -> float:
    """The slack left after running ``m`` for one tick (a change of membership restarts it first; on replica
    groups only the joiners start, and the workers kept pause for ``change_h``)."""
    restart = m != p.running or p.restart_due
    r = (p.overhead_h if restart else p.overhead_left_h) if m.workers else 0.0
    kept = p.kept(m) if restart else 0
    pause = p.change_h or 0.0
    run = kept * max(0.0, p.tick_h - pause) + (m.workers - kept) * max(0.0, p.tick_h - r)
    late = max(0.0, (pause if kept else r) - p.tick_h)
    return p.deadline_h - p.elapsed_h - p.tick_h - (p.work_h - p.work_done_h - run / p.workers) - late


def safe(p: ElasticState, m: Members) -> Members:
    """The safety net: a choice other than the whole cluster on on-demand must leave, after this tick, the
    slack to restart on it (a spot VM may be lost at the next tick; on-demand is never lost)."""
    full = Members(0, p.workers)
    if m != full and _slack_after(p, m) < p.overhead_h:
        return full
    return m


def topup_needed(p: ElasticState, spot: int) -> int:
    """On-demand VMs to add to ``spot`` spot workers: none while ahead of the line of uniform progress by
    TOPUP_LINE overheads, else enough for the rate that finishes the rest with RESERVE overheads to spare."""
    if p.ahead_h >= knobs.TOPUP_LINE * p.overhead_h:
        return 0
    room = p.deadline_h - p.elapsed_h - p.overhead_left_h - knobs.RESERVE * p.overhead_h
    rate = 1.0 if room <= 0 else min(1.0, (p.work_h - p.work_done_h) / room)
    return max(0, min(p.workers - spot, math.ceil(rate * p.workers - 1e-9) + knobs.TOPUP_EXTRA - spot))


def _worth(p: ElasticState, cur: Members, new: Members) -> bool:
    """Is moving ``cur`` onto more spot VMs expected to pay? Each added spot worker-hour counts as an
    on-demand one saved (as the deadline policy's hop gate) for the rest of the spot stretch expected at its
    age; the restart costs the overhead at the new cluster's price and again at on-demand prices (the work
    it loses)."""
    stretch = min(p.spot_left_h, p.work_h - p.work_done_h)
    gain = (p.on_demand_usd_per_h - p.spot_usd_per_h) * (new.spot - cur.spot) * stretch
    kept = p.kept(new) if cur == p.running else 0
    starting = Members(new.spot - min(new.spot, cur.spot) if kept else new.spot,
                       new.on_demand - min(new.on_demand, cur.on_demand) if kept else new.on_demand)
    cost = p.overhead_h * (starting.spot * p.spot_usd_per_h + starting.on_demand * p.on_demand_usd_per_h
                           + starting.workers * p.on_demand_usd_per_h)
    cost += (p.change_h or 0.0) * kept * 2 * p.on_demand_usd_per_h  # the kept workers' pause, billed and lost
    return gain >= knobs.GROW_GAIN * cost


def _as_deadline(p: ElasticState, top: int) -> Members:
    """With all of N spot VMs to be had or none, elastic shrink has nothing to add: ``decide.deadline``'s
    deadline decision (tuned for exactly that), for the whole cluster. On-demand keeps the cluster's
    on-demand VMs when it runs only those (a restart to add more would buy no deadline it needs)."""
    n, cur = p.workers, p.running
    mode = Mode.IDLE
    if not p.restart_due and cur != IDLE:
        mode = Mode.SPOT if cur == Members(n, 0) else Mode.ON_DEMAND if cur.spot == 0 else Mode.IDLE
    choice = deadline_policy(p.whole(mode, p.spot_age_h if p.spot_can >= n else 0.0), p.seen_full)
    if choice == Mode.SPOT:
        return Members(n, 0)
    if choice == Mode.ON_DEMAND:
        return cur if mode == Mode.ON_DEMAND and cur.on_demand >= top else Members(0, n)
    return IDLE


def elastic_policy(p: ElasticState) -> Members:
    """Run on the spot VMs that can be had (up to N) and top up with on-demand only as far as the deadline
    needs. Every change of membership costs a restart of the whole cluster, so the cluster is left alone
    unless a preemption restarts it anyway, the deadline needs more workers, more spot VMs can be had than
    the cluster has workers (taken at once: that tuned better than gating it), or enough came free
    (GROW_FRAC of N, or any while far enough ahead: DROP_LINE overheads) and have been up HOP_AGE overheads,
    and the spot stretch left is expected to repay the restart (GROW_GAIN). Spot VMs replace on-demand ones
    one for one; on-demand VMs are never dropped just to wait, and a spot blip is not worth a restart."""
    n, d = p.workers, p.overhead_h
    spot = min(p.spot_can, n)
    top = topup_needed(p, spot)
    want, cur = Members(spot, top), p.running
    if knobs.DELEGATE and spot in (0, n) and (p.restart_due or cur.spot in (0, n)):
        return safe(p, _as_deadline(p, top))
    if p.restart_due or cur == IDLE:  # restarting (or starting) anyway: take the best membership now ...
        if top == 0 and spot and not _worth(p, IDLE, want):
            return safe(p, IDLE)  # ... unless it is spot alone, ahead, and not expected to last: wait
        return safe(p, want)
    if want.workers > cur.workers:
        return safe(p, want)  # behind (the deadline needs more workers), or more spot VMs than workers now
    trade = Members(spot, max(top, cur.on_demand - (spot - cur.spot)))  # spot replaces on-demand 1 for 1
    more = spot - cur.spot >= max(1, knobs.GROW_FRAC * n) or (cur.on_demand and p.ahead_h >= knobs.DROP_LINE * d)
    if trade.on_demand < cur.on_demand and p.ahead_h < knobs.HOP_LINE * d:
        more = False  # a failed hop off on-demand spends slack: only once ahead (as the deadline policy)
    if spot > cur.spot and more and p.spot_age_h >= knobs.HOP_AGE * d and _worth(p, cur, trade):
        return safe(p, trade)
    return safe(p, cur)
