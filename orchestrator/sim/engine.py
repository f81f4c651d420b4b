"""Discrete-event simulation of one training job on revocable (spot / preemptible) instances.

Model, in the job's wall-clock seconds from the moment every instance is requested:

* every instance boots for ``boot_delay_s`` (+ ``spot_extra_boot_s`` when it is spot) and is billed
  per second from request to deletion (revocation or job end), boot included;
* training runs while every parameter server and the chief are up and at least one worker is;
  the step rate is ``rate_fn(live workers)`` or, by default, async: the sum of the live workers'
  rates capped by the PS capacity; sync: the slowest live worker's rate;
* every ``checkpoint_every`` steps training stalls ``checkpoint_cost_s`` to write a checkpoint;
* a spot instance is revoked when its lifetime (from a ``LifetimeSource``) runs out; a revoked
  worker is replaced per the policy (``replace``: same type and pricing, same zone or the next one
  when ``rotate_zones``; ``fallback-on-demand``: an on-demand instance, never revoked again;
  ``shrink``: no replacement), at most ``max_replacements`` times in all;
* losing a PS or the chief rolls training back to the last completed checkpoint and pauses it until
  the replacement is up (PS and chief are replaced under every policy, shrink included);
* with ``enforce_limits`` the run stops (failed) when the budget is spent or the deadline passes;
* optional real-world delays (all 0 by default): ``startup_s`` from the moment every PS and the chief
  are up (sync: the first worker) until training steps (task start, framework import, graph build), at
  the start and again after each PS / chief replacement; ``rejoin_s`` from a replacement worker's
  instance being up until it steps; ``notice_s`` that a revoked instance keeps being billed after its
  revocation (the notice window until its deletion; it stops training at the revocation; this tail is
  added to the run's cost at the end, not counted against the budget while it runs); and
  ``teardown_s`` after the last step until every instance is deleted (final checkpoint, evaluation,
  deletion), billed and part of the wall time of a finished run.

Between membership changes the rate is constant, so progress (with its checkpoint stalls) is computed
in closed form: a run costs a handful of events however many steps it has.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Final, Protocol

ROLE_PS: Final = "ps"
ROLE_CHIEF: Final = "chief"
ROLE_WORKER: Final = "worker"
ROLES: Final = (ROLE_PS, ROLE_CHIEF, ROLE_WORKER)
COST_KEYS: Final = ("ps", "chief", "workers")

POLICY_REPLACE: Final = "replace"
POLICY_SHRINK: Final = "shrink"
POLICY_FALLBACK: Final = "fallback-on-demand"
POLICIES: Final = (POLICY_REPLACE, POLICY_SHRINK, POLICY_FALLBACK)

# Why a run did not finish.
FAIL_BUDGET: Final = "budget"
FAIL_DEADLINE: Final = "deadline"
FAIL_WORKERS_LOST: Final = "workers_lost"
FAIL_NO_REPLACEMENT: Final = "replacements_exhausted"  # a PS or the chief was lost with no replacement left
FAIL_STALLED: Final = "stalled"
FAILURES: Final = (FAIL_BUDGET, FAIL_DEADLINE, FAIL_WORKERS_LOST, FAIL_NO_REPLACEMENT, FAIL_STALLED)

_BOOTING: Final = 1
_LIVE: Final = 2
_GONE: Final = 0
_INF: Final = math.inf

RateFn = Callable[[tuple[int, ...]], float]
"""Cluster steps/s given the (sorted) slot indices of the live workers."""


@dataclass(frozen=True)
class SimSlot:
    """One position in the cluster; its instance may be replaced (a new generation) after a revocation."""

    name: str  # "worker-0", "ps-0", "chief-0"
    role: str  # "ps" | "chief" | "worker"
    gpu: str | None = None  # lowercase catalog key; None for CPU instances
    zone: str | None = None
    spot: bool = False
    price_per_hour: float = 0.0  # at the slot's own pricing (spot price if spot)
    on_demand_price_per_hour: float | None = None  # for fallback-on-demand; default: price_per_hour
    step_rate: float = 0.0  # steps/s this worker achieves on its own (workers only)
    batch: int = 0
    replacement_zones: tuple[str, ...] = ()  # tried in order after ``zone`` when rotate_zones
    hosts_chief: bool = False  # a worker whose VM also runs the chief (ICAC'19 setup): its loss stops training

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"slot {self.name}: role '{self.role}' is not one of {', '.join(ROLES)}")
        if self.price_per_hour < 0 or self.step_rate < 0:
            raise ValueError(f"slot {self.name}: price and step rate must be >= 0")

    @property
    def critical(self) -> bool:
        return self.role != ROLE_WORKER or self.hosts_chief

    @property
    def od_price(self) -> float:
        return self.price_per_hour if self.on_demand_price_per_hour is None else self.on_demand_price_per_hour

    def zone_for(self, generation: int, rotate: bool) -> str | None:
        zones = (self.zone, *self.replacement_zones) if self.zone is not None else self.replacement_zones
        if not zones:
            return self.zone
        return zones[generation % len(zones)] if rotate else zones[0]


@dataclass(frozen=True)
class SimCluster:
    """Everything the engine needs about one job; build it by hand or with ``from_spec``."""

    slots: tuple[SimSlot, ...]
    train_steps: int
    mode: str = "async"
    ps_capacity_steps_per_s: float = math.inf
    rate_fn: RateFn | None = field(default=None, compare=False)
    checkpoint_every: int = 1000
    checkpoint_cost_s: float = 3.75 + 0.02 * 2.0
    policy: str = POLICY_REPLACE
    max_replacements: int = 20
    budget_usd: float | None = None
    deadline_s: float | None = None
    boot_delay_s: float = 70.0
    spot_extra_boot_s: float = 15.0
    preemptible: bool = False  # spot instances are stopped at 24 h (legacy GCE preemptible VMs)
    enforce_limits: bool = True
    rotate_zones: bool = False
    name: str = "job"
    model_mb: float = 2.0
    # Deterministic revocations instead of a model: (slot, seconds) revokes the slot's first instance.
    schedule: tuple[tuple[str, float], ...] | None = None
    start_at: datetime | None = None  # calendar start (weekday/weekend hazard factor); None = weekday
    startup_s: float = 0.0  # PS + chief up (sync: first worker up) -> training steps; again after a restart
    rejoin_s: float = 0.0  # a replacement worker's instance up -> it steps
    notice_s: float = 0.0  # a revoked instance is billed this long after its revocation
    teardown_s: float = 0.0  # last step -> every instance deleted (finished runs)
    time_scale: float = 1.0  # cloud seconds per simulated second (local provider): model lifetimes shrink
    # Deterministic lifetimes (slot index, generation) -> seconds from request, e.g. the local provider's
    # seeded draws; every Monte Carlo run then replays them.
    lifetime_fn: Callable[[int, int], float] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        names = [s.name for s in self.slots]
        if len(set(names)) != len(names):
            raise ValueError(f"slot names must be unique: {', '.join(names)}")
        if not any(s.role == ROLE_WORKER for s in self.slots):
            raise ValueError("the cluster needs at least one worker")
        if self.policy not in POLICIES:
            raise ValueError(f"policy '{self.policy}' is not one of {', '.join(POLICIES)}")
        if self.mode not in ("async", "sync"):
            raise ValueError(f"mode '{self.mode}' is not async or sync")
        if self.train_steps <= 0 or self.checkpoint_every <= 0:
            raise ValueError("train_steps and checkpoint_every must be positive")
        if not self.time_scale > 0:
            raise ValueError("time_scale must be > 0")
        if self.checkpoint_cost_s < 0 or self.boot_delay_s < 0 or self.spot_extra_boot_s < 0:
            raise ValueError("checkpoint cost and boot delays must be >= 0")
        delays = {"startup_s": self.startup_s, "rejoin_s": self.rejoin_s, "notice_s": self.notice_s,
                  "teardown_s": self.teardown_s}
        bad = [f"{k}={v}" for k, v in delays.items() if not 0 <= v < _INF]
        if bad:
            raise ValueError(f"delays must be finite and >= 0: {', '.join(bad)}")

    def slot_index(self, name: str) -> int:
        for i, s in enumerate(self.slots):
            if s.name == name:
                return i
        raise KeyError(
            f"'{name}' is not a slot of this cluster; slots: {', '.join(s.name for s in self.slots)}"
        )

    @property
    def workers(self) -> list[SimSlot]:
        return [s for s in self.slots if s.role == ROLE_WORKER]

    def hourly_price(self) -> float:
        return sum(s.price_per_hour for s in self.slots)


@dataclass(frozen=True)
class SimEvent:
    t: float
    kind: str  # "ready" | "revoked" | "replace" | "lost" | "rollback" | "teardown" | "finished" | "failed"
    slot: str = ""
    detail: str = ""


@dataclass(frozen=True)
class RunResult:
    wall_time_s: float
    cost_usd: float
    cost_by_role: dict[str, float]  # "ps", "chief", "workers"
    revocations: int
    replacements: int
    steps_done: float
    steps_lost: float
    finished: bool
    failure: str | None  # one of FAILURES, None when finished
    deadline_missed: bool
    over_budget: bool
    events: tuple[SimEvent, ...] = ()


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
        self.critical = [s.critical for s in slots]
        self.n_critical = sum(self.critical)
        self.n_workers = sum(self.is_worker)
        self.boundaries = math.ceil(cluster.train_steps / cluster.checkpoint_every) - 1  # checkpoints below T
        self._rates: dict[int, float] = {}

    def boot(self, spot: bool) -> float:
        c = self.cluster
        return c.boot_delay_s + (c.spot_extra_boot_s if spot else 0.0)

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
    cluster: SimCluster | CompiledCluster, lifetimes: LifetimeSource, *, record: bool = False
) -> RunResult:
    """Simulate one run; ``record`` keeps the event log in the result."""
    cc = cluster if isinstance(cluster, CompiledCluster) else CompiledCluster(cluster)
    return _run(cc, lifetimes, record)


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


def _run(cc: CompiledCluster, src: LifetimeSource, record: bool) -> RunResult:  # noqa: C901
    c = cc.cluster
    n = cc.n
    is_worker = cc.is_worker
    policy = c.policy
    max_repl = c.max_replacements
    spot = list(cc.spot)
    price = list(cc.price_s)
    zone = list(cc.zone)
    gen = [0] * n
    req = [0.0] * n
    state = [_BOOTING] * n
    ready = [cc.boot(spot[i]) for i in range(n)]
    death = [src.lifetime(i, 0, zone[i], spot[i], 0.0) for i in range(n)]
    role_cost = [0.0, 0.0, 0.0]
    burn = sum(price)
    cost = 0.0
    live_mask = 0
    crit_missing = cc.n_critical
    workers_alive = cc.n_workers
    rate = 0.0
    steps = 0.0
    stall = 0.0
    last_ckpt = 0.0
    lost = 0.0
    revs = 0
    repl = 0
    t = 0.0
    finished = False
    failure: str | None = None
    events: list[SimEvent] = []
    enforce = c.enforce_limits
    deadline = c.deadline_s if (enforce and c.deadline_s is not None) else _INF
    budget = c.budget_usd if enforce else None
    total = float(c.train_steps)
    go_at = _INF  # training may step from then on (set when the cluster's critical part comes up)
    tails: list[tuple[int, float, float]] = []  # (role index, price per s, revoked at): notice billing

    while True:
        t_mem = _INF
        for i in range(n):
            s = state[i]
            if s == _LIVE:
                x = death[i]
            elif s == _BOOTING:
                x = ready[i] if ready[i] < death[i] else death[i]
            else:
                continue
            if x < t_mem:
                t_mem = x
        running = crit_missing == 0 and t >= go_at
        t_go = go_at if crit_missing == 0 and go_at > t else _INF
        t_fin = t + time_to_finish(cc, steps, stall, rate) if running else _INF
        t_bud = t + (budget - cost) / burn if (budget is not None and burn > 0) else _INF
        t_next = min(t_mem, t_go, t_fin, t_bud, deadline)
        if t_next == _INF:
            failure = FAIL_STALLED
            break
        dt = t_next - t
        if running and dt > 0:
            steps, stall, last_ckpt = advance(cc, steps, stall, last_ckpt, rate, dt)
        cost += burn * dt
        t = t_next
        if t_fin <= t_next:
            steps = total
            finished = True
            break
        if t_bud <= t_next:
            failure = FAIL_BUDGET
            break
        if deadline <= t_next:
            failure = FAIL_DEADLINE
            break
        changed = False
        for i in range(n):
            s = state[i]
            if s == _GONE:
                continue
            if s == _BOOTING and ready[i] <= t and ready[i] < death[i]:
                state[i] = s = _LIVE
                if is_worker[i]:
                    live_mask |= 1 << i
                    changed = True
                    if cc.n_critical == 0 and go_at == _INF:
                        go_at = t + c.startup_s
                if cc.critical[i]:
                    crit_missing -= 1
                    if crit_missing == 0:
                        go_at = t + c.startup_s
                if record:
                    events.append(SimEvent(t, "ready", c.slots[i].name, f"gen {gen[i]}"))
            if death[i] > t:
                continue
            revs += 1
            role_cost[cc.role_idx[i]] += price[i] * (t - req[i])
            burn -= price[i]
            if c.notice_s > 0:
                tails.append((cc.role_idx[i], price[i], t))
            if record:
                events.append(
                    SimEvent(t, "revoked", c.slots[i].name, "while booting" if s == _BOOTING else "")
                )
            if s == _LIVE:
                if is_worker[i]:
                    live_mask &= ~(1 << i)
                    changed = True
                if cc.critical[i]:
                    crit_missing += 1
                    if crit_missing == 1:
                        lost += steps - last_ckpt
                        if record:
                            events.append(
                                SimEvent(t, "rollback", c.slots[i].name, f"{steps:.0f} -> {last_ckpt:.0f}")
                            )
                        steps = last_ckpt
                        stall = 0.0
            if (is_worker[i] and not cc.critical[i] and policy == POLICY_SHRINK) or repl >= max_repl:
                state[i] = _GONE
                if record:
                    events.append(SimEvent(t, "lost", c.slots[i].name, "not replaced"))
                if is_worker[i]:
                    workers_alive -= 1
                if cc.critical[i]:
                    failure = FAIL_NO_REPLACEMENT
                continue
            repl += 1
            g = gen[i] = gen[i] + 1
            sp = spot[i] = spot[i] and policy != POLICY_FALLBACK
            price[i] = cc.price_s[i] if sp else cc.od_price_s[i]
            zone[i] = c.slots[i].zone_for(g, c.rotate_zones)
            req[i] = t
            ready[i] = t + cc.boot(sp) + (c.rejoin_s if is_worker[i] else 0.0)
            death[i] = t + src.lifetime(i, g, zone[i], sp, t)
            state[i] = _BOOTING
            burn += price[i]
            if record:
                kind = "spot" if sp else "on-demand"
                events.append(SimEvent(t, "replace", c.slots[i].name, f"gen {g}, {kind}, zone {zone[i]}"))
        if changed:
            rate = cc.rate(live_mask)
        if failure is not None:
            break
        if workers_alive == 0:
            failure = FAIL_WORKERS_LOST
            break

    if finished and c.teardown_s > 0:
        t += c.teardown_s  # every instance still held is billed until it is deleted
        if record:
            events.append(SimEvent(t, "teardown", "", f"{c.teardown_s:.1f} s after the last step"))
    for i in range(n):
        if state[i] != _GONE:
            role_cost[cc.role_idx[i]] += price[i] * (t - req[i])
    for role, p_s, at in tails:
        role_cost[role] += p_s * max(0.0, min(at + c.notice_s, t) - at)
    if record:
        events.append(SimEvent(t, "finished" if finished else "failed", "", failure or ""))
    cost_total = sum(role_cost)
    deadline_missed = c.deadline_s is not None and (not finished or t > c.deadline_s)
    over_budget = c.budget_usd is not None and (failure == FAIL_BUDGET or cost_total > c.budget_usd)
    return RunResult(
        wall_time_s=t,
        cost_usd=cost_total,
        cost_by_role=dict(zip(COST_KEYS, role_cost, strict=True)),
        revocations=revs,
        replacements=repl,
        steps_done=steps,
        steps_lost=lost,
        finished=finished,
        failure=failure,
        deadline_missed=deadline_missed,
        over_budget=over_budget,
        events=tuple(events),
    )
