"""Replay a finished job from the results DB: its observed revocations, boot delays and step rates.

``replay_job`` returns the simulated outcome next to the measured one, so the simulator can be
checked against reality (``orchestrator simulate --replay JOB_ID``).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.catalog import load_catalog
from orchestrator.errors import UserError
from orchestrator.sim.engine import RunResult, replay
from orchestrator.sim.from_spec import SimSpecError, cluster_from_spec
from orchestrator.spec import SpecError, validate_spec

REVOKED_REASONS = frozenset({"preempted", "lost"})


def _result_dict(r: RunResult) -> dict[str, Any]:
    return {
        "wall_time_s": r.wall_time_s,
        "cost_usd": r.cost_usd,
        "cost_by_role_usd": dict(r.cost_by_role),
        "revocations": r.revocations,
        "replacements": r.replacements,
        "steps_done": r.steps_done,
        "steps_lost": r.steps_lost,
        "finished": r.finished,
        "failure": r.failure,
    }


def replay_job(session: Session, job_id: str) -> dict[str, Any]:
    """Simulate job ``job_id`` (id or name) with what the DB recorded; returns measured vs simulated."""
    from orchestrator.store import queries
    from orchestrator.store.models import Metric

    job = queries.get_job(session, job_id)
    if job is None:
        raise UserError(f"no job '{job_id}' in the results DB", hint="see `orchestrator status`")
    try:
        spec = validate_spec(yaml.safe_load(job.spec_yaml), source=f"job {job.id}")
    except SpecError as exc:
        raise UserError(f"job {job.id}'s recorded spec no longer validates: {exc}") from None
    instances = queries.job_instances(session, job.id)
    if not instances:
        raise UserError(f"job {job.id} has no recorded instances; nothing to replay")
    t0 = min([i.requested_at for i in instances] + [job.created_at])

    schedule: list[tuple[str, float]] = []
    for inst in instances:
        revoked = inst.revoked_at is not None or (inst.end_reason or "") in REVOKED_REASONS
        if revoked:
            at = inst.revoked_at if inst.revoked_at is not None else inst.deleted_at
            if at is not None:
                schedule.append((inst.slot, at - t0))
    schedule.sort(key=lambda x: x[1])

    boots = [i.ready_at - i.requested_at for i in instances if i.ready_at is not None]
    facts = load_catalog().facts
    boot_delay = statistics.median(boots) if boots else facts.get("replacement_boot_delay", 70.0)

    times: dict[int, list[float]] = defaultdict(list)
    rows = session.execute(
        select(Metric.worker, Metric.step_time_s).where(
            Metric.job_id == job.id, Metric.kind == "worker", Metric.step_time_s.is_not(None)
        )
    ).all()
    for worker, step_time in rows:
        if worker is not None and worker >= 0 and step_time and step_time > 0:
            times[int(worker)].append(float(step_time))
    step_rates = {f"worker-{w}": 1.0 / statistics.fmean(v) for w, v in times.items()}

    try:
        cluster = cluster_from_spec(spec, price_book=job.price_book or None)
    except SimSpecError as exc:
        raise UserError(str(exc)) from None
    known = {s.name for s in cluster.slots}
    schedule = [(slot, at) for slot, at in schedule if slot in known]
    step_rates = {k: v for k, v in step_rates.items() if k in known}
    sim = replay(cluster, schedule, boot_delay_s=boot_delay, step_rates=step_rates or None)

    cost = queries.job_cost(session, job.id)
    measured: dict[str, Any] = {
        "wall_time_s": (job.ended_at - t0) if job.ended_at is not None else None,
        "cost_usd": cost.get("total", 0.0),
        "cost_by_role_usd": {
            "ps": cost.get("ps", 0.0),
            "chief": cost.get("chief", 0.0),
            "workers": cost.get("worker", cost.get("workers", 0.0)),
        },
        "revocations": len(schedule),
        "replacements": sum(1 for i in instances if i.generation > 0),
        "steps_done": job.final_step,
        "status": job.outcome or job.status,
    }
    return {
        "job_id": job.id,
        "spec": spec.name,
        "schedule": [{"slot": s, "at_s": at} for s, at in schedule],
        "boot_delay_s": boot_delay,
        "step_rates": step_rates,
        "measured": measured,
        "simulated": _result_dict(sim),
        "events": [{"t": e.t, "kind": e.kind, "slot": e.slot, "detail": e.detail} for e in sim.events],
    }
