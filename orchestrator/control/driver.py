"""One reconcile pass over the jobs a driver owns: observe, ingest metrics, reconcile, execute.

The daemon and the foreground `launch` both call ``run_pass``; a lease on each job makes sure only one
of them drives it, and an expired lease (a killed driver) lets the other take over.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import yaml
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from orchestrator.control.backends import Backend, backend_for
from orchestrator.control.execute import TASK, JobContext, execute
from orchestrator.control.reconcile import reconcile
from orchestrator.control.state import InstanceView, JobView, Observation
from orchestrator.providers.base import ObservedInstance, ProviderError, Role
from orchestrator.slots import EMULATED_BATCH, EMULATED_MODEL, Slot, emulation_reference_batch, expand
from orchestrator.spec import JobSpec, LocalProvider, validate_spec
from orchestrator.storage import JobStorage, open_storage
from orchestrator.storage.base import METRICS, RESULT
from orchestrator.store import queries
from orchestrator.store.models import Job, Metric
from orchestrator.store.status import ACTIVE_JOB, InstanceStatus, JobStatus
from orchestrator.transport.base import ProcStatus

log = logging.getLogger(__name__)
LEASE_S = 20.0


@functools.lru_cache(maxsize=512)
def job_spec(spec_yaml: str) -> JobSpec:
    return validate_spec(yaml.safe_load(spec_yaml))


def spec_to_yaml(spec: JobSpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False)


def claim(session: Session, owner: str, job_ids: Sequence[str] | None, now: float) -> list[Job]:
    """Active jobs this owner may drive now (its own lease, or none / an expired one), leased for LEASE_S."""
    q = select(Job).where(Job.status.in_([s.value for s in ACTIVE_JOB]))
    if job_ids is not None:
        q = q.where(Job.id.in_(list(job_ids)))
    q = q.where(or_(Job.lease_owner.is_(None), Job.lease_owner == owner, Job.lease_until < now))
    jobs = list(session.scalars(q.order_by(Job.created_at)))
    for job in jobs:
        if job.lease_owner != owner:
            queries.note(session, job.id, "driver", f"{owner} drives this job (previous: {job.lease_owner})", now=now)
        job.lease_owner = owner
        job.lease_until = now + LEASE_S
    session.commit()
    return jobs


def release(session: Session, owner: str, job_ids: Sequence[str]) -> None:
    for job_id in job_ids:
        job = session.get(Job, job_id)
        if job is not None and job.lease_owner == owner:
            job.lease_owner = None
            job.lease_until = None
    session.commit()


def run_pass(session: Session, owner: str, job_ids: Sequence[str] | None = None) -> list[str]:
    """Drive every job this owner may drive; returns their ids."""
    now = time.time()
    jobs = claim(session, owner, job_ids, now)
    groups: dict[str, tuple[Backend, list[Job]]] = {}
    for job in jobs:
        backend = backend_for(job_spec(job.spec_yaml))
        groups.setdefault(backend.key, (backend, []))[1].append(job)
    for backend, group in groups.values():
        try:
            observed_all = backend.provider.list([j.id for j in group])  # one call for every job it drives
        except ProviderError as exc:
            for job in group:
                queries.note(session, job.id, "provider_error", f"list failed: {exc.message}")
            session.commit()
            continue
        by_job: dict[str, dict[str, ObservedInstance]] = defaultdict(dict)
        for o in observed_all:
            by_job[o.job_id][o.name] = o
        for job in group:
            try:
                drive(session, job, backend, by_job.get(job.id, {}))
            except Exception:
                session.rollback()
                log.exception("pass over job %s failed; the next pass tries again", job.id)
    return [j.id for j in jobs]


def drive(session: Session, job: Job, backend: Backend, observed: dict[str, ObservedInstance]) -> None:
    spec = job_spec(job.spec_yaml)
    slots = expand(spec, book=job.price_book)
    storage = open_storage(job.storage_uri, job.id)
    ingest_metrics(session, job, storage, slots)
    result_text = storage.read_text(RESULT)
    result = json.loads(result_text) if result_text else None
    if result is not None and job.accuracy is None:
        job.accuracy = result.get("accuracy")
        job.final_step = result.get("step")
        job.final_loss = result.get("loss")
    session.commit()
    procs = observe_tasks(job, backend, observed)
    now = time.time()
    view = job_view(session, job, spec, slots, now, backend.stable_addresses)
    obs = Observation(instances=observed, procs=procs, notices=frozenset(storage.notices()), result=result)
    actions = reconcile(view, obs, now)
    if actions:
        log.debug("job %s: %s", job.id, actions)
    ctx = JobContext(session, job, spec, slots, backend, storage, observed, emulation(spec))
    execute(ctx, actions)


def observe_tasks(job: Job, backend: Backend, observed: dict[str, ObservedInstance]) -> dict[str, ProcStatus]:
    out: dict[str, ProcStatus] = {}
    for inst in job.instances:
        if inst.status == InstanceStatus.TRAINING.value and inst.name in observed:
            try:
                out[inst.name] = backend.transport.status(backend.endpoint(observed[inst.name]), [TASK])[TASK]
            except Exception as exc:  # an unreachable host is judged by the provider's view, not here
                log.info("cannot read task status on %s: %s", inst.name, exc)
    return out


def job_view(session: Session, job: Job, spec: JobSpec, slots: list[Slot], now: float,
             stable_addresses: bool = True) -> JobView:
    cost = queries.job_cost(session, job.id)["total"]
    instances = tuple(
        InstanceView(id=i.id, name=i.name, role=Role(i.role), index=i.slot_index, generation=i.generation,
                     status=InstanceStatus(i.status), spot=i.spot, zone=i.zone, port=i.port,
                     requested_at=i.requested_at, updated_at=i.updated_at, revoked_at=i.revoked_at,
                     end_reason=i.end_reason)
        for i in job.instances
    )
    zones = tuple(getattr(spec.provider, "zones", ()) or ())
    return JobView(id=job.id, status=JobStatus(job.status), outcome=job.outcome, mode=spec.mode, slots=tuple(slots),
                   instances=instances, on_revocation=spec.policy.on_revocation,
                   max_replacements=spec.policy.max_replacements, budget_usd=job.budget_usd,
                   deadline_s=job.deadline_s, started_at=job.started_at, restarts=job.restarts, cost_usd=cost,
                   cancel_requested=job.cancel_requested, zones=zones, stable_addresses=stable_addresses)




def emulation(spec: JobSpec) -> Callable[[str | None, int], float]:
    """(gpu, batch) -> extra seconds per step on a local worker.

    A local worker at batch b stands for the 2019 study's workload (ResNet-32) at batch 128·b/reference on
    its GPU: it sleeps ``k80_s × T(gpu, 128·b/ref) / T(k80, 128)``, with T the cost model's step time
    from the catalog's specs. So an emulated V100 is as much faster than a K80 as the model says (3.0x at
    batch 128), and step time follows the model's curve in the batch (fixed overhead + per-example work),
    which is what lets the cost model be calibrated on, and split batches for, emulated GPUs.
    """
    provider = spec.provider
    if not isinstance(provider, LocalProvider) or provider.emulation_k80_step_s == 0:
        return lambda gpu, batch: 0.0
    reference_batch = emulation_reference_batch(spec)
    k80_s = provider.emulation_k80_step_s

    def sleep_s(gpu: str | None, batch: int) -> float:
        if gpu is None:
            return 0.0
        from orchestrator.costmodel import predict_step_time

        emulated_batch = max(1, round(EMULATED_BATCH * batch / reference_batch))
        ratio = predict_step_time(EMULATED_MODEL, gpu, emulated_batch) / predict_step_time(
            EMULATED_MODEL, "k80", EMULATED_BATCH)
        return round(k80_s * ratio, 4)

    return sleep_s


def ingest_metrics(session: Session, job: Job, storage: JobStorage, slots: list[Slot]) -> None:
    """Append the chief's new metrics lines to the DB; the byte offset moves in the same transaction."""
    data = storage.read_from(METRICS, job.metrics_offset)
    end = data.rfind(b"\n")
    if end < 0:
        return
    workers = {s.index: s for s in slots if s.role == Role.WORKER}
    rows: list[Metric] = []
    for line in data[: end + 1].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        kind, step, at = rec.get("kind"), int(rec.get("step", 0)), float(rec.get("t", time.time()))
        if kind == "step":
            rows.append(Metric(job_id=job.id, kind="step", worker=-1, step=step, loss=rec.get("loss"),
                               examples_per_s=rec.get("examples_per_s"), at=at))
            for key, w in (rec.get("workers") or {}).items():
                slot = workers.get(int(key))
                rows.append(Metric(job_id=job.id, kind="worker", worker=int(key), gpu=slot.gpu if slot else None,
                                   batch=slot.batch if slot else None, step=step,
                                   examples_per_s=w.get("examples_per_s"), step_time_s=w.get("step_time_s"), at=at))
            job.final_step = max(job.final_step or 0, step)
        elif kind == "eval":
            rows.append(Metric(job_id=job.id, kind="eval", worker=-1, step=step, loss=rec.get("loss"),
                               accuracy=rec.get("accuracy"), at=at))
        elif kind == "checkpoint":
            rows.append(Metric(job_id=job.id, kind="checkpoint", worker=-1, step=step,
                               step_time_s=rec.get("seconds"), at=at))
            if rec.get("reason") == "notice":
                queries.note(session, job.id, "checkpoint", f"checkpoint at step {step} after a preemption notice",
                             now=at)
        elif kind == "start" and rec.get("resumed"):
            queries.note(session, job.id, "resumed", f"training resumed from the checkpoint at step {step}", now=at)
    queries.add_metrics(session, rows)
    job.metrics_offset += end + 1
