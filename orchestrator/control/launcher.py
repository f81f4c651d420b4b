"""`orchestrator launch` (foreground, with a live display) and `orchestrator cancel`."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from rich.live import Live
from sqlalchemy.orm import Session

from orchestrator.cli.progress import LineFollower, emit, live_view
from orchestrator.cli.render import console, duration, money, pct
from orchestrator.control.driver import release, run_pass, spec_to_yaml
from orchestrator.errors import UserError
from orchestrator.providers.ssh import load_inventory
from orchestrator.slots import cluster_shape
from orchestrator.spec import JobSpec, SshProvider
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Event, Job
from orchestrator.store.status import FINAL_JOB, JobStatus

if TYPE_CHECKING:
    from orchestrator.costmodel import PlanResult


def new_job_id(name: str) -> str:
    # Unique per launch; every instance name derives from it deterministically.
    return f"{name}-{secrets.token_hex(3)}"


def create_job(session: Session, spec: JobSpec) -> Job:
    now = time.time()
    storage = spec.storage if spec.storage.startswith("gs://") else str(Path(spec.storage).expanduser().resolve())
    job = Job(id=new_job_id(spec.name), name=spec.name, provider=spec.provider.kind, mode=spec.mode.value,
              cluster_shape=cluster_shape(spec), spec_yaml=spec_to_yaml(spec), storage_uri=storage,
              price_book=spec.pricing.book, status=JobStatus.PENDING.value, train_steps=spec.training.train_steps,
              budget_usd=spec.policy.budget_usd, deadline_s=spec.policy.deadline, restarts=0, metrics_offset=0,
              cancel_requested=False, created_at=now, updated_at=now)
    session.add(job)
    session.flush()
    session.add(Event(job_id=job.id, entity="job", from_status=None, to_status=JobStatus.PENDING.value,
                      reason="recorded", at=now))
    session.commit()
    return job


def owner_id(kind: str) -> str:
    return f"{kind}-{socket.gethostname()}-{os.getpid()}"[:64]


def preflight(spec: JobSpec) -> None:
    """Provider checks that need more than the spec (the SSH inventory's content); raises before any row exists."""
    if isinstance(spec.provider, SshProvider):
        load_inventory(spec.provider.inventory)


def launch_job(spec: JobSpec, planned: PlanResult | None, *, detach: bool, poll_s: float, quiet: bool) -> str:
    preflight(spec)  # validation is complete before the job row: a refusal leaves nothing behind
    with open_session() as session:
        job = create_job(session, spec)
        job_id = job.id
        if planned is not None:  # what the planner chose, and the front it chose from
            result = planned.to_dict()
            queries.save_plan(session, spec.name, result.get("chosen") or {}, result.get("front") or [], job_id)
    console.print(f"job [bold]{job_id}[/bold] recorded ({cluster_shape(spec)}, provider {spec.provider.kind})")
    if detach:
        console.print("a running `orchestrator daemon` will drive it; follow with "
                      f"`orchestrator status {job_id}` or `orchestrator logs {job_id} -f`")
        return job_id
    drive_foreground(job_id, poll_s=poll_s, quiet=quiet)
    return job_id


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `timeout`, a stopping service): handled like Ctrl-C, never an orphaned instance."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def drive_foreground(job_id: str, *, poll_s: float, quiet: bool) -> None:
    """Drive the job here until it ends. Ctrl-C or SIGTERM cancels it: a running daemon gets the teardown
    (handed over), else it is done here; either way the launch then exits non-zero (130 / 143)."""
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (embedded use): SIGTERM keeps its handler
        previous = None
    try:
        code = _drive_foreground(job_id, poll_s=poll_s, quiet=quiet)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if code:
        raise SystemExit(code)


def _cancel_on_signal(session: Session, owner: str, job_id: str, exc: KeyboardInterrupt) -> bool:
    """Mark the job cancelled; True when a running daemon takes the teardown over (the launch may go)."""
    from orchestrator.control.daemon import daemon_running
    from orchestrator.store.db import default_url

    what = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
    job = session.get(Job, job_id)
    if job is not None:
        job.cancel_requested = True
        job.retry_at = None
        session.commit()
    if daemon_running(default_url()):
        release(session, owner, [job_id])
        console.print(f"{what}: cancel recorded; handed over: the running `orchestrator daemon` tears down every "
                      f"instance (follow with `orchestrator status {job_id}`)", highlight=False, markup=False)
        return True
    console.print(f"{what}: cancelling: tearing down every instance here before exiting (again to leave it to "
                  "`orchestrator daemon` / `orchestrator cancel`)", highlight=False, markup=False)
    return False


def _drive_foreground(job_id: str, *, poll_s: float, quiet: bool) -> int:
    owner = owner_id("launch")
    cancelled = False
    code = 0
    with open_session() as session:
        # Not a terminal (piped, CI, nohup): event lines plus a progress line every N s instead of a live view.
        live = None if quiet or not console.is_terminal else Live(console=console, refresh_per_second=2,
                                                                  transient=False)
        follower = LineFollower(job_id, steps=False)  # steps: in the progress line; every one: `logs -f`
        if live is not None:
            live.start()
        try:
            while True:
                try:
                    run_pass(session, owner, [job_id])
                    session.expire_all()
                    job = session.get(Job, job_id)
                    assert job is not None
                    evs = queries.events(session, job_id)
                    if live is not None:
                        live.update(live_view(session, job, evs))
                    else:
                        emit(follower.poll(session, job))
                    if job.status in FINAL_JOB:
                        break
                    time.sleep(poll_s)
                except KeyboardInterrupt as exc:
                    session.rollback()
                    code = 143 if isinstance(exc, Terminated) else 130
                    if cancelled:
                        console.print("leaving the teardown to `orchestrator daemon` / `orchestrator cancel`")
                        release(session, owner, [job_id])
                        return code
                    cancelled = True
                    if _cancel_on_signal(session, owner, job_id, exc):
                        return code
        finally:
            if live is not None:
                live.stop()
        release(session, owner, [job_id])
        _final_report(session, job_id)
    return code


def _final_report(session: Session, job_id: str) -> None:
    session.expire_all()
    summary = queries.job_summaries(session, [job_id])[0]
    cost = queries.job_cost(session, job_id)
    console.print(
        f"[bold]{job_id}[/bold] {summary['status']}: accuracy {pct(summary['accuracy'])}, wall time "
        f"{duration(summary['wall_time_s'])}, cost {money(summary['cost_usd'])} (workers {money(cost.get('worker'))}, "
        f"ps {money(cost.get('ps'))}, chief {money(cost.get('chief'))}), revocations {summary['revocations']}, "
        f"replacements {summary['replacements']}, restarts {summary['restarts']}")
    console.print(f"[dim]{summary['status_reason'] or ''}[/dim]")


def cancel_job(job_ref: str, wait_s: float = 120.0) -> None:
    """Mark the job cancelled and tear it down now (or let its current driver do so)."""
    with open_session() as session:
        job = queries.get_job(session, job_ref)
        if job is None:
            raise UserError(f"no job '{job_ref}'; `orchestrator status` lists them")
        if job.status in FINAL_JOB:
            console.print(f"{job.id} is already {job.status}")
            return
        job.cancel_requested = True
        job.retry_at = None  # a job backing off after failed passes is driven at once
        session.commit()
        job_id = job.id
        owner = owner_id("cancel")
        deadline = time.time() + wait_s
        while time.time() < deadline:
            run_pass(session, owner, [job_id])  # does nothing if another driver holds the lease
            session.expire_all()
            job = session.get(Job, job_id)
            assert job is not None
            if job.status in FINAL_JOB:
                break
            time.sleep(0.5)
        release(session, owner, [job_id])
        _report_cancel(session, job_id)


def _report_cancel(session: Session, job_id: str) -> None:
    from orchestrator.control.gc import finish_pending_deletes

    problems = finish_pending_deletes([job_id])
    session.expire_all()
    job = session.get(Job, job_id)
    assert job is not None
    cost = queries.job_cost(session, job_id)["total"]
    if job.status not in FINAL_JOB:
        console.print(f"{job_id}: cancel recorded, still {job.status} (last error: {job.last_error or 'none'}); "
                      "its driver finishes the teardown", highlight=False, markup=False)
        return
    pending = [i.name for i in job.instances if i.status == "deleting"]
    console.print(f"{job_id}: {job.status}; ledger at {money(cost)}", highlight=False, markup=False)
    if pending:
        console.print(f"{len(pending)} instance(s) could not be reached to delete ({'; '.join(problems) or 'pending'}"
                      f"): {', '.join(pending)}; the daemon's sweep and `orchestrator gc --yes` delete them when "
                      "the provider can be reached", highlight=False, markup=False)
