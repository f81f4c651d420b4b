"""The only code that changes statuses, plus the ledger and the queries the CLI and the controller use."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, or_, select, text
from sqlalchemy.orm import Session, selectinload

from orchestrator.clock import WALL, Clock
from orchestrator.costmodel.compute import DEFAULT_RUNTIME, TORCHJOB_RUNTIME
from orchestrator.costmodel.launch_plan import LaunchPlan, plan_spec
from orchestrator.costmodel.profiles.user import TORCH_PREFIX
from orchestrator.costmodel.stepmodel import StepModel
from orchestrator.model.spec import JobSpec
from orchestrator.model.status import (
    INSTANCE_TRANSITIONS,
    JOB_TRANSITIONS,
    InstanceStatus,
    JobStatus,
    TransitionError,
)
from orchestrator.store.db import CLOCK
from orchestrator.store.models import (
    Block,
    Calibration,
    Event,
    Instance,
    Intent,
    Job,
    LedgerEntry,
    Metric,
    Operation,
    Plan,
)


def clock_of(session: Session) -> Clock:
    """The clock a session's writes are stamped with: the one it was opened with (store.db.open_session), else
    the wall clock."""
    clock = session.info.get(CLOCK)
    return clock if isinstance(clock, Clock) else WALL


def switch_status(
    session: Session,
    obj: Job | Instance,
    new: JobStatus | InstanceStatus,
    reason: str | None = None,
    *,
    now: float | None = None,
    billed_until: float | None = None,
) -> bool:
    """Change a job's or instance's status, check the transition table, write the event row.

    Returns False (and writes nothing) when the object already has that status, so that a
    reconcile pass repeated after a crash is harmless. ``billed_until``: for DELETED, when the provider
    itself ended the instance (its deletion or preemption time), so the controller's downtime is not billed.
    """
    now = clock_of(session).time() if now is None else now
    current = obj.status
    if current == new.value:
        return False
    if isinstance(obj, Job):
        allowed = JOB_TRANSITIONS[JobStatus(current)]
        if new not in allowed:
            raise TransitionError("job", obj.id, current, new.value)
        obj.status = new.value
        obj.status_reason = reason
        if new == JobStatus.PROVISIONING and obj.started_at is None:
            obj.started_at = now
        if new in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
            obj.ended_at = now
        session.add(Event(job_id=obj.id, entity="job", from_status=current, to_status=new.value,
                          reason=reason, at=now))
    else:
        allowed_i = INSTANCE_TRANSITIONS[InstanceStatus(current)]
        if new not in allowed_i:
            raise TransitionError("instance", obj.name, current, new.value)
        obj.status = new.value
        obj.status_reason = reason
        if new == InstanceStatus.READY and obj.ready_at is None:
            obj.ready_at = now
        elif new == InstanceStatus.TRAINING:
            obj.training_at = now
        elif new == InstanceStatus.REVOKED:
            obj.revoked_at = now
        elif new == InstanceStatus.DELETED:
            end = now if billed_until is None else max(obj.requested_at, min(now, billed_until))
            obj.deleted_at = end  # the provider's time where it told us, so the record and the bill agree
            _close_ledger(session, obj, end)
        session.add(Event(job_id=obj.job_id, instance_id=obj.id, entity="instance", from_status=current,
                          to_status=new.value, reason=reason, at=now))
    obj.updated_at = now
    return True


def note(session: Session, job_id: str, what: str, reason: str, *, instance_id: int | None = None,
         now: float | None = None) -> None:
    """An event that is not a status change (a stockout skipped, a notice delivered, a checkpoint)."""
    session.add(Event(job_id=job_id, instance_id=instance_id, entity="note", from_status=None, to_status=what,
                      reason=reason, at=clock_of(session).time() if now is None else now))


def _close_ledger(session: Session, inst: Instance, end_at: float) -> None:
    """Billing runs from the create's send (``requested_at``: the provider's own creation time where it reports
    one) to the confirmed deletion (the provider's own end where it reports one), at the hourly price."""
    if inst.end_reason == "create_failed":
        end_at = inst.requested_at  # the cloud refused the create: nothing ran, nothing is billed
    with session.no_autoflush:  # the row's own changes are flushed with it, at the caller's commit
        existing = session.scalar(select(LedgerEntry).where(LedgerEntry.instance_id == inst.id))
    if existing is not None:
        return
    seconds = max(0.0, end_at - inst.requested_at)
    session.add(
        LedgerEntry(
            job_id=inst.job_id, instance_id=inst.id, role=inst.role, start_at=inst.requested_at, end_at=end_at,
            seconds=seconds, price_per_hour=inst.price_per_hour, usd=seconds * inst.price_per_hour / 3600.0,
        )
    )


# ---------------------------------------------------------------- jobs and instances


def get_job(session: Session, job_ref: str) -> Job | None:
    """By id, or the newest job with that name."""
    job = session.get(Job, job_ref)
    if job is not None:
        return job
    return session.scalar(select(Job).where(Job.name == job_ref).order_by(Job.created_at.desc()).limit(1))


def jobs(session: Session, statuses: Sequence[str] | None = None) -> list[Job]:
    q = select(Job).order_by(Job.created_at)
    if statuses is not None:
        q = q.where(Job.status.in_(list(statuses)))
    return list(session.scalars(q))


def job_instances(session: Session, job_id: str) -> list[Instance]:
    return list(session.scalars(select(Instance).where(Instance.job_id == job_id).order_by(Instance.id)))


# SQLite's "now" in the instance_costs view is whole seconds (strftime('%s')), so an instance requested in the
# current second is costed at up to -1 s: each instance's open cost counts from zero, never below.
_BILLED = "COALESCE(SUM(CASE WHEN usd > 0 THEN usd ELSE 0 END), 0)"
# The instance_costs view's usd, open entries costed to the session's clock (the view's "now" is the database's own
# clock): what the controller decides with (budgets) runs on its clock, a virtual one included.
_COSTS = ("SELECT i.job_id, i.role, COALESCE(l.usd, (:now - i.requested_at) * i.price_per_hour / 3600.0) AS usd "
          "FROM instances i LEFT JOIN ledger l ON l.instance_id = i.id WHERE i.status <> 'failed' OR l.id IS NOT NULL")
_NOT_NEGATIVE = ("cost_usd", "worker_cost_usd", "ps_cost_usd", "chief_cost_usd", "wall_time_s")


def job_cost(session: Session, job_id: str) -> dict[str, float]:
    """USD by role, open entries costed to now (the same figures as the ``instance_costs`` view)."""
    rows = session.execute(text(f"SELECT role, {_BILLED} FROM ({_COSTS}) c WHERE job_id = :j GROUP BY role"),
                           {"j": job_id, "now": clock_of(session).time()}).all()
    out = {str(r[0]): float(r[1]) for r in rows}
    out["total"] = sum(out.values())
    return out


def job_summaries(session: Session, job_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    sql = "SELECT * FROM job_summary"
    params: dict[str, Any] = {}
    if job_ids:
        sql += " WHERE job_id IN (" + ", ".join(f":j{i}" for i in range(len(job_ids))) + ")"
        params = {f"j{i}": j for i, j in enumerate(job_ids)}
    sql += " ORDER BY created_at"
    rows = [dict(r._mapping) for r in session.execute(text(sql), params)]
    for row in rows:  # an instance requested within the view's whole-second "now" costs nothing yet, not < 0
        for key in _NOT_NEGATIVE:
            if row.get(key) is not None and row[key] < 0:
                row[key] = 0.0
    return rows


def outcome_reason(session: Session, job_id: str) -> str | None:
    """Why the job ended as it did: the reason it was sent to tear down (a job's last transition only says
    "every instance deleted"); None before that."""
    return session.scalar(select(Event.reason).where(Event.job_id == job_id, Event.entity == "job",
                                                     Event.to_status == "tearing_down")
                          .order_by(Event.at.desc(), Event.id.desc()).limit(1))


def events(session: Session, job_id: str) -> list[Event]:
    return list(session.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.at, Event.id)))


# ---------------------------------------------------------------- capacity blocks


def add_block(session: Session, provider: str, scope: str, location: str, resource: str, reason: str,
              ttl_s: float, *, now: float | None = None) -> Block:
    """Remember that the provider said no here (zone stockout, region or global quota) until it expires."""
    now = clock_of(session).time() if now is None else now
    block = Block(provider=provider[:200], scope=scope, location=location[:64], resource=resource[:64],
                  reason=reason[:500], created_at=now, expires_at=now + ttl_s)
    session.add(block)
    return block


def active_blocks(session: Session, provider: str, now: float | None = None) -> list[Block]:
    now = clock_of(session).time() if now is None else now
    return list(session.scalars(select(Block).where(Block.provider == provider[:200], Block.expires_at > now)
                                .order_by(Block.created_at)))


# ---------------------------------------------------------------- cloud operations under way

OP_PENDING = "pending"
OP_DONE, OP_FAILED, OP_TIMED_OUT = "done", "failed", "timed_out"


def close_operation(op: Operation, status: str, error: str | None, ended_at: float | None) -> None:
    """An operation no pass follows any more: how it ended, and when (the provider's time where known)."""
    op.status = status
    op.error = error[:500] if error else None
    op.ended_at = ended_at


def pending_operations(session: Session, job_ids: Sequence[str]) -> dict[str, list[tuple[str, Operation]]]:
    """Each job's operations still under way, oldest first, with their instance's name (one query)."""
    rows = session.execute(select(Instance.name, Operation).join(Instance, Instance.id == Operation.instance_id)
                           .where(Operation.job_id.in_(list(job_ids)), Operation.status == OP_PENDING)
                           .order_by(Operation.id)).all()
    out: dict[str, list[tuple[str, Operation]]] = {j: [] for j in job_ids}
    for name, op in rows:
        out.setdefault(op.job_id, []).append((str(name), op))
    return out


def jobs_with_instances(session: Session, job_ids: Sequence[str]) -> dict[str, Job]:
    """The jobs as the DB has them now, each with its instances loaded (two queries for them all)."""
    q = (select(Job).where(Job.id.in_(list(job_ids))).options(selectinload(Job.instances))
         .execution_options(populate_existing=True))  # objects kept in the session are read afresh too
    return {job.id: job for job in session.scalars(q)}


def job_costs(session: Session, job_ids: Sequence[str]) -> dict[str, float]:
    """Each job's total cost so far (``job_cost(...)["total"]`` for many jobs in one query)."""
    if not job_ids:
        return {}
    marks = ", ".join(f":j{i}" for i in range(len(job_ids)))
    rows = session.execute(text(f"SELECT job_id, {_BILLED} FROM ({_COSTS}) c WHERE job_id IN ({marks}) "
                                "GROUP BY job_id"),
                           {"now": clock_of(session).time(), **{f"j{i}": j for i, j in enumerate(job_ids)}}).all()
    costs = {j: 0.0 for j in job_ids}
    costs.update({str(r[0]): float(r[1]) for r in rows})
    return costs


def latest_plans(session: Session, job_ids: Sequence[str]) -> dict[str, LaunchPlan]:
    """Each job's plan in force (``stored_intent`` for many jobs in one query); jobs without one are left out."""
    latest = (select(Intent.job_id, func.max(Intent.revision).label("revision"))
              .where(Intent.job_id.in_(list(job_ids))).group_by(Intent.job_id).subquery())
    rows = session.execute(select(Intent.job_id, Intent.plan).join(
        latest, (Intent.job_id == latest.c.job_id) & (Intent.revision == latest.c.revision))).all()
    return {str(job_id): _parse_plan(plan) for job_id, plan in rows}


def instance_by_name(session: Session, name: str) -> Instance | None:
    return session.scalar(select(Instance).where(Instance.name == name))


# ---------------------------------------------------------------- metrics


def add_metrics(session: Session, rows: Sequence[Metric]) -> None:
    session.add_all(rows)


def latest_step(session: Session, job_id: str) -> tuple[int, float | None]:
    row = session.execute(
        select(Metric.step, Metric.examples_per_s)
        .where(Metric.job_id == job_id, Metric.kind == "step", Metric.worker == -1)
        .order_by(Metric.at.desc())
        .limit(1)
    ).first()
    return (int(row[0]), row[1]) if row else (0, None)


def latest_worker_rates(session: Session, job_id: str) -> dict[int, float]:
    """Each worker slot's examples/s in its most recent metrics window."""
    newest = (select(Metric.worker, func.max(Metric.at).label("at"))
              .where(Metric.job_id == job_id, Metric.kind == "worker").group_by(Metric.worker).subquery())
    rows = session.execute(
        select(Metric.worker, Metric.examples_per_s).join(
            newest, (Metric.worker == newest.c.worker) & (Metric.at == newest.c.at))
        .where(Metric.job_id == job_id, Metric.kind == "worker")
    ).all()
    return {int(w): float(e or 0.0) for w, e in rows}


def step_time_measurements(session: Session, job_ids: list[str] | None = None,
                           running: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Measured per-worker step times of finished jobs (and of the ``running`` ones so far), labelled as the workers
    reported them: rows with model, gpu, batch (the batch each GPU ran: a multi-GPU node's over its GPUs), runtime,
    precision, step_time_s (its own compute per step where it timed it alone: in synchronous training the window's
    step time is the slowest rank's), emulated.

    A job whose workers reported more than one runtime / precision label, or none that the payload implies, is
    left out and named in a row of its own (``refused``): its points cannot be fitted under one label."""
    q = (select(Job.id, Job.spec_yaml, Metric.gpu, Metric.batch, Metric.gpus, Metric.runtime, Metric.precision,
                func.avg(func.coalesce(Metric.compute_s, Metric.step_time_s)), func.count())
         .join(Job, Job.id == Metric.job_id)
         .where(Metric.kind == "worker", Metric.step_time_s.is_not(None), Metric.gpu.is_not(None),
                or_(Job.status == "succeeded", Job.id.in_(list(running))))
         .group_by(Job.id, Job.spec_yaml, Metric.gpu, Metric.batch, Metric.gpus, Metric.runtime, Metric.precision))
    if job_ids is not None:
        q = q.where(Job.id.in_(job_ids))
    by_job: dict[str, list[dict[str, Any]]] = {}
    for job_id, spec_yaml, gpu, batch, gpus, runtime, precision, step_time, n in session.execute(q).all():
        doc = _spec_doc(spec_yaml)
        label = runtime or _implied_runtime(doc)
        # A multi-GPU node's ranks each ran an even share of its batch, all in the step's time.
        per_gpu = batch if batch is None or not gpus or gpus <= 1 else max(1, round(batch / gpus))
        by_job.setdefault(job_id, []).append({
            "job_id": job_id, "model": _model_name(doc), "gpu": gpu, "batch": per_gpu, "step_time_s": float(step_time),
            "samples": int(n), "emulated": int(((doc.get("provider") or {}).get("kind") or "local") == "local"),
            "runtime": label, "precision": precision or "fp32", "source": f"results DB (job {job_id})"})
    out: list[dict[str, Any]] = []
    for job_id, rows in by_job.items():
        labels = {(r["runtime"], r["precision"]) for r in rows}
        if len(labels) != 1 or None in {r["runtime"] for r in rows}:
            out.append({"job_id": job_id, "refused": "its workers reported "
                        + (", ".join(sorted(f"{a}/{b}" for a, b in labels if a)) or "no runtime label")
                        + ": one job is fitted under one runtime x precision"})
            continue
        out += rows
    return out


def _spec_doc(spec_yaml: str) -> dict[str, Any]:
    import yaml  # local: only these queries need the spec

    try:
        doc = yaml.safe_load(spec_yaml) or {}
    except yaml.YAMLError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _model_name(doc: dict[str, Any]) -> str:
    training = doc.get("training") or {}
    model = training.get("model")
    if isinstance(model, dict) and isinstance(model.get("torch"), str):
        return f"{TORCH_PREFIX}{model['torch']}"  # the user's own model, as the cost model names its profile
    return str(training.get("hparam_set", "resnet_cifar_32"))


def _implied_runtime(doc: dict[str, Any]) -> str | None:
    """Rows logged before workers reported their runtime: the built-in payloads have one each; a user's own
    `run:` script has none that can be assumed."""
    training = doc.get("training") or {}
    if training.get("job") in ("run", "command") or "run" in training:
        return None
    return TORCHJOB_RUNTIME if training.get("framework") == "pytorch" else DEFAULT_RUNTIME


# ---------------------------------------------------------------- plans and calibrations


def save_plan(session: Session, spec_name: str, chosen: dict[str, Any], candidates: list[dict[str, Any]],
              job_id: str | None = None) -> int:
    plan = Plan(job_id=job_id, spec_name=spec_name, chosen=json.dumps(chosen), candidates=json.dumps(candidates),
                created_at=clock_of(session).time())
    session.add(plan)
    session.flush()
    return plan.id


def planned_worker_groups(session: Session, job_id: str) -> list[dict[str, Any]]:
    """The worker groups of the plan stored with the job at launch (``worker_groups`` of its newest Plan row:
    planning.step_sources.StepSource's dicts, each group's step and interval); [] when none was stored."""
    text_ = session.scalar(select(Plan.chosen).where(Plan.job_id == job_id).order_by(Plan.id.desc()).limit(1))
    try:
        groups = json.loads(text_ or "{}").get("worker_groups") or []
    except (ValueError, AttributeError):
        return []
    return [g for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []


def save_intent(session: Session, job_id: str, plan: LaunchPlan, now: float | None = None) -> int:
    """Record ``plan`` as the job's desired state: the next revision, in force from now on (flushed)."""
    last = session.scalar(select(func.max(Intent.revision)).where(Intent.job_id == job_id)) or 0
    row = Intent(job_id=job_id, revision=last + 1, version=plan.version, plan=plan.to_json(),
                 created_at=clock_of(session).time() if now is None else now)
    session.add(row)
    session.flush()
    return row.revision


def stored_intent(session: Session, job_id: str) -> LaunchPlan | None:
    """The job's plan in force (its latest revision); None for a job recorded before plans were stored."""
    text_ = session.scalar(select(Intent.plan).where(Intent.job_id == job_id).order_by(Intent.revision.desc())
                           .limit(1))
    return None if text_ is None else _parse_plan(text_)


@functools.lru_cache(maxsize=512)
def _parse_plan(text_: str) -> LaunchPlan:
    return LaunchPlan.from_json(text_)  # frozen: one parse per stored plan, shared by every pass


def job_plan(session: Session, job: Job, spec: JobSpec, steps: StepModel | None = None) -> LaunchPlan:
    """The desired state a pass drives toward: the plan stored at launch. A job recorded before plans were
    stored (migration 0003) is planned once, with its recorded price book and ``steps`` (the job's step model, as
    the controller chose it), and that plan is stored."""
    found = stored_intent(session, job.id)
    if found is not None:
        return found
    plan = plan_spec(spec, book=job.price_book, steps=steps)
    save_intent(session, job.id, plan)
    session.commit()
    return plan


def save_calibration(session: Session, name: str, source: str, params: dict[str, Any], mape: float | None) -> int:
    row = Calibration(name=name, source=source, params=json.dumps(params), mape=mape,
                      created_at=clock_of(session).time())
    session.add(row)
    session.flush()
    return row.id


def replace_calibration(session: Session, name: str, source: str, params: dict[str, Any]) -> int:
    """Store a calibration as the one row of ``source`` (a running job's own fold: each fold replaces its last),
    stamped now: the newest, as a new row would be."""
    row = session.scalar(select(Calibration).where(Calibration.source == source).order_by(Calibration.id).limit(1))
    if row is None:
        return save_calibration(session, name, source, params, None)
    row.name, row.params, row.created_at = name, json.dumps(params), clock_of(session).time()
    session.flush()
    return row.id


def drop_calibrations(session: Session, source: str) -> None:
    session.execute(delete(Calibration).where(Calibration.source == source))


def load_calibration(session: Session, calibration_id: int) -> dict[str, Any]:
    row = session.get(Calibration, calibration_id)
    if row is None:
        raise LookupError(f"no calibration with id {calibration_id}; see `orchestrator model calibrate`")
    params: dict[str, Any] = json.loads(row.params)
    return params


def local_run_timings(session: Session) -> list[dict[str, Any]]:
    """Finished local-provider jobs: spec, created / first step / last step / ended times, and each worker's
    mean steady step time (after step 100) with its GPU and batch (the cost model's local host fit)."""
    out = []
    jobs = session.execute(select(Job).where(Job.provider == "local", Job.status == "succeeded")).scalars()
    for job in jobs:
        steps = session.execute(select(func.min(Metric.at), func.max(Metric.at)).where(
            Metric.job_id == job.id, Metric.kind == "step")).one()
        workers = session.execute(
            select(Metric.worker, Metric.gpu, Metric.batch, func.avg(Metric.step_time_s))
            .where(Metric.job_id == job.id, Metric.kind == "worker", Metric.step > 100,
                   Metric.step_time_s.is_not(None))
            .group_by(Metric.worker, Metric.gpu, Metric.batch)).all()
        if steps[0] is None or job.ended_at is None or not workers:
            continue
        out.append({"spec_yaml": job.spec_yaml, "created_at": job.created_at, "first_step_at": float(steps[0]),
                    "last_step_at": float(steps[1]), "ended_at": job.ended_at,
                    "workers": [{"gpu": g, "batch": int(b or 0), "step_time_s": float(t)} for _, g, b, t in workers]})
    return out
