"""The controller's side of a pipeline's lost stage (``decide.stage_loss_step`` decides, purely): the inputs it
decides from, put in the job view each pass, and the slots a pipeline was re-partitioned without, read back from
the decisions recorded as events (``repartition`` notes on the lost instance)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.costmodel.accounting import run_accounting
from orchestrator.costmodel.pipeline_plan import plan_pipeline
from orchestrator.costmodel.slots import DEFAULT_BATCH, Slot
from orchestrator.costmodel.stage_loss import REPARTITION
from orchestrator.decide.state import StageLossInputs
from orchestrator.model import timings
from orchestrator.model.instances import Role
from orchestrator.model.spec import JobSpec
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.store import queries
from orchestrator.store.models import Event, Job

WAIT_EVENT = "stage_wait"  # the note a lost stage's "wait for the replacement" leaves
STAGE_LOSS_EVENTS = (REPARTITION, WAIT_EVENT)
_STEPS: dict[tuple[str, tuple[int, ...]], float | None] = {}  # (spec YAML, member slots) -> planned step (s)
_MAX_CACHED = 1024


def repartitioned(session: Session, job: Job) -> tuple[tuple[str, float], ...]:
    """(slot, when decided) of each stage the pipeline went on without."""
    by_id = {i.id: i for i in job.instances}
    rows = session.execute(select(Event.instance_id, Event.at).where(
        Event.job_id == job.id, Event.entity == "note", Event.to_status == REPARTITION)).all()
    out = {by_id[iid].slot: at for iid, at in rows if iid in by_id}
    return tuple(sorted(out.items()))


def dropped_slots(session: Session, job: Job) -> frozenset[str]:
    return frozenset(name for name, _ in repartitioned(session, job))


def record(session: Session, job: Job, instance: str, action: str, reason: str) -> None:
    inst = next((i for i in job.instances if i.name == instance), None)
    queries.note(session, job.id, REPARTITION if action == REPARTITION else WAIT_EVENT, reason,
                 instance_id=inst.id if inst is not None else None)
    session.commit()


def stage_loss_inputs(spec: JobSpec, spec_yaml: str, slots: list[Slot], dropped: frozenset[str],
                      step: int) -> StageLossInputs | None:
    """A pipeline job's, at training step ``step``; None where a lost stage always waits (``policy.stage_loss:
    wait``, or no partition fits the members)."""
    mode = spec.policy.stage_loss
    if mode == "wait":
        return None
    workers = [s for s in slots if s.role == Role.WORKER]
    members = [s for s in workers if s.name not in dropped]
    global_batch = sum(s.batch or DEFAULT_BATCH for s in workers)  # a re-partition keeps the global batch
    full = _step_s(spec, spec_yaml, members, global_batch)
    if full is None:
        return None
    # At least two stages stay: a one-stage "pipeline" is not what jobs/torchjob/pipe.py has been run as.
    survivors = tuple((s.name, _step_s(spec, spec_yaml, [m for m in members if m is not s], global_batch)
                      if len(members) > 2 else None) for s in members)
    acc = run_accounting(spec, steps=step_model_for(spec))
    restore = acc.startup_s + acc.checkpoint_s  # every stage starts again and loads its part of the checkpoint
    return StageLossInputs(
        mode=mode, remaining_steps=float(max(0, spec.training.train_steps - step)), full_step_s=full,
        survivor_step_s=survivors, replacement_s=acc.boot_s + acc.startup_s, spot_extra_s=acc.spot_extra_boot_s,
        restore_s=restore, leave_s=timings.notice_window_s(spec.provider) / spec.provider.time_scale,
        objective=spec.search.objective if spec.search is not None else "cost")


def _step_s(spec: JobSpec, spec_yaml: str, members: list[Slot], global_batch: int) -> float | None:
    """The partitioner's step over these workers (None: no partition fits their memory); planned once a set."""
    key = (spec_yaml, tuple(s.index for s in members))
    if key not in _STEPS:
        if len(_STEPS) >= _MAX_CACHED:
            _STEPS.clear()
        found = plan_pipeline(spec, [(s.index, s.gpu or "k80", s.machine_type) for s in members], global_batch,
                              steps=step_model_for(spec))
        _STEPS[key] = found.step_s if found is not None else None
    return _STEPS[key]
