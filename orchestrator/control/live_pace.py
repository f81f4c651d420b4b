"""A running job is a probe too: each pass, the daemon reads the step times its workers measured since it last looked,
compares each worker's pace with the plan's interval for its worker group, and folds them into the calibration.

A look costs a query or two and comes at most once every ``LOOK_STEPS`` steps or ``LOOK_S`` seconds of the job's
clock, and only once new step lines came in; it reads the worker rows it has not read (the newest ``LOOK_ROWS`` at
most) and never runs the planner:

* the pace: each worker's median step since the last look (its own compute where it timed it alone, as the fold
  fits it), on the GPU and batch it was planned with, against its group's interval as the launch stored it
  (``Plan.chosen["worker_groups"]``: planning/step_sources.py). The first look outside records
  ``pace_outside_plan`` ("worker-1 step 812 ms at step 400, plan 600-700 ms (predicted)"), once per excursion; the
  first look back inside, ``pace_inside_plan``. `orchestrator status` shows the excursions in force
  (:func:`pace_excursions`). The deadline policy's pace (control/deadline.own_pace_s) reads the same step lines;
  it needs nothing from here.
* the calibration: at most every ``FOLD_S``, calibration_fold.fold_running_job, the end-of-job fold with the job's
  step times so far, stored as the job's one live row (the fold at its end replaces it and counts nothing twice).

What it keeps between passes (the last look of each job) is the driver's (``DriverState.live``); a daemon started
anew reads the excursions in force from the events, and its first look reads the newest rows only.
"""

from __future__ import annotations

import logging
import re
import statistics
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.control.calibration_fold import fold_running_job
from orchestrator.costmodel.slots import Slot
from orchestrator.model.instances import Role
from orchestrator.model.spec import JobSpec
from orchestrator.model.status import JobStatus
from orchestrator.store import queries
from orchestrator.store.models import Event, Job, Metric

log = logging.getLogger(__name__)
LOOK_STEPS = 50  # a look once the job has made this many steps since the last ...
LOOK_S = 60.0  # ... or this many seconds have passed with new step lines
LOOK_ROWS = 200  # worker rows read at most per look (the newest)
FOLD_S = 600.0  # a live fold of the calibration at most this often
OUTSIDE = "pace_outside_plan"
INSIDE = "pace_inside_plan"
_WORKER = re.compile(r"worker-(\d+) ")


@dataclass(frozen=True)
class PlannedStep:
    """One worker's planned step time and its interval (seconds), on the GPU and batch it was planned with."""

    gpu: str | None
    batch: int | None
    step_s: float
    low_s: float
    high_s: float
    source: str  # predicted | measured (a probe's)


def planned_steps(groups: Sequence[Mapping[str, object]], slots: Sequence[Slot]) -> dict[int, PlannedStep]:
    """Each worker slot's group of the stored plan: the same GPU and batch (and machine type, where one group of
    them has the slot's: a local host's slots are all ``local``, its plan's machine types the cloud's); a slot in
    none is left out, and so is a group stored by another version without an interval."""
    out: dict[int, PlannedStep] = {}
    for s in slots:
        same = [g for g in groups if g.get("gpu") == s.gpu and g.get("batch") == s.batch]
        group = next((g for g in same if g.get("machine_type") == s.machine_type), same[0] if same else None)
        if s.role != Role.WORKER or group is None:
            continue
        try:
            out[s.index] = PlannedStep(s.gpu, s.batch, _seconds(group, "step_s"), _seconds(group, "step_low_s"),
                                       _seconds(group, "step_high_s"), str(group.get("step_source") or "predicted"))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _seconds(group: Mapping[str, object], key: str) -> float:
    value = group[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{key} is not a number")
    return float(value)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def pace_changes(planned: Mapping[int, PlannedStep], measured: Mapping[int, float], outside: Set[int],
                 step: int) -> list[tuple[int, str, str]]:
    """(worker, event, reason) for each worker whose measured step (seconds) left its plan's interval, or came
    back inside it, since the last look; a worker without a measurement or a plan keeps its state."""
    changes = []
    for index in sorted(measured.keys() & planned.keys()):
        p, m = planned[index], measured[index]
        out = not p.low_s <= m <= p.high_s
        if out and index not in outside:
            changes.append((index, OUTSIDE, f"worker-{index} step {_ms(m)} ms at step {step}, plan "
                            f"{_ms(p.low_s)}-{_ms(p.high_s)} ms ({p.source} {_ms(p.step_s)} ms)"))
        elif not out and index in outside:
            changes.append((index, INSIDE, f"worker-{index} step {_ms(m)} ms at step {step}, back inside plan "
                            f"{_ms(p.low_s)}-{_ms(p.high_s)} ms"))
    return changes


def _latest_states(session: Session, job_id: str) -> dict[int, tuple[bool, str]]:
    """Each worker's newest pace event: (outside, its reason)."""
    rows = session.execute(select(Event.to_status, Event.reason).where(
        Event.job_id == job_id, Event.entity == "note", Event.to_status.in_((OUTSIDE, INSIDE))
    ).order_by(Event.at, Event.id)).all()
    states: dict[int, tuple[bool, str]] = {}
    for what, reason in rows:
        m = _WORKER.match(reason or "")
        if m is not None:
            states[int(m.group(1))] = (what == OUTSIDE, reason or "")
    return states


def pace_excursions(session: Session, job_id: str) -> list[str]:
    """The excursions in force: each worker whose pace the daemon last saw outside its plan's interval."""
    return [reason for _, (out, reason) in sorted(_latest_states(session, job_id).items()) if out]


@dataclass
class _Look:
    planned: dict[int, PlannedStep]
    outside: set[int]
    step: int = 0
    at: float = float("-inf")
    metric_id: int = 0
    folded_at: float = float("-inf")


@dataclass
class LiveWatch:
    """The last look at each running job (``DriverState.live``)."""

    max_jobs: int = 256
    jobs: dict[str, _Look] = field(default_factory=dict)

    def look(self, session: Session, job: Job, spec: JobSpec, slots: Sequence[Slot], now: float) -> None:
        """Look at ``job``'s new step times if it is time to (see the module docstring); never raises."""
        if job.status != JobStatus.RUNNING.value:
            return
        try:
            self._look(session, job, spec, slots, now)
        except Exception:  # noqa: BLE001 - a look never breaks a pass
            session.rollback()
            log.exception("job %s: the live look at its step times failed", job.id)

    def _look(self, session: Session, job: Job, spec: JobSpec, slots: Sequence[Slot], now: float) -> None:
        seen = self.jobs.get(job.id)
        if seen is None:
            if len(self.jobs) >= self.max_jobs:
                self.jobs.clear()
            seen = self.jobs[job.id] = _Look(
                planned_steps(queries.planned_worker_groups(session, job.id), slots),
                {w for w, (out, _) in _latest_states(session, job.id).items() if out}, folded_at=now)
        step, _ = queries.latest_step(session, job.id)
        if step <= seen.step or (step - seen.step < LOOK_STEPS and now - seen.at < LOOK_S):
            return
        seen.step, seen.at = step, now
        measured = self._measured(session, job.id, seen)
        for index, what, reason in pace_changes(seen.planned, measured, seen.outside, step):
            (seen.outside.add if what == OUTSIDE else seen.outside.discard)(index)
            queries.note(session, job.id, what, reason)
            log.info("job %s: %s", job.id, reason)
        session.commit()
        if not spec.provider.emulates_gpus and now - seen.folded_at >= FOLD_S:
            seen.folded_at = now
            fold_running_job(session, job)

    @staticmethod
    def _measured(session: Session, job_id: str, seen: _Look) -> dict[int, float]:
        """Each worker's median step (seconds) in the rows since the last look, on its planned GPU and batch."""
        rows = session.execute(select(Metric.id, Metric.worker, Metric.gpu, Metric.batch,
                                      func.coalesce(Metric.compute_s, Metric.step_time_s)).where(
            Metric.job_id == job_id, Metric.kind == "worker", Metric.id > seen.metric_id,
            Metric.step_time_s.is_not(None)).order_by(Metric.id.desc()).limit(LOOK_ROWS)).all()
        if rows:
            seen.metric_id = max(int(r[0]) for r in rows)
        times: dict[int, list[float]] = {}
        for _, worker, gpu, batch, step_s in rows:
            p = seen.planned.get(int(worker))
            if p is not None and gpu == p.gpu and batch == p.batch and step_s is not None:
                times.setdefault(int(worker), []).append(float(step_s))
        return {w: statistics.median(ts) for w, ts in times.items()}
