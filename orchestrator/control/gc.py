"""`orchestrator gc`: labelled instances whose job is finished or unknown — the last defence against
paying for forgotten VMs — and the deletes a job closed without its provider left pending.

Image builders (control/images.py) are the exception: labelled with their bake's time limit, they are
left alone until it passes, and an abandoned bake's record is closed here (``close_abandoned_bakes``).
What no listing shows (a provider's ``sweep_strays``: e.g. a local hypervisor whose folder is gone) is ended
with the pending deletes (``end_strays``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.clock import WALL, Clock
from orchestrator.control.bake_record import close as close_bake
from orchestrator.control.billing import provider_end_time
from orchestrator.control.driver import job_spec
from orchestrator.control.failures import describe
from orchestrator.model.instances import BAKE_MODE, LABEL_BAKE, LABEL_BAKE_UNTIL, ObservedInstance
from orchestrator.model.spec import LocalProvider
from orchestrator.model.spec import validate_spec as _validate
from orchestrator.model.status import ACTIVE_JOB, FINAL_JOB, InstanceStatus, JobStatus
from orchestrator.providers.registry import Backend, backend_for
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Instance, Job

log = logging.getLogger("orchestrator.daemon")


def _backends(unchecked: dict[str, str] | None = None) -> list[Backend]:
    """Every backend that any recorded job used (each listed once); ``unchecked`` gets the ones that fail."""
    seen: dict[str, Backend] = {}
    with open_session() as session:
        for (job_id, spec_yaml) in session.query(Job.id, Job.spec_yaml):
            try:
                b = backend_for(job_spec(spec_yaml))
            except Exception as exc:  # noqa: BLE001 - a job whose provider cannot be reached now: reported
                if unchecked is not None:
                    unchecked.setdefault(describe(exc), job_id)
                continue
            seen.setdefault(b.key, b)
    if not any(k.startswith("local:") for k in seen):
        try:  # the local provider's folder is always swept
            b = backend_for(_validate({"name": "gc", "provider": LocalProvider().model_dump(),
                                       "pricing": {"book": "2019-02"}, "cluster": {"workers": [{"gpu": "k80"}]}}))
            seen.setdefault(b.key, b)
        except Exception as exc:  # noqa: BLE001
            if unchecked is not None:
                unchecked.setdefault(describe(exc), "the local provider")
    return list(seen.values())


def find_orphans(unchecked: dict[str, str] | None = None,
                 clock: Clock = WALL) -> list[tuple[Backend, ObservedInstance]]:
    """Labelled instances whose job is not active: finished, or unknown to the DB.

    The cloud is listed before the DB is read: a job is always recorded before its first instance is
    created, so an instance that shows up in the list belongs to a job the later DB read already sees.
    ``unchecked`` (why -> an example job or backend) gets every provider that could not be listed.
    """
    # Backends may share what they list (local jobs with different time scales share one folder); an
    # instance name is unique, so each instance is counted once.
    by_name: dict[str, tuple[Backend, ObservedInstance]] = {}
    for backend in _backends(unchecked):
        try:
            by_name.update({inst.name: (backend, inst) for inst in backend.provider.list(None)})
        except Exception as exc:  # noqa: BLE001 - one provider down must not hide the others' orphans
            if unchecked is not None:
                unchecked.setdefault(describe(exc), backend.key)
    listed = list(by_name.values())
    if not listed:
        return []
    builders = {inst.job_id for _, inst in listed if LABEL_BAKE in inst.labels}
    with open_session() as session:
        active = {j for (j,) in session.query(Job.id).filter(Job.status.in_([s.value for s in ACTIVE_JOB]))}
        ended = {j for (j,) in session.query(Job.id).filter(Job.id.in_(builders),
                                                             Job.status.in_([s.value for s in FINAL_JOB]))}
    now = clock.time()
    return [(backend, inst) for backend, inst in listed if _orphan(inst, active, ended, now)]


def _orphan(inst: ObservedInstance, active: set[str], ended: set[str], now: float) -> bool:
    if LABEL_BAKE not in inst.labels:
        return inst.job_id not in active
    # An image builder: its bake is driven by its own process, maybe against another DB, so the DB cannot
    # tell it is alive; the label's time limit can. Past it (the bake's process died), or once its bake is
    # recorded as over (a builder it could not delete), it is an orphan like any other.
    try:
        until = float(inst.labels.get(LABEL_BAKE_UNTIL, "0"))
    except ValueError:
        until = 0.0
    return now >= until or inst.job_id in ended


def mark_deleted(session: Session, name: str, reason: str) -> None:
    """A pending delete (a job closed without its provider) is done: the row and its ledger close."""
    inst = session.scalar(select(Instance).where(Instance.name == name))
    if inst is not None and inst.status == InstanceStatus.DELETING.value:
        queries.switch_status(session, inst, InstanceStatus.DELETED, reason)
        session.commit()


def finish_pending_deletes(job_ids: list[str] | None = None) -> list[str]:
    """Instances of finished jobs still DELETING: delete them where the provider can be reached now.

    Returns what could not be done, one line each.
    """
    problems: list[str] = []
    with open_session() as session:
        q = (select(Job).join(Instance, Instance.job_id == Job.id)
             .where(Job.status.in_([s.value for s in FINAL_JOB]), Instance.status == InstanceStatus.DELETING.value))
        if job_ids is not None:
            q = q.where(Job.id.in_(job_ids))
        for job in session.scalars(q.distinct()).all():
            try:
                backend = backend_for(job_spec(job.spec_yaml))
                observed = {o.name: o for o in backend.provider.list([job.id])}
                for inst in job.instances:
                    if inst.status != InstanceStatus.DELETING.value:
                        continue
                    if inst.name in observed:
                        backend.provider.delete(inst.name, observed[inst.name].zone)
                    mark_deleted(session, inst.name, "deleted (pending delete done)")
                    log.info("job %s instance %s: deleted (pending delete done)", job.id, inst.name)
            except Exception as exc:  # noqa: BLE001 - tried again at the next sweep
                session.rollback()
                problems.append(f"{job.id}: {describe(exc)}")
    if job_ids is None:
        problems += close_abandoned_bakes()
        problems += end_strays()
    return problems


def end_strays() -> list[str]:
    """What a crash left where no listing shows it (a provider's ``sweep_strays``: e.g. a local hypervisor
    whose instance folder is gone), ended. Logs each; returns what could not be done."""
    problems: list[str] = []
    for backend in _backends():
        sweep: Callable[[], list[str]] | None = getattr(backend.provider, "sweep_strays", None)
        if not callable(sweep):
            continue
        try:
            for line in sweep():
                log.warning("stray ended (%s): %s", backend.key, line)
        except Exception as exc:  # noqa: BLE001 - tried again at the next sweep
            problems.append(f"{backend.key}: {describe(exc)}")
    return problems


def close_abandoned_bakes(now: float | None = None, clock: Clock = WALL) -> list[str]:
    """Bakes still open past their time limit: their `image bake` process died. Delete the builder where it
    is still listed, and close the record as failed (the builder's ledger row closes with it)."""
    now = clock.time() if now is None else now
    problems: list[str] = []
    with open_session() as session:
        q = select(Job).where(Job.mode == BAKE_MODE, Job.status.in_([s.value for s in ACTIVE_JOB]))
        for job in session.scalars(q).all():
            if job.created_at + (job.deadline_s or 0.0) > now or not job.instances:
                continue
            try:
                provider = backend_for(job_spec(job.spec_yaml)).provider
                for observed in provider.list([job.id]):
                    provider.delete(observed.name, observed.zone)
                builder = job.instances[0]
                close_bake(session, job, builder, JobStatus.FAILED, "bake abandoned: its `orchestrator image bake` "
                           "process stopped before the end; builder VM deleted by the sweep", builder_deleted=True,
                           billed_until=provider_end_time(provider, builder.name))
                log.warning("job %s instance %s: abandoned bake closed, builder deleted", job.id, builder.name)
            except Exception as exc:  # noqa: BLE001 - tried again at the next sweep
                session.rollback()
                problems.append(f"{job.id}: {describe(exc)}")
    return problems
