"""The inputs of ``on_revocation: deadline`` for one pass: the job's work and restart overhead (the
simulator's accounting of its planned cluster, computed once per spec), how much of the work is done
(the latest step), the restarts it has measured, the instances drained before a hop and the newest checkpoint,
and the provider's spot capacity probe where it has one."""

from __future__ import annotations

import bisect

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.core import policy
from orchestrator.core.revocation.availability import load_trace
from orchestrator.core.spec import JobSpec, OnRevocation
from orchestrator.core.state import DeadlineInputs
from orchestrator.core.status import EndReason
from orchestrator.providers.base import Provider, SupportsSpotCapacity
from orchestrator.sim.availability import DeadlineFigures, deadline_figures
from orchestrator.store import queries
from orchestrator.store.models import Event, Instance, Job, Metric

_FIGURES: dict[str, tuple[DeadlineFigures, float]] = {}  # spec YAML -> figures, decision tick (s)
_MAX_CACHED = 256


def _figures(spec_yaml: str, spec: JobSpec) -> tuple[DeadlineFigures, float]:
    found = _FIGURES.get(spec_yaml)
    if found is None:
        fig = deadline_figures(spec)
        local = spec.provider.as_local()
        if local is not None and local.availability_trace is not None:
            tick = load_trace(local.availability_trace).gap_s / local.time_scale  # the replayed trace's pace
        else:
            tick = policy.DEADLINE_TICK_S / fig.time_scale
        if len(_FIGURES) >= _MAX_CACHED:
            _FIGURES.clear()
        found = _FIGURES[spec_yaml] = (fig, tick)
    return found


def measured_overhead_s(session: Session, job: Job, now: float) -> float:
    """The longest restart this job has seen: from an instance's request to the first training step after it
    (an instance still starting counts its time so far). A loaded host or a slow image makes restarts dearer
    than the plan says; the policy then keeps more slack for them."""
    steps = sorted(session.scalars(select(Metric.at).where(
        Metric.job_id == job.id, Metric.kind == "step", Metric.worker == -1)))
    worst = 0.0
    for inst in job.instances:
        if inst.end_reason == EndReason.CREATE_FAILED.value:
            continue
        k = bisect.bisect_right(steps, inst.requested_at)
        ended = inst.revoked_at or inst.deleted_at
        if k < len(steps) and (ended is None or steps[k] <= ended):
            worst = max(worst, steps[k] - inst.requested_at)
        elif ended is None:
            worst = max(worst, now - inst.requested_at)
    return worst


def deadline_inputs(session: Session, job: Job, spec: JobSpec, now: float) -> DeadlineInputs | None:
    if spec.policy.on_revocation != OnRevocation.DEADLINE:
        return None
    fig, tick = _figures(job.spec_yaml, spec)
    step, _ = queries.latest_step(session, job.id)
    overhead = max(fig.overhead_s, measured_overhead_s(session, job, now))
    return DeadlineInputs(work_s=fig.work_s, done_s=fig.work_s * min(1.0, step / max(1, job.train_steps)),
                          overhead_s=overhead, tick_s=tick, spot_usd_per_h=fig.spot_usd_per_h,
                          on_demand_usd_per_h=fig.on_demand_usd_per_h, time_scale=fig.time_scale,
                          spot_seen=spot_seen(session, job.id), drains=drains(session, job.id),
                          checkpoint_at=session.scalar(select(func.max(Metric.at)).where(
                              Metric.job_id == job.id, Metric.kind == "checkpoint")))


def spot_seen(session: Session, job_id: str) -> tuple[tuple[float, bool], ...]:
    """The changes of spot capacity the daemon recorded for the job (``RecordSpotAvailability``), oldest first."""
    kinds = {v: k for k, v in policy.SPOT_SEEN_EVENTS.items()}
    rows = session.execute(select(Event.at, Event.to_status).where(
        Event.job_id == job_id, Event.entity == "note", Event.to_status.in_(list(kinds))).order_by(Event.at, Event.id))
    return tuple((float(at), kinds[what]) for at, what in rows)


def drains(session: Session, job_id: str) -> tuple[tuple[str, float], ...]:
    """The instances drained before a hop (``DrainInstance``), and when: the first drain of each counts."""
    rows = session.execute(select(Instance.name, func.min(Event.at)).join(Instance, Event.instance_id == Instance.id)
                           .where(Event.job_id == job_id, Event.entity == "note",
                                  Event.to_status == policy.DRAIN_EVENT).group_by(Instance.name))
    return tuple((str(name), float(at)) for name, at in rows)


def spot_available(provider: Provider, job_id: str) -> bool | None:
    return provider.spot_capacity(job_id) if isinstance(provider, SupportsSpotCapacity) else None
