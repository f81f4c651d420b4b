"""Who drives a job: a lease per job, renewed on every pass, and a token that guards every write.

A driver (daemon or foreground `launch`) claims the active jobs whose lease is free, its own or expired;
on PostgreSQL the claim is ``SELECT ... FOR UPDATE SKIP LOCKED``, so daemons sharing the jobs never wait
on each other's rows. Taking a job over draws a new token; while a pass drives a job, every flush first
checks (under a row lock on PostgreSQL) that the job still carries the token the pass claimed it with,
so a driver that lost its lease (paused, partitioned, too slow) can change nothing.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import event, or_, select
from sqlalchemy.orm import Session

from orchestrator.model.instances import BAKE_MODE
from orchestrator.model.status import ACTIVE_JOB
from orchestrator.store import queries
from orchestrator.store.models import Job

LEASE_S = 20.0
_GUARD = "lease_guard"


class LeaseLost(Exception):
    """Another driver holds this job's lease now: this pass's writes to it are refused."""


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def claim(session: Session, owner: str, job_ids: Sequence[str] | None, now: float,
          max_new: int | None = None) -> list[Job]:
    """Active jobs this owner may drive now (its own lease, or none / an expired one), leased for LEASE_S.

    ``max_new``: take at most this many jobs it does not hold yet (daemons sharing a database spread the
    jobs instead of the first one taking them all)."""
    q = select(Job).where(Job.status.in_([s.value for s in ACTIVE_JOB]))
    q = q.where(Job.mode != BAKE_MODE)  # an image bake is driven by its own process (control/images.py)
    if job_ids is not None:
        q = q.where(Job.id.in_(list(job_ids)))
    q = q.where(or_(Job.lease_owner.is_(None), Job.lease_owner == owner, Job.lease_until < now))
    q = q.order_by(Job.created_at)
    if _postgres(session):
        q = q.with_for_update(skip_locked=True)  # a row another daemon is claiming or writing: skip it now
    jobs = list(session.scalars(q))
    if max_new is not None:
        new = [j for j in jobs if j.lease_owner != owner][max_new:]
        jobs = [j for j in jobs if j not in new]
    for job in jobs:
        if job.lease_owner != owner or job.lease_token is None:
            if job.lease_owner != owner:
                queries.note(session, job.id, "driver", f"{owner} drives this job (previous: {job.lease_owner})",
                             now=now)
            job.lease_token = secrets.token_hex(8)
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
            job.lease_token = None
    session.commit()


@contextlib.contextmanager
def guarded(session: Session, job_id: str, token: str | None) -> Iterator[None]:
    """Every flush of ``session`` inside this block first checks that ``job_id`` still has ``token``."""
    session.info[_GUARD] = (job_id, token)
    try:
        yield
    finally:
        session.info.pop(_GUARD, None)


@event.listens_for(Session, "before_flush")
def _check_lease(session: Session, _context: Any, _instances: Any) -> None:
    guard = session.info.get(_GUARD)
    if guard is None:
        return
    job_id, token = guard
    q = select(Job.lease_token).where(Job.id == job_id)
    if _postgres(session):
        q = q.with_for_update()  # held to the commit: a claim by another daemon waits for (or skips) us
    current = session.connection().execute(q).scalar()
    if current != token:
        raise LeaseLost(f"job {job_id}: another driver took the lease over; this pass's writes are dropped")
