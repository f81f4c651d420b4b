"""The probes run: each point's short job through the normal launch path (recorded, driven here in the foreground,
its instances created, trained, deleted), one after the other; every cent is in the ledger under that probe's
job. After each probe its timed windows (the worker's logged step times past the warm-up) give the point's
figure, and the figure is folded at once into a new stored calibration (the newest, which the next `plan`
reads), so an interrupted probe keeps what the earlier ones measured.

A probe that fails is torn down by its own driver and the next point is tried; Ctrl-C or SIGTERM tears the
running probe down (the launcher's own cancel) and stops: no later point is created."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.clock import WALL, Clock
from orchestrator.control.launcher import LaunchReporter, LogReporter, cancel_job, create_job, drive_foreground
from orchestrator.control.signals import sigterm_raises
from orchestrator.costmodel import DEFAULT_CALIBRATION
from orchestrator.costmodel.batches import job_runtime
from orchestrator.costmodel.compute import runtime_key
from orchestrator.costmodel.measured import MeasuredStep, point_key, with_points
from orchestrator.model.spec import JobSpec
from orchestrator.model.status import FINAL_JOB
from orchestrator.planning.calibration import planning_calibration
from orchestrator.planning.probe import LOG_EVERY, WARMUP_STEPS, ProbePlan, ProbePoint
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Job, Metric

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeResult:
    """What one probe measured (``step_ms`` None: it measured nothing; ``error`` says why)."""

    point: ProbePoint
    job_id: str
    step_ms: float | None
    low_ms: float | None
    high_ms: float | None
    steps: int  # timed steps behind the figure
    wall_s: float
    cost_usd: float
    status: str
    error: str | None = None
    calibration_id: int | None = None  # the stored calibration the figure was folded into
    samples: int = 0  # timed windows behind the figure

    def to_dict(self) -> dict[str, Any]:
        """``probe --json``'s row: the issue's keys (gpu, machine_type, precision, batch, step_ms, steps, wall_s,
        cost_usd)."""
        p = self.point
        return {"gpu": p.gpu, "machine_type": p.machine_type, "precision": p.precision, "batch": p.batch,
                "step_ms": self.step_ms, "steps": self.steps, "wall_s": self.wall_s, "cost_usd": self.cost_usd}


def run_probes(planned: ProbePlan, *, poll_s: float = 1.0, reporter: LaunchReporter | None = None,
               clock: Clock = WALL, on_result: Callable[[ProbeResult], None] | None = None) -> list[ProbeResult]:
    """Run every probe of ``planned`` in turn and fold each figure; raises ``SystemExit`` 130 / 143 on Ctrl-C /
    SIGTERM once the running probe is torn down (the results so far are folded already)."""
    reporter = reporter or LogReporter()
    budget = planned.spec.policy.budget_usd
    results: list[ProbeResult] = []
    with sigterm_raises():
        for point in planned.points:
            spent = sum(r.cost_usd for r in results)
            result = _run_one(point, budget - spent if budget is not None else None, poll_s, reporter, clock)
            results.append(result)
            if on_result is not None:
                on_result(result)
            if result.status in ("interrupted-130", "interrupted-143"):
                raise SystemExit(int(result.status.rsplit("-", 1)[1]))
    return results


def _run_one(point: ProbePoint, budget: float | None, poll_s: float, reporter: LaunchReporter,
             clock: Clock) -> ProbeResult:
    """One probe: recorded, driven to its end here, its figure read and folded. Its spend is capped at what is
    left of the spec's budget (the daemon's budget policy stops it there)."""
    spec = point.spec.model_copy(update={"policy": point.spec.policy.model_copy(update={"budget_usd": budget})})
    with open_session(clock=clock) as session:
        job_id = create_job(session, spec, point.plan).id
    reporter.recorded(job_id, point.plan, spec.provider.kind, detach=False)
    code = 0
    try:
        drive_foreground(job_id, poll_s=poll_s, reporter=reporter, clock=clock)
    except SystemExit as exc:  # the job failed (1), was cancelled (3) or interrupted (130 / 143): torn down
        code = int(exc.code) if isinstance(exc.code, int) else 1
    except BaseException:  # anything else before the driver's own teardown ran: never leave it billing
        _cancel_unfinished(job_id, clock)
        raise
    with open_session(clock=clock) as session:
        result = figures(session, point, job_id)
        if code in (130, 143):
            return replace(result, status=f"interrupted-{code}")
        if result.step_ms is not None:
            result = replace(result, calibration_id=fold_probe(session, spec, result))
    return result


def _cancel_unfinished(job_id: str, clock: Clock) -> None:
    with open_session(clock=clock) as session:
        job = session.get(Job, job_id)
        final = job is None or job.status in FINAL_JOB
    if not final:
        cancel_job(job_id, clock=clock)


def figures(session: Session, point: ProbePoint, job_id: str) -> ProbeResult:
    """The probe's figure from its worker's logged windows past the warm-up: the median window step time and the
    windows' spread; its wall time (recorded to ended) and its cost (the ledger)."""
    job = session.get(Job, job_id)
    assert job is not None
    windows = [float(t or 0.0) for (t,) in session.execute(
        select(Metric.step_time_s).where(Metric.job_id == job_id, Metric.kind == "worker",
                                         Metric.step > WARMUP_STEPS, Metric.step_time_s.is_not(None))
        .order_by(Metric.step)).all()]
    steps = len(windows) * LOG_EVERY
    if not windows:  # a `run:` script's own metric lines: no per-worker step time, their stamps give it
        windows, steps = script_windows(session, job_id)
    wall = (job.ended_at or queries.clock_of(session).time()) - job.created_at
    cost = queries.job_cost(session, job_id)["total"]
    if job.status != "succeeded" or not windows:
        why = job.last_error or job.status_reason or job.status
        error = f"{job.status}: {why}" if job.status != "succeeded" else "no timed step logged"
        return ProbeResult(point, job_id, None, None, None, 0, wall, cost, job.status, error)
    step = statistics.median(windows)
    return ProbeResult(point, job_id, step * 1e3, min(windows) * 1e3, max(windows) * 1e3, steps,
                       wall, cost, job.status, samples=len(windows))


def script_windows(session: Session, job_id: str) -> tuple[list[float], int]:
    """A `run:` script's windows: the seconds a step between consecutive metric lines of its own (their stamps,
    taken as rank 0 printed them), those that start past the warm-up; and the steps they span. The script
    decides its steps and how often it prints: its first line past the warm-up starts the timed run."""
    rows = [(int(s), float(t)) for s, t in session.execute(
        select(Metric.step, Metric.at).where(Metric.job_id == job_id, Metric.kind == "step")
        .order_by(Metric.step, Metric.at)).all()]
    pairs = [(a, b) for a, b in zip(rows, rows[1:], strict=False) if a[0] >= WARMUP_STEPS and b[0] > a[0]]
    return [(b[1] - a[1]) / (b[0] - a[0]) for a, b in pairs], sum(b[0] - a[0] for a, b in pairs)


def fold_probe(session: Session, spec: JobSpec, result: ProbeResult) -> int:
    """A new stored calibration: the one the spec plans with now, plus this point under the probe's labels
    (GPU, runtime x precision, model, batch); emulated where the probe ran on emulated GPUs."""
    assert result.step_ms is not None and result.low_ms is not None and result.high_ms is not None
    p = result.point
    base = planning_calibration(spec) or DEFAULT_CALIBRATION
    key = point_key(p.gpu, runtime_key(job_runtime(spec.training), p.precision), spec.training.profile_name, p.batch)
    point = MeasuredStep(result.step_ms / 1e3, result.low_ms / 1e3, result.high_ms / 1e3,
                         result.samples, f"probe job {result.job_id}")
    name = f"probe {result.job_id}"[:64]
    calib = with_points(base, {key: point}, name, f"{base.name} + {len(base.measured) + 1} probed point(s)",
                        emulated=spec.provider.emulates_gpus)
    stored = queries.save_calibration(session, name, f"probe (job {result.job_id})", calib.to_dict(), None)
    queries.note(session, result.job_id, "calibration", f"probed {key}: {result.step_ms:.1f} ms "
                 f"({result.low_ms:.1f} .. {result.high_ms:.1f}) folded into calibration {stored}")
    session.commit()
    log.info("probe %s: %s folded into calibration %s", result.job_id, key, stored)
    return stored
