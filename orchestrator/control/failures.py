"""A failed pass over one job: an event on that job, a backoff, and, when its outcome is decided but its
provider cannot be reached, closing it anyway (its instances are deleted later, when they can be).

Nothing here may raise: the daemon's other jobs go on whatever happened to this one.
"""

from __future__ import annotations

import logging

import yaml
from pydantic import ValidationError
from sqlalchemy.orm import Session

from orchestrator.model.cloud_errors import AuthError, InvalidRequestError, ProviderError
from orchestrator.model.errors import UserError
from orchestrator.model.spec import SpecError
from orchestrator.model.status import FINAL_JOB, InstanceStatus, JobStatus, TransitionError
from orchestrator.store import queries
from orchestrator.store.models import Job

log = logging.getLogger("orchestrator.daemon")
BACKOFF_S = (0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0)  # after 1, 2, 3, ... failed passes in a row
GIVE_UP_S = 600.0  # a job whose passes fail for this long fails (its deadline may come sooner)
UNREACHABLE_CLOSE_AFTER = 3  # failed list calls before a decided (cancelled, failed) job is closed without them
# Retrying cannot fix these: credentials, a request the cloud rejects, a job row that is not a valid spec.
FATAL = (AuthError, InvalidRequestError, SpecError, UserError, ValidationError, yaml.YAMLError)


def describe(exc: BaseException) -> str:
    message = exc.message if isinstance(exc, ProviderError) else str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= 480 else text[:477] + "..."


def _kind(where: str, exc: BaseException) -> str:
    if isinstance(exc, ProviderError):
        return "provider_error"
    if isinstance(exc, TransitionError):
        return "transition_error"
    return "backend_error" if where == "backend" else "error"


def job_failed(session: Session, job_id: str, where: str, exc: BaseException) -> None:
    """Record the failure of ``where`` (backend | list | drive) on the job; decide whether it can go on."""
    try:
        session.rollback()
        job = session.get(Job, job_id)
        if job is None:
            return
        _record(session, job, where, exc)
    except Exception as lost:  # noqa: BLE001 - even the row may be unreadable; the log still names the job
        session.rollback()
        if type(lost).__name__ == "LeaseLost":  # another driver has the job now: its errors are its own
            log.warning("%s (while recording: %s)", lost, describe(exc))
            return
        log.exception("job %s: %s failed (%s), and recording it failed too", job_id, where, describe(exc))


def _record(session: Session, job: Job, where: str, exc: BaseException) -> None:
    now = queries.clock_of(session).time()
    why = describe(exc)
    what = {"list": "listing its instances failed: ", "backend": "cannot set up its provider: "}.get(where, "")
    job.pass_failures += 1
    job.failing_since = job.failing_since or now
    job.retry_at = now + BACKOFF_S[min(job.pass_failures - 1, len(BACKOFF_S) - 1)]
    if job.last_error != why or job.pass_failures in (1, 2, 4, 8, 16) or job.pass_failures % 32 == 0:
        queries.note(session, job.id, _kind(where, exc), f"{what}{why} (failure {job.pass_failures}; "
                     f"next try in {job.retry_at - now:.0f}s)")
        log.warning("job %s: %s%s (failure %d in a row)", job.id, what, why, job.pass_failures)
    job.last_error = why
    session.commit()
    outcome, reason = _decided(job, exc, now, f"{what}{why}")
    if outcome is None:
        return
    # A cancel never waits for an unreachable provider; a failed or finished job gives it a few tries.
    unreachable = where == "backend" or (where == "list" and (
        job.cancel_requested or job.pass_failures >= UNREACHABLE_CLOSE_AFTER))
    if unreachable or (job.status == JobStatus.TEARING_DOWN.value and now - job.failing_since > GIVE_UP_S):
        close_without_provider(session, job, outcome, reason)
    elif job.status != JobStatus.TEARING_DOWN.value:
        job.outcome = outcome.value
        queries.switch_status(session, job, JobStatus.TEARING_DOWN, reason[:500])
        log.warning("job %s: tearing down (%s): %s", job.id, outcome.value, reason)
        session.commit()


def _decided(job: Job, exc: BaseException, now: float, why: str) -> tuple[JobStatus | None, str]:
    """The job's outcome, when this failure (or the user, or a limit) decides it; else None: try again."""
    if job.status == JobStatus.TEARING_DOWN.value:
        return JobStatus(job.outcome or JobStatus.FAILED.value), job.status_reason or why
    if job.cancel_requested:
        return JobStatus.CANCELLED, "cancelled by the user"
    if isinstance(exc, FATAL):
        return JobStatus.FAILED, why
    if job.deadline_s is not None and job.started_at is not None and now - job.started_at > job.deadline_s:
        return JobStatus.FAILED, f"policy.deadline of {job.deadline_s:.0f}s passed (last error: {why})"
    if job.failing_since is not None and now - job.failing_since > GIVE_UP_S:
        return JobStatus.FAILED, f"every pass failed for {now - job.failing_since:.0f}s: {why}"
    return None, why


def job_recovered(session: Session, job: Job) -> None:
    if job.pass_failures:
        queries.note(session, job.id, "recovered", f"a pass succeeded after {job.pass_failures} failed one(s)")
        log.info("job %s: recovered after %d failed pass(es)", job.id, job.pass_failures)
        job.pass_failures = 0
        job.failing_since = None
        job.retry_at = None
        job.last_error = None
        session.commit()


def close_without_provider(session: Session, job: Job, outcome: JobStatus, reason: str) -> None:
    """End a job whose provider cannot be reached: its instances wait in DELETING for a later delete."""
    if job.status in {s.value for s in FINAL_JOB}:
        return
    pending = 0
    for inst in job.instances:
        if inst.status in (InstanceStatus.DELETED.value, InstanceStatus.DELETING.value):
            pending += inst.status == InstanceStatus.DELETING.value
            continue
        queries.switch_status(session, inst, InstanceStatus.DELETING, "delete pending: the provider cannot be "
                              "reached now; the daemon's sweep deletes it when it can")
        pending += 1
    if job.status != JobStatus.TEARING_DOWN.value:
        job.outcome = outcome.value
        queries.switch_status(session, job, JobStatus.TEARING_DOWN, reason[:500])
    for _name, op in queries.pending_operations(session, [job.id])[job.id]:
        queries.close_operation(op, queries.OP_FAILED, "the job was closed without its provider",
                                queries.clock_of(session).time())
    final = JobStatus(job.outcome or outcome.value)
    tail = f"; {pending} instance(s) to delete when the provider can be reached" if pending else ""
    queries.switch_status(session, job, final, f"closed without the provider ({reason})"[:480] + tail)
    job.retry_at = None
    session.commit()
    log.warning("job %s: %s without reaching its provider (%s)%s", job.id, final.value, reason, tail)
