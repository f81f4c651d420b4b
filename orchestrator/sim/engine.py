"""Discrete-event simulation of one training job on revocable (spot / preemptible) instances.

Model, in the job's wall-clock seconds from the moment every instance is requested:

* every instance boots for ``boot_delay_s`` (+ ``spot_extra_boot_s`` when it is spot) and is billed
  per second from request to deletion (revocation or job end), boot included;
* training runs while every parameter server and the chief are up and at least one worker is;
  the step rate is ``rate_fn(live workers)`` or, by default, async: the sum of the live workers'
  rates capped by the PS capacity; sync: the slowest live worker's rate;
* every ``checkpoint_every`` steps training stalls ``checkpoint_cost_s`` to write a checkpoint;
* a spot instance is revoked when its lifetime (from a ``LifetimeSource``) runs out; whether and how it
  is replaced is decided by the daemon's own functions, ``decide.replacement.decide_replacement`` and
  ``replacement_zones`` (``replace``: same type and pricing, same zone, or the next one when
  ``rotate_zones``; ``fallback-on-demand``: an on-demand instance, never revoked again; ``shrink``: no
  replacement), at most ``max_replacements`` times in all; ``sim.observed`` checks it against the
  daemon's ``decide.reconcile``;
* a pipeline or hybrid (``SimCluster.strategy``) steps only while every stage of its partition is up: a stage's
  revocation stops it until the replacement is up and restored, or (``stage_loss: auto``, where
  ``costmodel.stage_loss`` predicts it cheaper) the survivors re-partition the model and go on without it;
  idle survivors are billed all the while. Data parallel survivors train on;
* losing a PS or the chief rolls training back to the last completed checkpoint and pauses it until
  the replacement is up (PS and chief are replaced under every policy, shrink included);
* with ``enforce_limits`` the run stops (failed) when the budget is spent or the deadline passes;
* optional real-world delays (all 0 by default): ``startup_s`` from the moment every PS and the chief
  are up (sync: the first worker) until training steps (task start, framework import, graph build), at
  the start and again after each PS / chief replacement; ``rejoin_s`` from a replacement worker's
  instance being up until it steps; ``notice_s`` that a revoked instance keeps being billed after its
  revocation (the notice window until its deletion; it stops training at the revocation; this tail is
  added to the run's cost at the end, not counted against the budget while it runs); ``regroup_s``
  that sync training pauses at each change of its live workers (after the revoked one's notice); and
  ``teardown_s`` after the last step until every instance is deleted (final checkpoint, evaluation,
  deletion), billed and part of the wall time of a finished run.

Between membership changes the rate is constant, so progress (with its checkpoint stalls) is computed
in closed form: a run costs a handful of events however many steps it has.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Final, Protocol

from orchestrator.costmodel.stage_loss import REPARTITION, decide_stage_loss
from orchestrator.decide import replacement as replacing
from orchestrator.model import timings
from orchestrator.model.instances import Role
from orchestrator.model.spec import OnRevocation
from orchestrator.sim import observed
from orchestrator.sim.cluster import (
    COST_KEYS,
    FAIL_BUDGET,
    FAIL_DEADLINE,
    FAIL_NO_REPLACEMENT,
    FAIL_STALLED,
    FAIL_WORKERS_LOST,
    FAILURES,
    POLICIES,
    POLICY_FALLBACK,
    POLICY_REPLACE,
    POLICY_SHRINK,
    ROLE_CHIEF,
    ROLE_PS,
    ROLE_WORKER,
    ROLES,
    RateFn,
    RunResult,
    SimCluster,
    SimEvent,
    SimSlot,
)

# Re-exported: the cluster and result types are part of the engine's interface.
__all__ = [
    "COST_KEYS", "FAILURES", "FAIL_BUDGET", "FAIL_DEADLINE", "FAIL_NO_REPLACEMENT", "FAIL_STALLED",
    "FAIL_WORKERS_LOST", "POLICIES", "POLICY_FALLBACK", "POLICY_REPLACE", "POLICY_SHRINK", "ROLES",
    "ROLE_CHIEF", "ROLE_PS", "ROLE_WORKER", "CompiledCluster", "FixedLifetimes", "LifetimeSource",
    "NoRevocations", "RateFn", "RunResult", "ScheduleLifetimes", "SimCluster", "SimEvent", "SimSlot",
    "advance", "compile_cluster", "no_revocation_time", "replay", "simulate", "time_to_finish",
]

_BOOTING: Final = 1
_LIVE: Final = 2
_GONE: Final = 0
_INF: Final = math.inf


class LifetimeSource(Protocol):
    def lifetime(self, slot: int, generation: int, zone: str | None, spot: bool, t_request: float) -> float:
        """Seconds from request until the instance is revoked (``inf``: never)."""
        ...


class NoRevocations:
    def lifetime(self, slot: int, generation: int, zone: str | None, spot: bool, t_request: float) -> float:
        return _INF


class FixedLifetimes:
    """``cluster.lifetime_fn`` as a lifetime source (spot instances only)."""

    def __init__(self, fn: Callable[[int, int], float]) -> None:
        self.fn = fn

    def lifetime(self, slot: int, generation: int, zone: str | None, spot: bool, t_request: float) -> float:
        return self.fn(slot, generation) if spot else _INF


class ScheduleLifetimes:
    """Deterministic revocations: each (slot name, time) revokes whatever instance holds the slot then
    (spot or not). With ``first_generation_only`` only a slot's first instance is revoked and its
    replacements live on, as in the local provider's ``revocations: schedule``."""

    def __init__(
        self,
        cluster: SimCluster,
        schedule: list[tuple[str, float]] | tuple[tuple[str, float], ...],
        *,
        first_generation_only: bool = False,
    ):
        self.first_generation_only = first_generation_only
        self._times: dict[int, list[float]] = {}
        for name, at in schedule:
            if at < 0:
                raise ValueError(f"revocation of {name} at {at} s: times must be >= 0")
            self._times.setdefault(cluster.slot_index(name), []).append(float(at))
        for times in self._times.values():
            times.sort()

    def lifetime(self, slot: int, generation: int, zone: str | None, spot: bool, t_request: float) -> float:
        if generation > 0 and self.first_generation_only:
            return _INF
        for at in self._times.get(slot, ()):
            if at > t_request:
                return at - t_request
        return _INF


class CompiledCluster:
    """Per-cluster arrays and the step-rate cache, shared by every run of a Monte Carlo."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        slots = cluster.slots
        self.n = len(slots)
        self.is_worker = [s.role == ROLE_WORKER for s in slots]
        self.role_idx = [COST_KEYS.index("workers" if s.role == ROLE_WORKER else s.role) for s in slots]
        self.spot = [s.spot for s in slots]
        self.price_s = [s.price_per_hour / 3600.0 for s in slots]
        self.od_price_s = [s.od_price / 3600.0 for s in slots]
        self.zone = [s.zone_for(0, False) for s in slots]
        self.zones = [tuple(z for z in (s.zone, *s.replacement_zones) if z is not None) for s in slots]
        self.roles = [Role(s.role) for s in slots]
        self.hosts_chief = [s.hosts_chief for s in slots]
        self.critical = [replacing.is_critical(r, h) for r, h in zip(self.roles, self.hosts_chief, strict=True)]
        self.on_revocation = OnRevocation(cluster.policy)
        self.n_critical = sum(self.critical)
        self.n_workers = sum(self.is_worker)
        self.boundaries = math.ceil(cluster.train_steps / cluster.checkpoint_every) - 1  # checkpoints below T
        self._rates: dict[int, float] = {}

    def boot(self, spot: bool) -> float:
        c = self.cluster
        return timings.boot_s(spot, c.boot_delay_s, c.spot_extra_boot_s)

    def rate(self, live_mask: int) -> float:
        cached = self._rates.get(live_mask)
        if cached is not None:
            return cached
        live = tuple(i for i in range(self.n) if live_mask >> i & 1)
        c = self.cluster
        if not live:
            value = 0.0
        elif c.rate_fn is not None:
            value = float(c.rate_fn(live))
        elif c.mode == "sync":
            value = min(c.slots[i].step_rate for i in live)
        else:
            value = min(sum(c.slots[i].step_rate for i in live), c.ps_capacity_steps_per_s)
        if not value >= 0 or math.isinf(value):
            raise ValueError(f"step rate for live workers {live} is {value}; it must be finite and >= 0")
        self._rates[live_mask] = value
        return value


def compile_cluster(cluster: SimCluster) -> CompiledCluster:
    return CompiledCluster(cluster)


def no_revocation_time(cluster: SimCluster) -> float:
    """Wall time when nothing is revoked: boot + steps / rate + checkpoint stalls."""
    return simulate(cluster, NoRevocations()).wall_time_s


def simulate(
    cluster: SimCluster | CompiledCluster, lifetimes: LifetimeSource, *, record: bool = False, daemon: bool = False
) -> RunResult:
    """Simulate one run; ``record`` keeps the event log in the result. ``daemon``: each revocation is decided
    by the daemon's real ``decide.reconcile``, shown the state the controller would observe (``sim.observed``;
    slower), instead of by the ``decide.deadline`` functions it calls."""
    cc = cluster if isinstance(cluster, CompiledCluster) else CompiledCluster(cluster)
    return _run(cc, lifetimes, record, daemon)


def replay(
    cluster: SimCluster,
    schedule: list[tuple[str, float]],
    *,
    boot_delay_s: float,
    spot_extra_boot_s: float = 0.0,
    step_rates: Mapping[str, float] | None = None,
    set_rates: Mapping[frozenset[str], float] | None = None,
    checkpoint_cost_s: float | None = None,
    startup_s: float = 0.0,
    rejoin_s: float = 0.0,
    notice_s: float = 0.0,
    teardown_s: float = 0.0,
    record: bool = True,
) -> RunResult:
    """Re-run a finished job with its observed revocations (slot name, seconds after the job started).

    ``step_rates`` (slot name -> measured steps/s) replace the predicted ones; they are combined
    with the cluster's default rule (async: sum capped by the PS capacity, sync: slowest worker).
    ``set_rates`` (frozenset of live worker slot names -> measured cluster steps/s) take precedence
    for the sets of live workers they name (the default rule covers the others). The remaining
    keywords override the cluster's delays (see ``SimCluster``) with measured ones.
    Scheduled revocations hit any instance in the slot, spot or not.
    """
    slots = cluster.slots
    rate_fn = cluster.rate_fn
    names = {s.name for s in slots}
    unknown = sorted(set(step_rates or {}) - names) + sorted(
        {n for key in (set_rates or {}) for n in key} - names
    )
    if unknown:
        raise KeyError(f"step rates for unknown slots {', '.join(unknown)}")
    if step_rates:
        slots = tuple(replace(s, step_rate=float(step_rates.get(s.name, s.step_rate))) for s in slots)
        rate_fn = None
    if set_rates:
        rate_fn = _set_rate_fn(replace(cluster, slots=slots, rate_fn=rate_fn), set_rates)
    c = replace(
        cluster,
        slots=slots,
        rate_fn=rate_fn,
        boot_delay_s=boot_delay_s,
        spot_extra_boot_s=spot_extra_boot_s,
        schedule=tuple(schedule),
        checkpoint_cost_s=cluster.checkpoint_cost_s if checkpoint_cost_s is None else checkpoint_cost_s,
        startup_s=startup_s,
        rejoin_s=rejoin_s,
        notice_s=notice_s,
        teardown_s=teardown_s,
    )
    return simulate(c, ScheduleLifetimes(c, schedule), record=record)


def _set_rate_fn(cluster: SimCluster, set_rates: Mapping[frozenset[str], float]) -> RateFn:
    """Measured rate of the live set when known, else the cluster's own rule."""
    fallback = CompiledCluster(cluster)
    rates = {frozenset(k): float(v) for k, v in set_rates.items()}

    def rate(live: tuple[int, ...]) -> float:
        key = frozenset(cluster.slots[i].name for i in live)
        if key in rates:
            return rates[key]
        return fallback.rate(sum(1 << i for i in live))

    return rate


# ---------------------------------------------------------------- progress arithmetic


def time_to_finish(cc: CompiledCluster, steps: float, stall: float, rate: float) -> float:
    """Seconds to reach train_steps from ``steps`` (with ``stall`` seconds of a checkpoint still to write)."""
    if rate <= 0:
        return _INF
    c = cc.cluster
    pending = cc.boundaries - math.floor(steps / c.checkpoint_every)
    return stall + (c.train_steps - steps) / rate + max(pending, 0) * c.checkpoint_cost_s


def advance(
    cc: CompiledCluster, steps: float, stall: float, last_ckpt: float, rate: float, dt: float
) -> tuple[float, float, float]:
    """(steps, stall left, last completed checkpoint) after ``dt`` seconds at ``rate`` steps/s."""
    c = cc.cluster
    if stall > 0:
        if dt < stall:
            return steps, stall - dt, last_ckpt
        dt -= stall
        stall = 0.0
        last_ckpt = steps
    if rate <= 0 or dt <= 0:
        return steps, stall, last_ckpt
    every = float(c.checkpoint_every)
    total = float(c.train_steps)
    k = math.floor(steps / every) + 1
    if k > cc.boundaries:
        return min(total, steps + dt * rate), 0.0, last_ckpt
    boundary = k * every
    to_boundary = (boundary - steps) / rate
    if dt < to_boundary:
        return steps + dt * rate, 0.0, last_ckpt
    dt -= to_boundary
    steps = boundary
    ck = c.checkpoint_cost_s
    cycle = ck + every / rate
    full = min(int(dt // cycle), cc.boundaries - k)
    if full > 0:
        steps += full * every
        dt -= full * cycle
        last_ckpt = steps - every
    if dt < ck:
        return steps, ck - dt, last_ckpt
    dt -= ck
    return min(total, steps + dt * rate), 0.0, steps


# ---------------------------------------------------------------- the event loop


class _Run:
    """One run's state, moved event by event. Which lost instance is replaced, how (spot or on-demand),
    where, and which losses roll training back are the daemon's own policy functions (``decide.deadline``)."""

    def __init__(self, cc: CompiledCluster, src: LifetimeSource, record: bool, daemon: bool = False) -> None:
        c = self.c = cc.cluster
        self.hist = observed.histories(c) if daemon else None  # what the controller would have recorded
        self.cc, self.src, self.record = cc, src, record
        n = cc.n
        self.spot, self.price, self.zone = list(cc.spot), list(cc.price_s), list(cc.zone)
        self.gen, self.req = [0] * n, [0.0] * n
        self.state = [_BOOTING] * n
        self.ready = [cc.boot(self.spot[i]) for i in range(n)]
        self.death = [src.lifetime(i, 0, self.zone[i], self.spot[i], 0.0) for i in range(n)]
        self.role_cost = [0.0, 0.0, 0.0]
        self.burn = sum(self.price)
        self.cost = self.rate = self.steps = self.stall = self.last_ckpt = self.lost = self.t = 0.0
        self.live_mask = self.revs = self.repl = 0
        self.crit_missing, self.workers_alive = cc.n_critical, cc.n_workers
        self.finished = False
        self.failure: str | None = None
        self.events: list[SimEvent] = []
        self.deadline = c.deadline_s if (c.enforce_limits and c.deadline_s is not None) else _INF
        self.budget = c.budget_usd if c.enforce_limits else None
        self.go_at = _INF  # training may step from then on (set when the cluster's critical part comes up)
        # A pipeline's stages: the workers its partition spans (every one is needed for a step).
        self.members = sum(1 << i for i in range(n) if cc.is_worker[i]) if c.pipelined else 0
        self.tails: list[tuple[int, float, float]] = []  # (role index, price per s, revoked at): notice billing

    def note(self, kind: str, i: int | None, detail: str = "") -> None:
        if self.record:
            self.events.append(SimEvent(self.t, kind, "" if i is None else self.c.slots[i].name, detail))

    def next_membership(self) -> float:
        """The next instance that comes up or is revoked."""
        t_mem = _INF
        state, ready, death = self.state, self.ready, self.death
        for i in range(self.cc.n):
            s = state[i]
            if s == _LIVE:
                x = death[i]
            elif s == _BOOTING:
                x = ready[i] if ready[i] < death[i] else death[i]
            else:
                continue
            if x < t_mem:
                t_mem = x
        return t_mem

    def step(self) -> None:
        """Advance to the next event (membership change, start of training, finish, budget, deadline)."""
        t = self.t
        running = self.crit_missing == 0 and t >= self.go_at
        t_go = self.go_at if self.crit_missing == 0 and self.go_at > t else _INF
        t_fin = t + time_to_finish(self.cc, self.steps, self.stall, self.rate) if running else _INF
        budget = self.budget
        t_bud = t + (budget - self.cost) / self.burn if (budget is not None and self.burn > 0) else _INF
        t_next = min(self.next_membership(), t_go, t_fin, t_bud, self.deadline)
        if t_next == _INF:
            self.failure = FAIL_STALLED
            return
        dt = t_next - t
        if running and dt > 0:
            self.steps, self.stall, self.last_ckpt = advance(self.cc, self.steps, self.stall, self.last_ckpt,
                                                             self.rate, dt)
        self.cost += self.burn * dt
        self.t = t_next
        if t_fin <= t_next:
            self.steps = float(self.c.train_steps)
            self.finished = True
        elif t_bud <= t_next:
            self.failure = FAIL_BUDGET
        elif self.deadline <= t_next:
            self.failure = FAIL_DEADLINE
        else:
            self.membership()

    def membership(self) -> None:
        changed = False
        t = self.t
        for i in range(self.cc.n):
            s = self.state[i]
            if s == _GONE:
                continue
            if s == _BOOTING and self.ready[i] <= t and self.ready[i] < self.death[i]:
                changed = self.up(i) or changed
            if self.death[i] <= t:
                changed = self.revoked(i) or changed
        pipelined = self.c.pipelined
        if changed or pipelined:  # a pipeline's stages change without a live worker leaving (a re-partition)
            self.rate = self.current_rate()
        lost = self.workers_alive == 0 or (pipelined and not self.cc.rate(self.members) > 0)
        if self.failure is None and lost:
            self.failure = FAIL_WORKERS_LOST  # no worker left, or no partition of the model fits the survivors

    def current_rate(self) -> float:
        """Data parallel: the live workers' rate; a pipeline: its partition's, only while every stage is live."""
        if not self.c.pipelined:
            return self.cc.rate(self.live_mask)
        return self.cc.rate(self.members) if self.live_mask & self.members == self.members else 0.0

    def up(self, i: int) -> bool:
        cc = self.cc
        self.state[i] = _LIVE
        if cc.is_worker[i]:
            self.live_mask |= 1 << i
            if cc.n_critical == 0 and self.go_at == _INF:
                self.go_at = self.t + self.c.startup_s
            self.regroup(0.0)
        if cc.critical[i]:
            self.crit_missing -= 1
            if self.crit_missing == 0:
                self.go_at = self.t + self.c.startup_s
        self.note("ready", i, f"gen {self.gen[i]}")
        if self.hist is not None:
            self.hist[self.c.slots[i].name].ready = True
        return cc.is_worker[i]

    def revoked(self, i: int) -> bool:
        """Instance ``i`` is revoked: bill it, roll back if it was critical, then apply the policy."""
        cc = self.cc
        self.revs += 1
        self.role_cost[cc.role_idx[i]] += self.price[i] * (self.t - self.req[i])
        self.burn -= self.price[i]
        if self.c.notice_s > 0:
            self.tails.append((cc.role_idx[i], self.price[i], self.t))
        self.note("revoked", i, "while booting" if self.state[i] == _BOOTING else "")
        changed = False
        if self.state[i] == _LIVE:
            changed = cc.is_worker[i]
            self.live_mask &= ~(1 << i)
            if changed:
                self.regroup(self.c.notice_s)
            if cc.critical[i]:
                self.crit_missing += 1
                if self.crit_missing == 1:
                    self.rollback(i)
        decision, zone = self.decide(i)
        if decision.verdict == replacing.Verdict.REPLACE and self.repartitions(i, decision.spot):
            self.drop(i, "re-partitioned over the survivors")
        elif decision.verdict == replacing.Verdict.REPLACE:
            self.replace(i, decision.spot, zone)
        else:
            self.drop(i)
            if decision.verdict == replacing.Verdict.EXHAUSTED and self.hist is not None:
                self.failure = FAIL_NO_REPLACEMENT  # the daemon ends the job, whichever slot it was
        return changed

    def repartitions(self, i: int, spot: bool) -> bool:
        """A pipeline lost stage ``i``: re-partition over the survivors (True) or wait for its replacement, whichever
        ``costmodel.stage_loss`` predicts cheaper. The replay of a daemon's history (``hist``)
        never re-partitions: it follows the replacements that history recorded."""
        cc, c = self.cc, self.c
        if not (c.pipelined and self.members >> i & 1) or c.stage_loss == "wait" or self.hist is not None:
            return False
        survivors = self.members & ~(1 << i)
        full, rest = cc.rate(self.members), cc.rate(survivors) if survivors else 0.0
        if not full > 0:
            return rest > 0
        replacement = cc.price_s[i] if spot else cc.od_price_s[i]
        d = decide_stage_loss(c.train_steps - self.steps, 1.0 / full, 1.0 / rest if rest > 0 else None,
                              cc.boot(spot) + c.rejoin_s, c.regroup_s, self.burn + replacement, self.burn, c.objective,
                              None if c.deadline_s is None else c.deadline_s - self.t)
        if d.action == REPARTITION:
            self.note("repartition", i, d.reason)
            if self.state[i] == _BOOTING:  # a replacement lost while booting: the survivors still restore
                self.regroup(0.0)
        return d.action == REPARTITION

    def regroup(self, wait_s: float) -> None:
        """Sync training already under way pauses while its world re-forms (``SimCluster.regroup_s``)."""
        c = self.c
        if c.mode == "sync" and c.regroup_s > 0 and self.go_at < self.t:  # under way, not its first start
            self.go_at = self.t + wait_s + c.regroup_s
            self.note("regroup", None, f"paused {wait_s + c.regroup_s:.1f} s")

    def decide(self, i: int) -> tuple[replacing.Replacement, str | None]:
        """The policy's answer for a revoked slot (and, asking the daemon, the zone it tries first)."""
        cc = self.cc
        if self.hist is not None:
            return observed.daemon_decision(self.c, self.hist, self.c.slots[i].name)
        return replacing.decide_replacement(
            cc.roles[i], preempted=True, spot=self.spot[i], on_revocation=cc.on_revocation,
            replacements=self.repl, max_replacements=self.c.max_replacements, hosts_chief=cc.hosts_chief[i]), None

    def rollback(self, i: int) -> None:
        self.lost += self.steps - self.last_ckpt
        self.note("rollback", i, f"{self.steps:.0f} -> {self.last_ckpt:.0f}")
        self.steps = self.last_ckpt
        self.stall = 0.0

    def drop(self, i: int, why: str = "not replaced") -> None:
        """Not replaced (shrink, no replacement left, a pipeline re-partitioned without it): a lost critical
        instance ends the run; a pipeline goes on over its other stages (re-partitioned)."""
        self.state[i] = _GONE
        self.members &= ~(1 << i)
        self.note("lost", i, why)
        if self.hist is not None:
            self.hist[self.c.slots[i].name].gone = True
        if self.cc.is_worker[i]:
            self.workers_alive -= 1
        if self.cc.critical[i]:
            self.failure = FAIL_NO_REPLACEMENT

    def replace(self, i: int, spot: bool, zone: str | None = None) -> None:
        cc, c, t = self.cc, self.c, self.t
        self.repl += 1
        g = self.gen[i] = self.gen[i] + 1
        self.spot[i] = spot
        self.price[i] = cc.price_s[i] if spot else cc.od_price_s[i]
        last = self.zone[i]
        if last is not None and cc.zones[i]:
            self.zone[i] = zone or replacing.replacement_zones(last, cc.zones[i], c.rotate_zones)[0]
        if self.hist is not None:
            h = self.hist[c.slots[i].name]
            h.spots.append(spot)
            h.zones.append(self.zone[i] or h.zones[-1])
            h.ready = False
        self.req[i] = t
        self.ready[i] = t + cc.boot(spot) + (c.rejoin_s if cc.is_worker[i] else 0.0)
        self.death[i] = t + self.src.lifetime(i, g, self.zone[i], spot, t)
        self.state[i] = _BOOTING
        self.burn += self.price[i]
        self.note("replace", i, f"gen {g}, {'spot' if spot else 'on-demand'}, zone {self.zone[i]}")

    def result(self) -> RunResult:
        c, t = self.c, self.t
        if self.finished and c.teardown_s > 0:
            t = self.t = t + c.teardown_s  # every instance still held is billed until it is deleted
            self.note("teardown", None, f"{c.teardown_s:.1f} s after the last step")
        for i in range(self.cc.n):
            if self.state[i] != _GONE:
                self.role_cost[self.cc.role_idx[i]] += self.price[i] * (t - self.req[i])
        for role, p_s, at in self.tails:
            self.role_cost[role] += p_s * max(0.0, min(at + c.notice_s, t) - at)
        self.note("finished" if self.finished else "failed", None, self.failure or "")
        cost_total = sum(self.role_cost)
        return RunResult(
            wall_time_s=t,
            cost_usd=cost_total,
            cost_by_role=dict(zip(COST_KEYS, self.role_cost, strict=True)),
            revocations=self.revs,
            replacements=self.repl,
            steps_done=self.steps,
            steps_lost=self.lost,
            finished=self.finished,
            failure=self.failure,
            deadline_missed=c.deadline_s is not None and (not self.finished or t > c.deadline_s),
            over_budget=c.budget_usd is not None and (self.failure == FAIL_BUDGET or cost_total > c.budget_usd),
            events=tuple(self.events),
        )


def _run(cc: CompiledCluster, src: LifetimeSource, record: bool, daemon: bool = False) -> RunResult:
    run = _Run(cc, src, record, daemon)
    while run.failure is None and not run.finished:
        run.step()
    return run.result()
