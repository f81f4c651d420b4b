"""Actions the reconciler asks for; the executor carries them out."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.costmodel.slots import Slot
from orchestrator.model.status import EndReason, InstanceStatus, JobStatus


@dataclass(frozen=True)
class CreateInstance:
    slot: Slot
    generation: int
    spot: bool
    zones: tuple[str, ...]  # try in order; a stockout moves on to the next
    port: int | None
    reason: str


@dataclass(frozen=True)
class SetInstanceStatus:
    name: str
    status: InstanceStatus
    reason: str
    end_reason: EndReason | None = None


@dataclass(frozen=True)
class PrepareInstance:
    """Push the job files; then the instance is READY."""

    name: str


@dataclass(frozen=True)
class StartTask:
    name: str
    reason: str


@dataclass(frozen=True)
class DeleteInstance:
    name: str
    zone: str
    reason: str
    end_reason: EndReason | None = None


@dataclass(frozen=True)
class DrainInstance:
    """Write the instance's notice so that its training checkpoints, as on a preemption notice: a deliberate
    hop (``on_revocation: deadline``) then deletes it without losing the steps since the last checkpoint."""

    name: str
    reason: str


@dataclass(frozen=True)
class RestartTraining:
    """Stop every task; they start again (the chief resumes from the latest checkpoint)."""

    reason: str
    fatal: bool = False  # a task exited with the payload's fatal code: counted, one retry only


@dataclass(frozen=True)
class RecordLogTail:
    """Keep the last lines of an instance's task log as an event (why a job failed)."""

    name: str
    reason: str


@dataclass(frozen=True)
class RecordStageLoss:
    """A pipeline lost a stage: what was decided (wait | repartition), with both options' predicted time and cost.
    A ``repartition`` record is also the decision itself: later passes leave that slot empty."""

    name: str  # the lost instance
    action: str
    reason: str


@dataclass(frozen=True)
class RecordSpotAvailability:
    """The deadline policy saw spot capacity change (or saw it for the first time): what it learns from."""

    available: bool
    reason: str
    zone: str | None = None  # one zone's capacity (the provider says by zone); None: spot in any zone the job may use


@dataclass(frozen=True)
class RecordSpotCount:
    """The deadline policy saw how many spot VMs can be had change (where the provider counts them)."""

    count: int
    reason: str


@dataclass(frozen=True)
class RecordElasticChoice:
    """The elastic deadline policy changed how many spot and on-demand workers the job runs (deadline_elastic):
    the daemon holds a choice until the next tick, as the simulator decides once a tick."""

    spot: int
    on_demand: int
    reason: str


@dataclass(frozen=True)
class SetJobStatus:
    status: JobStatus
    reason: str
    outcome: JobStatus | None = None


Action = (CreateInstance | SetInstanceStatus | PrepareInstance | StartTask | DeleteInstance | RestartTraining
          | SetJobStatus | RecordLogTail | RecordStageLoss | RecordSpotAvailability | RecordSpotCount
          | RecordElasticChoice | DrainInstance)
