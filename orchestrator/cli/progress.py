"""Seeing a run while it happens: the live table (terminal), event/metric/progress lines (anywhere else).

``launch`` (foreground), ``status --watch`` and ``logs -f`` all read the same rows: the job's events (each
naming its instance), its metrics as the driver ingested them from ``metrics.jsonl`` (step, loss,
accuracy, checkpoints) and the ledger. So a job driven by the daemon is followed exactly like one
driven by ``launch``.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.text import Text
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.cli.listing import print_lines
from orchestrator.cli.render import console, duration, money, pct, table
from orchestrator.clock import WALL, Clock
from orchestrator.model.errors import UserError
from orchestrator.model.status import FINAL_JOB
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Event, Instance, Job, Metric

ENV_EVERY = "ORCHESTRATOR_PROGRESS_S"
DEFAULT_EVERY_S = 10.0
RATE_WINDOW_S = 30.0  # steps/s and examples/s are averaged over this much of the newest metrics


def progress_every_s() -> float:
    try:
        return max(0.5, float(os.environ.get(ENV_EVERY, DEFAULT_EVERY_S)))
    except ValueError:
        return DEFAULT_EVERY_S


def _hms(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


@dataclass(frozen=True)
class Progress:
    job_id: str
    status: str
    step: int
    total: int
    examples_per_s: float | None
    steps_per_s: float | None
    loss: float | None
    accuracy: float | None
    cost_usd: float
    budget_usd: float | None
    elapsed_s: float | None
    instances: dict[str, int]

    @property
    def eta_s(self) -> float | None:
        if not self.steps_per_s or self.step >= self.total:
            return None
        return (self.total - self.step) / self.steps_per_s


def progress(session: Session, job: Job) -> Progress:
    summary = queries.job_summaries(session, [job.id])[0]
    steps = list(session.execute(
        select(Metric.step, Metric.examples_per_s, Metric.loss, Metric.at)
        .where(Metric.job_id == job.id, Metric.kind == "step", Metric.worker == -1)
        .order_by(Metric.at.desc()).limit(50)).all())
    step, eps, loss, steps_per_s = 0, None, None, None
    if steps:
        step, eps, loss, newest = int(steps[0][0]), steps[0][1], steps[0][2], float(steps[0][3])
        window = [r for r in steps if newest - float(r[3]) <= RATE_WINDOW_S]
        oldest = window[-1]
        if newest > float(oldest[3]) and step > int(oldest[0]):
            steps_per_s = (step - int(oldest[0])) / (newest - float(oldest[3]))
        rates = [float(r[1]) for r in window if r[1] is not None]
        eps = sum(rates) / len(rates) if rates else eps
    acc = session.scalar(select(Metric.accuracy).where(Metric.job_id == job.id, Metric.kind == "eval",
                                                       Metric.accuracy.is_not(None))
                         .order_by(Metric.at.desc()).limit(1))
    states = Counter(i.status for i in queries.job_instances(session, job.id))
    return Progress(job_id=job.id, status=job.status, step=max(step, job.final_step or 0), total=job.train_steps,
                    examples_per_s=eps, steps_per_s=steps_per_s, loss=loss,
                    accuracy=job.accuracy if job.accuracy is not None else acc,
                    cost_usd=float(summary["cost_usd"] or 0.0), budget_usd=job.budget_usd,
                    elapsed_s=summary["wall_time_s"], instances=dict(sorted(states.items())))


def progress_line(p: Progress, now: float | None = None) -> str:
    share = f" ({100 * p.step / p.total:.0f}%)" if p.total else ""
    parts = [f"{_hms(WALL.time() if now is None else now)} progress {p.job_id} {p.status}: "
             f"step {p.step}/{p.total}{share}"]
    parts.append(f"{p.examples_per_s:.1f} examples/s (last {RATE_WINDOW_S:.0f} s)" if p.examples_per_s is not None
                 else "— examples/s")
    if p.loss is not None:
        parts.append(f"loss {p.loss:.4f}")
    eta = p.eta_s
    parts.append(f"ETA {duration(eta)}" if eta is not None else "ETA —")
    parts.append(f"spend {money(p.cost_usd)}" + (f" of {money(p.budget_usd)}" if p.budget_usd else ""))
    parts.append("instances " + (", ".join(f"{k} {v}" for k, v in p.instances.items()) or "none"))
    return ", ".join(parts)


def instance_names(session: Session, job_id: str) -> dict[int, Instance]:
    return {i.id: i for i in queries.job_instances(session, job_id)}


def event_parts(e: Event, instances: dict[int, Instance]) -> tuple[str, str]:
    """Who (the instance's slot and name, else job / note) and what changed."""
    inst = instances.get(e.instance_id) if e.instance_id is not None else None
    who = f"{inst.slot} ({inst.name})" if inst is not None else e.entity
    return who, f"{e.from_status} -> {e.to_status}" if e.from_status else e.to_status


def event_line(e: Event, instances: dict[int, Instance]) -> str:
    who, change = event_parts(e, instances)
    return f"{_hms(e.at)} {who}: {change}" + (f": {e.reason}" if e.reason else "")


def metric_line(m: Metric, total: int) -> str | None:
    if m.kind == "step":
        rate = f", {m.examples_per_s:.1f} examples/s" if m.examples_per_s is not None else ""
        loss = f", loss {m.loss:.4f}" if m.loss is not None else ""
        return f"{_hms(m.at)} train: step {m.step}/{total}{loss}{rate}"
    if m.kind == "eval":
        loss = f", loss {m.loss:.4f}" if m.loss is not None else ""
        return f"{_hms(m.at)} eval: step {m.step}{loss}, accuracy {pct(m.accuracy)}"
    if m.kind == "checkpoint":
        took = f" ({m.step_time_s:.1f}s)" if m.step_time_s is not None else ""
        return f"{_hms(m.at)} checkpoint: step {m.step}{took}"
    return None  # per-worker rows feed the live table, not the log


class LineFollower:
    """Prints what is new since the last call: events, training metrics, and a progress line every N s."""

    def __init__(self, job_id: str, *, metrics: bool = True, steps: bool = True, every_s: float | None = None,
                 backlog: int | None = None) -> None:
        self.job_id = job_id
        self.metrics = metrics
        self.steps = steps  # every logged training step (logs); else evaluations and checkpoints only (launch)
        self.every_s = progress_every_s() if every_s is None else every_s
        self.backlog = backlog  # first call: every event but only the newest N metric lines (None: all)
        self.event_id = 0
        self.metric_id = 0
        self.last_progress = 0.0
        self.final_shown = False

    def new_lines(self, session: Session, job: Job) -> list[str]:
        evs = list(session.scalars(select(Event).where(Event.job_id == self.job_id, Event.id > self.event_id)
                                   .order_by(Event.id)))
        instances = instance_names(session, self.job_id)
        stamped: list[tuple[float, int, str]] = [(e.at, 0, event_line(e, instances)) for e in evs]
        if evs:
            self.event_id = evs[-1].id
        if self.metrics:
            rows = list(session.scalars(select(Metric).where(Metric.job_id == self.job_id, Metric.id > self.metric_id,
                                                             Metric.kind != "worker").order_by(Metric.id)))
            if rows:
                self.metric_id = max(r.id for r in rows)
            for m in rows:
                if m.kind == "step" and not self.steps:
                    continue
                line = metric_line(m, job.train_steps)
                if line is not None:
                    stamped.append((m.at, 1, line))
        if self.backlog is not None:  # first look: every event, only the newest N metric lines
            metric_rows = [t for t in stamped if t[1] == 1]
            drop = {id(t) for t in metric_rows[:max(0, len(metric_rows) - self.backlog)]}
            stamped, self.backlog = [t for t in stamped if id(t) not in drop], None
        stamped.sort(key=lambda t: (t[0], t[1]))
        return [s for _, _, s in stamped]

    def poll(self, session: Session, job: Job, *, now: float | None = None) -> list[str]:
        now = queries.clock_of(session).time() if now is None else now
        lines = self.new_lines(session, job)
        final = job.status in FINAL_JOB
        if self.every_s and not self.final_shown and (now - self.last_progress >= self.every_s or final):
            lines.append(progress_line(progress(session, job), now))
            self.last_progress = now
            self.final_shown = final
        return lines


def emit(lines: list[str]) -> None:
    print_lines(lines)  # wrapped at the console's width (80 piped), never inside an instance name


def live_view(session: Session, job: Job, evs: list[Event]) -> Group:
    """The terminal view: a header, every instance the job has had (replaced ones too), recent events."""
    p = progress(session, job)
    summary = queries.job_summaries(session, [job.id])[0]
    eta = p.eta_s
    header = Text.from_markup(
        f"[bold]{job.id}[/bold]  {job.status}  step {p.step}/{p.total}  {p.examples_per_s or 0:.1f} examples/s  "
        f"ETA {duration(eta) if eta is not None else '—'}  spend {money(p.cost_usd)}"
        + (f" of {money(p.budget_usd)}" if p.budget_usd else "")
        + f"  revocations {summary['revocations']}  replacements {summary['replacements']}  "
        f"restarts {job.restarts}  elapsed {duration(summary['wall_time_s'])}")
    rates = queries.latest_worker_rates(session, job.id)
    rows: list[list[Any]] = []
    order = {"ps": 0, "chief": 1, "worker": 2}
    for inst in sorted(queries.job_instances(session, job.id),
                       key=lambda i: (order.get(i.role, 3), i.slot_index, i.generation)):  # a slot's history together
        rate = rates.get(inst.slot_index) if inst.role == "worker" and inst.status == "training" else None
        rows.append([inst.slot, inst.name, inst.gpu or "cpu", "spot" if inst.spot else "on-demand", inst.status,
                     "" if rate is None else f"{rate:.1f}", inst.end_reason or "", f"{inst.price_per_hour:.3f}"])
    t = table(None, ["slot", "instance", "gpu", "billing", "status", "examples/s", "end", "$/h"], rows)
    instances = instance_names(session, job.id)
    recent = Text("\n".join(event_line(e, instances) for e in evs[-6:]))
    return Group(header, t, recent)


def follow_job(job_ref: str, *, watch_live: bool, metrics: bool, lines: int | None, follow: bool,
               poll_s: float = 1.0, clock: Clock = WALL) -> None:
    """``status --watch`` / ``logs [-f]``: print (or show live) until the job is final, whoever drives it."""
    with open_session() as session:
        job = queries.get_job(session, job_ref)
        if job is None:
            raise UserError(f"no job '{job_ref}'; `orchestrator status` lists them")
        job_id = job.id
        if watch_live and console.is_terminal:
            with Live(console=console, refresh_per_second=2, transient=False) as live:
                while True:
                    session.expire_all()
                    job = session.get(Job, job_id)
                    assert job is not None
                    live.update(live_view(session, job, queries.events(session, job_id)))
                    if job.status in FINAL_JOB:
                        return
                    clock.sleep(poll_s)
        follower = LineFollower(job_id, metrics=metrics, every_s=progress_every_s() if follow else 0.0,
                                backlog=lines)
        while True:
            session.expire_all()
            job = session.get(Job, job_id)
            assert job is not None
            emit(follower.poll(session, job))
            if not follow or job.status in FINAL_JOB:
                return
            clock.sleep(poll_s)
