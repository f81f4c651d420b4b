"""What the reconciler sees: the job as recorded (desired + history) and one observation of the world."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.costmodel.slots import Slot
from orchestrator.model.instances import ObservedInstance, ProcStatus, Role
from orchestrator.model.spec import OnRevocation, TrainingMode
from orchestrator.model.status import InstanceStatus, JobStatus


@dataclass(frozen=True)
class GpuMarket:
    """Another GPU type the deadline policy may move the job's spot workers to (``policy.also_gpus``), as planned."""

    gpu: str
    speed: float  # the job's work per hour there, in hours of its work on its own GPU types
    spot_usd_per_h: float  # the job's cluster per hour with its spot workers there
    slots: tuple[Slot, ...]  # the job's spot slots on this GPU type (costmodel.slots.on_gpu)


@dataclass(frozen=True)
class DeadlineInputs:
    """What ``on_revocation: deadline`` decides from, besides the instances (seconds of the job's clock)."""

    work_s: float  # the job's no-revocation training time: predicted, then its steps at the pace it measured
    done_s: float  # of it, done so far (latest step / train_steps)
    overhead_s: float  # restart overhead: boot + restore + the checkpoint on the notice
    tick_s: float  # time between two decisions
    spot_usd_per_h: float
    on_demand_usd_per_h: float
    time_scale: float = 1.0  # cloud seconds per second of the job's clock (local): the policy thinks in cloud time
    # Spot capacity as the daemon saw it: (time, available) at each change it recorded, oldest first.
    spot_seen: tuple[tuple[float, bool], ...] = ()
    # Before the job: the finished stretches of spot capacity that earlier jobs in the same spot market saw in the
    # policy.HISTORY_H hours before it started, (available, seconds) each (control/deadline.spot_before).
    spot_before: tuple[tuple[bool, float], ...] = ()
    # Each zone's changes of capacity, where the provider says by zone: (zone, its (time, available) changes).
    zone_spot_seen: tuple[tuple[str, tuple[tuple[float, bool], ...]], ...] = ()
    # Instances the daemon drained before a hop (``DrainInstance``): (name, when their notice was written).
    drains: tuple[tuple[str, float], ...] = ()
    checkpoint_at: float | None = None  # the newest checkpoint the job reported (worker clock)
    markets: tuple[GpuMarket, ...] = ()  # policy.also_gpus
    # How many spot VMs could be had, where the provider counts them: (time, count) at each change recorded.
    spot_counts: tuple[tuple[float, int], ...] = ()
    # The elastic policy's newest choice, (time, spot, on-demand) workers (decide.deadline_elastic); None: none yet.
    elastic_choice: tuple[float, int, int] | None = None
    # torchft replica groups: what a change of membership costs the workers that stay (a quorum's pause; a joiner
    # still boots for ``overhead_s``); None: every change restarts the whole world (elastic torchrun).
    change_s: float | None = None


@dataclass(frozen=True)
class StageLossInputs:
    """What a pipeline job's lost stage is decided from (``decide.stage_loss_step``), besides the slots' prices and the
    deadline: the planned pipelines over the stages still in it and over each set of survivors (job clock)."""

    mode: str  # policy.stage_loss: auto | repartition (wait: no inputs, the replacement is always awaited)
    remaining_steps: float
    full_step_s: float  # the pipeline over every member stage
    survivor_step_s: tuple[tuple[str, float | None], ...]  # member slot -> step without it (None: nothing fits)
    replacement_s: float  # an on-demand replacement's boot and start-up
    spot_extra_s: float  # a spot replacement's extra boot
    restore_s: float  # every stage restores its checkpoint (the world re-forms)
    leave_s: float = 0.0  # a re-partition restarts once the lost VM is gone: its notice window
    objective: str = "cost"  # cost | time


@dataclass(frozen=True)
class InstanceView:
    id: int
    name: str
    role: Role
    index: int
    generation: int
    status: InstanceStatus
    spot: bool
    zone: str
    port: int | None
    requested_at: float
    updated_at: float  # when the status last changed
    revoked_at: float | None = None
    end_reason: str | None = None
    gpu: str | None = None  # as created: a spot worker moved by the deadline policy runs another type than planned

    @property
    def slot(self) -> str:
        return f"{self.role.value}-{self.index}"


@dataclass(frozen=True)
class JobView:
    id: str
    status: JobStatus
    outcome: str | None
    mode: TrainingMode
    slots: tuple[Slot, ...]
    instances: tuple[InstanceView, ...]
    on_revocation: OnRevocation
    max_replacements: int
    budget_usd: float | None
    deadline_s: float | None
    started_at: float | None
    restarts: int
    cost_usd: float
    cancel_requested: bool = False
    zones: tuple[str, ...] = ()  # allowed zones, in fallback order (cloud providers)
    stable_addresses: bool = True  # a replacement keeps its slot's address (local, a loopback Compute API)
    fatal_exits: int = 0  # task exits with the payload's "bad input" code so far (one retry, then FAILED)
    # PyTorch under torchrun: survivors re-form the world themselves (no whole-cluster restart on a lost
    # worker) and a ready replacement joins the running world at once. rdzv_slot hosts the rendezvous.
    elastic: bool = False
    rdzv_slot: str | None = None
    notice_s: float | None = None  # the VMs' preemption notice window (policy.notice_window_s); None: 30 s
    deadline_inputs: DeadlineInputs | None = None  # on_revocation: deadline
    stage_loss: StageLossInputs | None = None  # a pipeline job whose policy.stage_loss is not wait
    # Slots a pipeline was re-partitioned without (never replaced), and when that was decided.
    repartitioned: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Observation:
    instances: dict[str, ObservedInstance]  # this job's instances, by name
    procs: dict[str, ProcStatus]  # the task process on each instance that should run one, by instance name
    notices: frozenset[str] = frozenset()  # instance names with a preemption notice in storage
    result: dict[str, Any] | None = None  # result.json, once training ended
    failed_zones: dict[str, tuple[str, ...]] = field(default_factory=dict)  # slot -> zones without capacity
    payload_error: str | None = None  # result.json exists but cannot be used (untrusted payload output)
    spot_available: bool | None = None  # a spot VM can be had now (provider's capacity probe); None: unknown
    # ... in each zone the job may use, where the provider says by zone (GCE's advice); None: it does not say.
    spot_by_zone: dict[str, bool] | None = None
    spot_forecast: bool = False  # the probe forecasts (GCE's capacity advice): what the job's creates met overrules it
    spot_by_gpu: dict[str, bool] | None = None  # ... for each of policy.also_gpus the provider answered for
    spot_count: int | None = None  # how many of the job's spot VMs could be had, where the provider counts them
