"""`orchestrator launch` (foreground) and `orchestrator cancel`: the control flow, no display.

What a foreground launch shows goes through a ``LaunchReporter`` (cli/launch_view.py draws it on the
console); ``cancel_job`` returns what happened (``CancelResult``) for the caller to print.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.clock import WALL, Clock
from orchestrator.control.daemon import daemon_running
from orchestrator.control.driver import DriverState, release, run_pass, spec_to_yaml
from orchestrator.control.gc import finish_pending_deletes
from orchestrator.control.signals import Terminated, sigterm_raises
from orchestrator.costmodel.launch_plan import LaunchPlan, plan_spec
from orchestrator.model.errors import UserError
from orchestrator.model.exits import launch_exit
from orchestrator.model.instances import BAKE_MODE
from orchestrator.model.spec import JobSpec
from orchestrator.model.status import FINAL_JOB, JobStatus
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.store import queries
from orchestrator.store.db import default_url, open_session
from orchestrator.store.models import Event, Job

if TYPE_CHECKING:
    from orchestrator.costmodel import PlanResult
    from orchestrator.planning.step_sources import StepSource

log = logging.getLogger(__name__)


class LaunchReporter(Protocol):
    """What a foreground launch tells its user; the launcher decides what happens, the reporter shows it."""

    def say(self, text: str) -> None:
        """One plain line (no markup)."""

    def recorded(self, job_id: str, plan: LaunchPlan, provider: str, *, detach: bool) -> None: ...

    def start(self) -> None: ...

    def update(self, session: Session, job: Job) -> None:
        """After each pass: the job's rows as they are now."""

    def stop(self) -> None: ...

    def finished(self, session: Session, job_id: str) -> None:
        """The job ended (or was handed over): its summary."""


class LogReporter:
    """A reporter for embedded use (no console): lines go to the log."""

    def say(self, text: str) -> None:
        log.info("%s", text)

    def recorded(self, job_id: str, plan: LaunchPlan, provider: str, *, detach: bool) -> None:
        log.info("job %s recorded (%s, provider %s)", job_id, plan.shape, provider)

    def start(self) -> None:
        pass

    def update(self, session: Session, job: Job) -> None:
        pass

    def stop(self) -> None:
        pass

    def finished(self, session: Session, job_id: str) -> None:
        log.info("job %s: %s", job_id, getattr(session.get(Job, job_id), "status", "?"))


def new_job_id(name: str, session: Session | None = None) -> str:
    # Unique per launch; every instance name derives from it deterministically, so it stays short (GCE names are
    # at most 63 characters) and a suffix already in this results DB is drawn again.
    while True:
        job_id = f"{name}-{secrets.token_hex(3)}"
        if session is None or session.get(Job, job_id) is None:
            return job_id


ID_DRAWS = 3  # inserts tried when a concurrent launch takes the drawn id between the check and the insert


def create_job(session: Session, spec: JobSpec, plan: LaunchPlan | None = None) -> Job:
    """The job row, its first event and its stored plan (the desired state every pass drives toward)."""
    plan = plan or plan_spec(spec, steps=step_model_for(spec))
    for _ in range(ID_DRAWS - 1):
        try:
            return _insert_job(session, spec, plan)
        except IntegrityError:
            session.rollback()  # one transaction: nothing of it stays
    return _insert_job(session, spec, plan)  # the last draw's error, if any, is the launch's


def _insert_job(session: Session, spec: JobSpec, plan: LaunchPlan) -> Job:
    now = queries.clock_of(session).time()
    storage = spec.storage if spec.storage.startswith("gs://") else str(Path(spec.storage).expanduser().resolve())
    job = Job(id=new_job_id(spec.name, session), name=spec.name, provider=spec.provider.kind, mode=spec.mode.value,
              cluster_shape=plan.shape, spec_yaml=spec_to_yaml(spec), storage_uri=storage,
              price_book=spec.pricing.book, status=JobStatus.PENDING.value, train_steps=spec.training.train_steps,
              budget_usd=spec.policy.budget_usd, deadline_s=spec.policy.deadline, restarts=0, metrics_offset=0,
              cancel_requested=False, created_at=now, updated_at=now)
    session.add(job)
    session.flush()
    session.add(Event(job_id=job.id, entity="job", from_status=None, to_status=JobStatus.PENDING.value,
                      reason="recorded", at=now))
    queries.save_intent(session, job.id, plan, now)
    session.commit()
    return job


def record_plan(session: Session, job_id: str, spec: JobSpec, planned: PlanResult | None,
                groups: Sequence[StepSource] = ()) -> None:
    """What the planner chose and the front it chose from (a search), with each worker group's planned step and
    interval (``worker_groups``); nothing when there is neither."""
    if planned is None and not groups:
        return
    result = planned.to_dict() if planned is not None else {}
    chosen = {**(result.get("chosen") or {}), **({"worker_groups": [g.to_dict() for g in groups]} if groups else {})}
    queries.save_plan(session, spec.name, chosen, result.get("front") or [], job_id)
    session.commit()


def owner_id(kind: str) -> str:
    return f"{kind}-{socket.gethostname()}-{os.getpid()}"[:64]


def launch_job(spec: JobSpec, planned: PlanResult | None, plan: LaunchPlan | None = None, *, detach: bool,
               poll_s: float, reporter: LaunchReporter | None = None, groups: Sequence[StepSource] = ()) -> str:
    """Record the job with ``plan`` (the spec's one expansion, as the dry run and quota check saw it) and,
    unless detached, drive it here until it ends. The spec was admitted (planning.admission: its provider's
    set-up checked) before: a refusal leaves nothing behind. ``groups``: each planned worker group's step and
    interval, stored with the plan (the daemon holds the workers' measured pace to them: live_pace.py)."""
    reporter = reporter or LogReporter()
    plan = plan or plan_spec(spec, steps=step_model_for(spec))
    with open_session() as session:
        job = create_job(session, spec, plan)
        job_id = job.id
        record_plan(session, job_id, spec, planned, groups)
    reporter.recorded(job_id, plan, spec.provider.kind, detach=detach)
    if not detach:
        drive_foreground(job_id, poll_s=poll_s, reporter=reporter)
    return job_id


def drive_foreground(job_id: str, *, poll_s: float, reporter: LaunchReporter | None = None,
                     clock: Clock = WALL) -> None:
    """Drive the job here until it ends. Ctrl-C or SIGTERM cancels it: a running daemon gets the teardown
    (handed over), else it is done here; either way the launch then exits non-zero (130 / 143)."""
    with sigterm_raises():
        code = _drive_foreground(job_id, poll_s=poll_s, reporter=reporter or LogReporter(), clock=clock)
    if code:
        raise SystemExit(code)


def _cancel_on_signal(session: Session, owner: str, job_id: str, exc: KeyboardInterrupt,
                      reporter: LaunchReporter) -> bool:
    """Mark the job cancelled; True when a running daemon takes the teardown over (the launch may go)."""
    what = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
    job = session.get(Job, job_id)
    if job is not None:
        job.cancel_requested = True
        job.retry_at = None
        session.commit()
    if daemon_running(default_url()):
        release(session, owner, [job_id])
        reporter.say(f"{what}: cancel recorded; handed over: the running `orchestrator daemon` tears down every "
                     f"instance (follow with `orchestrator status {job_id}`)")
        return True
    reporter.say(f"{what}: cancelling: tearing down every instance here before exiting (again to leave it to "
                 "`orchestrator daemon` / `orchestrator cancel`)")
    return False


def _drive_foreground(job_id: str, *, poll_s: float, reporter: LaunchReporter, clock: Clock) -> int:
    owner = owner_id("launch")
    cancelled = False
    code = 0
    state = DriverState()  # this foreground driver's, across its passes
    with open_session(clock=clock) as session:
        reporter.start()
        try:
            while True:
                try:
                    run_pass(session, owner, [job_id], state=state)
                    session.expire_all()
                    job = session.get(Job, job_id)
                    assert job is not None
                    reporter.update(session, job)
                    if job.status in FINAL_JOB:
                        break
                    clock.sleep(poll_s)
                except KeyboardInterrupt as exc:
                    session.rollback()
                    code = 143 if isinstance(exc, Terminated) else 130
                    if cancelled:
                        reporter.say("leaving the teardown to `orchestrator daemon` / `orchestrator cancel`")
                        release(session, owner, [job_id])
                        return code
                    cancelled = True
                    if _cancel_on_signal(session, owner, job_id, exc, reporter):
                        return code
        finally:
            reporter.stop()
        release(session, owner, [job_id])
        session.expire_all()
        reporter.finished(session, job_id)
        job = session.get(Job, job_id)
        return code or launch_exit(job.status if job is not None else "failed")


@dataclass(frozen=True)
class CancelResult:
    """What `orchestrator cancel` did, for its caller to show."""

    job_id: str
    status: str
    already_final: bool = False
    cost_usd: float = 0.0
    last_error: str | None = None
    undeleted: tuple[str, ...] = ()  # instances the provider could not be reached to delete
    problems: tuple[str, ...] = ()


def cancel_job(job_ref: str, wait_s: float = 120.0, clock: Clock = WALL) -> CancelResult:
    """Mark the job cancelled and tear it down now (or let its current driver do so)."""
    with open_session(clock=clock) as session:
        job = queries.get_job(session, job_ref)
        if job is None:
            raise UserError(f"no job '{job_ref}'; `orchestrator status` lists them")
        if job.status in FINAL_JOB:
            return CancelResult(job.id, job.status, already_final=True)
        if job.mode == BAKE_MODE:  # no driver of ours would ever act on the flag
            raise UserError(f"{job.id} is an image bake, driven by its own `orchestrator image bake` process",
                            hint="stop that process (Ctrl-C or kill -TERM): it deletes its builder VM; if it is "
                                 "gone, the daemon's sweep or `orchestrator gc --yes` deletes the builder once the "
                                 "bake's time limit has passed")
        job.cancel_requested = True
        job.retry_at = None  # a job backing off after failed passes is driven at once
        session.commit()
        job_id = job.id
        owner = owner_id("cancel")
        deadline = clock.time() + wait_s
        state = DriverState()
        while clock.time() < deadline:
            run_pass(session, owner, [job_id], state=state)  # does nothing if another driver holds the lease
            session.expire_all()
            job = session.get(Job, job_id)
            assert job is not None
            if job.status in FINAL_JOB:
                break
            clock.sleep(0.5)
        release(session, owner, [job_id])
        return _cancel_result(session, job_id)


def _cancel_result(session: Session, job_id: str) -> CancelResult:
    problems = finish_pending_deletes([job_id])
    session.expire_all()
    job = session.get(Job, job_id)
    assert job is not None
    return CancelResult(job_id, job.status, cost_usd=queries.job_cost(session, job_id)["total"],
                        last_error=job.last_error, undeleted=tuple(i.name for i in job.instances
                                                                   if i.status == "deleting"),
                        problems=tuple(problems))
