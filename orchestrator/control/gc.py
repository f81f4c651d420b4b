"""`orchestrator gc`: labelled instances whose job is finished or unknown — the last defence against
paying for forgotten VMs — and the deletes a job closed without its provider left pending."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.control.driver import job_spec
from orchestrator.control.failures import describe
from orchestrator.core.instances import ObservedInstance
from orchestrator.core.status import ACTIVE_JOB, FINAL_JOB, InstanceStatus
from orchestrator.providers.registry import Backend, backend_for
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Instance, Job

log = logging.getLogger("orchestrator.daemon")


def _backends(unchecked: dict[str, str] | None = None) -> list[Backend]:
    """Every backend that any recorded job used (each listed once); ``unchecked`` gets the ones that fail."""
    from orchestrator.core.spec import LocalProvider
    from orchestrator.core.spec import validate_spec as _validate

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


def find_orphans(unchecked: dict[str, str] | None = None) -> list[tuple[Backend, ObservedInstance]]:
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
    with open_session() as session:
        active = {j for (j,) in session.query(Job.id).filter(Job.status.in_([s.value for s in ACTIVE_JOB]))}
    return [(backend, inst) for backend, inst in listed if inst.job_id not in active]


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
    return problems
