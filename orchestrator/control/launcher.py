"""`orchestrator launch` (foreground, with a live display) and `orchestrator cancel`."""

from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text
from sqlalchemy.orm import Session

from orchestrator.cli.render import console, duration, money, pct, table
from orchestrator.control.driver import release, run_pass, spec_to_yaml
from orchestrator.errors import UserError
from orchestrator.slots import cluster_shape
from orchestrator.spec import JobSpec
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


def launch_job(spec: JobSpec, planned: PlanResult | None, *, detach: bool, poll_s: float, quiet: bool) -> str:
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


def drive_foreground(job_id: str, *, poll_s: float, quiet: bool) -> None:
    owner = owner_id("launch")
    seen_events = 0
    cancelled = False
    with open_session() as session:
        live = None if quiet else Live(console=console, refresh_per_second=2, transient=False)
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
                        live.update(_display(session, job, evs))
                    else:
                        for e in evs[seen_events:]:
                            console.print(f"{time.strftime('%H:%M:%S', time.localtime(e.at))} {e.entity:8} "
                                          f"{e.from_status or '':12} -> {e.to_status:14} {e.reason or ''}",
                                          highlight=False, markup=False)
                    seen_events = len(evs)
                    if job.status in FINAL_JOB:
                        break
                    time.sleep(poll_s)
                except KeyboardInterrupt:
                    if cancelled:
                        console.print("leaving the teardown to `orchestrator daemon` / `orchestrator cancel`")
                        release(session, owner, [job_id])
                        return
                    cancelled = True
                    job = session.get(Job, job_id)
                    if job is not None:
                        job.cancel_requested = True
                        session.commit()
                    console.print("cancelling: tearing down every instance (Ctrl-C again to leave it to the daemon)")
        finally:
            if live is not None:
                live.stop()
        release(session, owner, [job_id])
        _final_report(session, job_id)


def _display(session: Session, job: Job, evs: list[Event]) -> Group:
    summary = queries.job_summaries(session, [job.id])[0]
    step, eps = queries.latest_step(session, job.id)
    header = Text.from_markup(
        f"[bold]{job.id}[/bold]  {job.status}  step {step}/{job.train_steps}  {eps or 0:.1f} examples/s  "
        f"cost so far {money(summary['cost_usd'])}  revocations {summary['revocations']}  "
        f"replacements {summary['replacements']}  restarts {job.restarts}  "
        f"elapsed {duration(summary['wall_time_s'])}")
    rates = queries.latest_worker_rates(session, job.id)
    rows = []
    for inst in job.instances:
        if inst.status == "deleted" and inst.end_reason in (None, "job_finished"):
            continue
        rate = rates.get(inst.slot_index) if inst.role == "worker" and inst.status == "training" else None
        rows.append([inst.slot, inst.name, inst.gpu or "cpu", "spot" if inst.spot else "on-demand", inst.status,
                     "" if rate is None else f"{rate:.1f}", inst.end_reason or "", f"{inst.price_per_hour:.3f}"])
    t: Table = table(None, ["slot", "instance", "gpu", "billing", "status", "examples/s", "end", "$/h"], rows)
    recent = Text("\n".join(f"{time.strftime('%H:%M:%S', time.localtime(e.at))} {e.entity} {e.to_status}: "
                            f"{e.reason or ''}" for e in evs[-6:]))
    return Group(header, t, recent)


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
        cost = queries.job_cost(session, job_id)["total"]
        console.print(f"{job_id}: {job.status}; ledger closed at {money(cost)}")
