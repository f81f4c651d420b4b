"""The inputs of ``on_revocation: deadline`` for one pass: the job's work and restart overhead (the
simulator's accounting of its planned cluster, computed once per spec), how much of the work is done
(the latest step), and the provider's spot capacity probe where it has one."""

from __future__ import annotations

from sqlalchemy.orm import Session

from orchestrator.core import policy
from orchestrator.core.revocation.availability import load_trace
from orchestrator.core.spec import JobSpec, OnRevocation
from orchestrator.core.state import DeadlineInputs
from orchestrator.providers.base import Provider, SupportsSpotCapacity
from orchestrator.sim.availability import DeadlineFigures, deadline_figures
from orchestrator.store import queries
from orchestrator.store.models import Job

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


def deadline_inputs(session: Session, job: Job, spec: JobSpec) -> DeadlineInputs | None:
    if spec.policy.on_revocation != OnRevocation.DEADLINE:
        return None
    fig, tick = _figures(job.spec_yaml, spec)
    step, _ = queries.latest_step(session, job.id)
    return DeadlineInputs(work_s=fig.work_s, done_s=fig.work_s * min(1.0, step / max(1, job.train_steps)),
                          overhead_s=fig.overhead_s, tick_s=tick, spot_usd_per_h=fig.spot_usd_per_h,
                          on_demand_usd_per_h=fig.on_demand_usd_per_h, time_scale=fig.time_scale)


def spot_available(provider: Provider, job_id: str) -> bool | None:
    return provider.spot_capacity(job_id) if isinstance(provider, SupportsSpotCapacity) else None
