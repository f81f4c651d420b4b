"""What a simulation is about: the cluster's slots and settings (``SimCluster``), and one run's result.
The event loop that runs them is ``sim.engine``; defaults for the timings come from ``decide.deadline``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from orchestrator.decide import replacement as replacing
from orchestrator.model import timings
from orchestrator.model.instances import Role
from orchestrator.model.spec import OnRevocation

# SimCluster has a field named ``policy``: its class body cannot reach the module by that name.
_BOOT_S: Final = timings.BOOT_S
_SPOT_EXTRA_BOOT_S: Final = timings.SPOT_EXTRA_BOOT_S
_CHECKPOINT_S: Final = timings.checkpoint_s(2.0)  # a 2 MB model

ROLE_PS: Final = "ps"
ROLE_CHIEF: Final = "chief"
ROLE_WORKER: Final = "worker"
ROLES: Final = (ROLE_PS, ROLE_CHIEF, ROLE_WORKER)
COST_KEYS: Final = ("ps", "chief", "workers")

# The spec's policy.on_revocation values; what each does is decided by decide.deadline, as in the daemon.
POLICY_REPLACE: Final = OnRevocation.REPLACE.value
POLICY_SHRINK: Final = OnRevocation.SHRINK.value
POLICY_FALLBACK: Final = OnRevocation.FALLBACK_ON_DEMAND.value
POLICIES: Final = tuple(p.value for p in OnRevocation)

# Why a run did not finish.
FAIL_BUDGET: Final = "budget"
FAIL_DEADLINE: Final = "deadline"
FAIL_WORKERS_LOST: Final = "workers_lost"
FAIL_NO_REPLACEMENT: Final = "replacements_exhausted"  # a PS or the chief was lost with no replacement left
FAIL_STALLED: Final = "stalled"
FAILURES: Final = (FAIL_BUDGET, FAIL_DEADLINE, FAIL_WORKERS_LOST, FAIL_NO_REPLACEMENT, FAIL_STALLED)

# How a synchronous job uses its workers (costmodel.planner.strategies): data parallel survivors train on;
# a pipeline (or hybrid) steps only while every stage of its partition is up.
STRATEGIES: Final = ("data", "pipeline", "hybrid")
STAGE_LOSS: Final = ("auto", "wait")  # auto: costmodel.stage_loss decides; wait: always the replacement

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
        return replacing.is_critical(Role(self.role), self.hosts_chief)

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
    checkpoint_cost_s: float = _CHECKPOINT_S
    policy: str = POLICY_REPLACE
    max_replacements: int = 20
    budget_usd: float | None = None
    deadline_s: float | None = None
    boot_delay_s: float = _BOOT_S
    spot_extra_boot_s: float = _SPOT_EXTRA_BOOT_S
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
    # sync: each change of the live workers pauses training this long (torchrun restarts every worker
    # process and the world restores); a worker's revocation first waits out its notice_s (the world
    # re-forms only once the node has left)
    regroup_s: float = 0.0
    teardown_s: float = 0.0  # last step -> every instance deleted (finished runs)
    time_scale: float = 1.0  # cloud seconds per simulated second (local provider): model lifetimes shrink
    # Deterministic lifetimes (slot index, generation) -> seconds from request, e.g. the local provider's
    # seeded draws; every Monte Carlo run then replays them.
    lifetime_fn: Callable[[int, int], float] | None = field(default=None, compare=False)
    # pipeline / hybrid: ``rate_fn(live)`` is the step rate of the best partition of the model over ``live`` (0:
    # none fits their memory); a stage's revocation stops every step until the replacement is back and restored
    # (``regroup_s``) or, when ``stage_loss`` is auto and costmodel.stage_loss finds it cheaper (``objective``),
    # the survivors restore a new partition and go on without it.
    strategy: str = "data"
    stage_loss: str = "auto"
    objective: str = "cost"

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
        if self.strategy not in STRATEGIES or self.stage_loss not in STAGE_LOSS:
            raise ValueError(f"strategy '{self.strategy}' / stage_loss '{self.stage_loss}' is not one of "
                             f"{', '.join(STRATEGIES)} / {', '.join(STAGE_LOSS)}")
        if self.strategy != "data" and self.mode != "sync":
            raise ValueError(f"a {self.strategy} job is synchronous: mode must be sync")
        if self.train_steps <= 0 or self.checkpoint_every <= 0:
            raise ValueError("train_steps and checkpoint_every must be positive")
        if not self.time_scale > 0:
            raise ValueError("time_scale must be > 0")
        if self.checkpoint_cost_s < 0 or self.boot_delay_s < 0 or self.spot_extra_boot_s < 0:
            raise ValueError("checkpoint cost and boot delays must be >= 0")
        delays = {"startup_s": self.startup_s, "rejoin_s": self.rejoin_s, "notice_s": self.notice_s,
                  "teardown_s": self.teardown_s, "regroup_s": self.regroup_s}
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

    @property
    def pipelined(self) -> bool:
        return self.strategy != "data"

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

