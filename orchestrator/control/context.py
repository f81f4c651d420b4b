"""What one job's pass works with (``JobContext``), and the small helpers every part of dispatch shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from orchestrator.clock import Clock
from orchestrator.costmodel.slots import Slot
from orchestrator.model.instances import ObservedInstance
from orchestrator.model.spec import JobSpec
from orchestrator.model.status import JobStatus
from orchestrator.providers.registry import Backend
from orchestrator.storage.base import JobStorage
from orchestrator.store import queries
from orchestrator.store.models import Block, Instance, Job, Operation

TASK = "task"  # the process name of the training task on every instance


@dataclass
class JobContext:
    session: Session
    job: Job
    spec: JobSpec
    slots: list[Slot]
    backend: Backend
    storage: JobStorage
    observed: dict[str, ObservedInstance]
    emulation_sleep: Callable[[str | None, int], float]  # (gpu, batch) -> extra seconds per step (local)
    # Each instance's cloud operation under way (control/operations.py), by instance name: at most one.
    pending: dict[str, Operation] = field(default_factory=dict)
    # The provider's blocks as this pass read them, shared by its jobs (None: read them when needed).
    blocks: list[Block] | None = None
    # Creates and deletes this pass may still start for the provider's jobs, shared by them (None: no limit).
    starts: Budget | None = None

    @property
    def clock(self) -> Clock:
        """The pass's clock: its backend's (the session's, see control.driver.run_pass)."""
        return self.backend.clock


@dataclass
class Budget:
    """How many more cloud operations one pass may start: a burst (a hundred jobs launched or cancelled at
    once) is spread over passes, so no pass takes long, and the cloud's rate limits are not hit at once."""

    left: int

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


def instance_row(ctx: JobContext, name: str) -> Instance:
    inst = next((i for i in ctx.job.instances if i.name == name), None)
    if inst is None:
        raise LookupError(f"no instance {name} in job {ctx.job.id}")
    observed = ctx.observed.get(name)
    if observed is not None and observed.zone != inst.zone:
        # Created in a fallback zone by a pass that died before recording it: adopt the VM where it is,
        # or its delete would go to the wrong zone (not found there: "deleted") and leave it running.
        queries.note(ctx.session, ctx.job.id, "zone_fallback",
                     f"{name} found in {observed.zone}, recorded in {inst.zone}", instance_id=inst.id)
        inst.zone = observed.zone
    return inst


def fail_job(ctx: JobContext, reason: str) -> None:
    if ctx.job.status not in (JobStatus.TEARING_DOWN, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
        ctx.job.outcome = JobStatus.FAILED.value
        queries.switch_status(ctx.session, ctx.job, JobStatus.TEARING_DOWN, reason)
        ctx.session.commit()
