"""The daemon's deadline policy plans with the job's measured pace once it has one (issue 23): the predicted
no-revocation time is only a prediction (+-20% and more), and a job slower than predicted has less slack than
the policy would otherwise think."""

from __future__ import annotations

from pathlib import Path

import yaml
from test_control_poison import local_spec

from orchestrator.control import deadline
from orchestrator.control.launcher import create_job
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import JobSpec, validate_spec
from orchestrator.store.db import open_session
from orchestrator.store.models import Metric

T0 = 3_000_000.0


def _report(session: object, job_id: str, step: int, at: float) -> None:
    session.add(Metric(job_id=job_id, kind="step", worker=-1, step=step, at=at))  # type: ignore[attr-defined]


def _deadline_spec(name: str, tmp_path: Path) -> JobSpec:
    """A local deadline job of 1000 steps."""
    user_dir()
    return validate_spec(yaml.safe_load(local_spec(name, tmp_path / "runs", "true").replace(
        "on_revocation: replace, max_replacements: 0", "on_revocation: deadline").replace(
        "train_steps: 10", "train_steps: 1000")))


def test_the_work_is_the_predicted_time_until_the_job_has_measured_its_pace_then_its_steps_at_that_pace(
        tmp_path: Path) -> None:
    spec = _deadline_spec("pace", tmp_path)
    with open_session() as session:
        job = create_job(session, spec)
        job.started_at = T0
        predicted = deadline.deadline_inputs(session, job, spec, T0)
        assert predicted is not None and predicted.done_s == 0.0
        pace = 3.0 * predicted.work_s / job.train_steps  # this host runs the job 3x slower than predicted
        steps = [10 * k for k in range(1, 9)]
        at = [T0 + pace * s for s in steps]
        at[5:] = [t + 500.0 for t in at[5:]]  # a restart (or a wait for spot) between two reports
        for s, t in zip(steps[:5], at[:5], strict=True):
            _report(session, job.id, s, t)
        session.commit()
        early = deadline.deadline_inputs(session, job, spec, at[4])
        assert early is not None and early.work_s == predicted.work_s  # 4 intervals: not a pace yet
        for s, t in zip(steps[5:], at[5:], strict=True):
            _report(session, job.id, s, t)
        session.commit()
        late = deadline.deadline_inputs(session, job, spec, at[-1])
        assert late is not None
        assert abs(late.work_s - 3.0 * predicted.work_s) < 1e-6 * predicted.work_s  # the restart's gap left out
        assert abs(late.done_s - late.work_s * steps[-1] / job.train_steps) < 1e-9


def test_report_says_which_work_the_daemon_planned_with(tmp_path: Path) -> None:
    from orchestrator.cli.deadline_report import deadline_section

    spec = _deadline_spec("pace-report", tmp_path)
    with open_session() as session:
        job = create_job(session, spec)
        job.started_at = T0
        predicted = deadline.deadline_inputs(session, job, spec, T0)
        assert predicted is not None
        session.commit()
        assert deadline_section(session, [{"job_id": job.id}])[-2].endswith("(too few progress reports to measure "
                                                                           "the pace)")
        pace = 0.5 * predicted.work_s / job.train_steps
        for k in range(1, 8):
            _report(session, job.id, 10 * k, T0 + pace * 10 * k)
        session.commit()
        lines = deadline_section(session, [{"job_id": job.id}])
    assert lines[0].startswith(f"{job.id}: deadline 600s running")
    assert lines[-2] == (f"  work: predicted {predicted.work_s:.0f}s, at the pace the job measured "
                         f"{0.5 * predicted.work_s:.0f}s (-50%; the daemon plans with the measured pace)")
    # No instance yet, so no restart measured: the daemon plans with the planned overhead (control/deadline.py).
    assert lines[-1] == (f"  restart overhead: planned {predicted.overhead_s:.1f}s, the longest restart the job "
                         "measured 0.0s (request to first step; the daemon plans with the planned one)")


def test_the_pace_leaves_out_the_reports_of_a_worker_moved_to_another_gpu_type(tmp_path: Path) -> None:
    """A deadline job's pace is its own GPU type's (``control.deadline.own_pace_s``): 50 reports while its worker ran
    a V100 (policy.also_gpus), 3x as fast, after 8 on its own K80 -- more than the newest 20 reports the pace reads
    -- leave the K80's pace as it was (the newest 41 alone would all be the V100's)."""
    from orchestrator.store.models import Instance

    spec = _deadline_spec("moved", tmp_path)
    with open_session() as session:
        job = create_job(session, spec)
        job.started_at = T0
        own = spec.cluster.workers[0].gpu if spec.cluster else None
        other = "v100" if own != "v100" else "k80"
        for s in range(8):
            _report(session, job.id, 10 * s, T0 + 3.0 * 10 * s)
        moved_at = T0 + 3.0 * 80
        session.add(Instance(job_id=job.id, name=f"{job.id}-worker-0-1", role="worker", slot_index=0, generation=1,
                             gpu=other, machine_type="local", zone="local", spot=True, price_per_hour=1.0,
                             status="training", requested_at=moved_at, updated_at=moved_at))
        for s in range(50):
            _report(session, job.id, 80 + 10 * s, moved_at + 10.0 + 1.0 * 10 * s)
        session.commit()
        assert deadline.own_pace_s(session, job, spec, moved_at + 600) == 3.0
        assert deadline.measured_step_s(session, job.id) == 1.0  # without leaving them out: the V100's pace


def test_report_of_a_job_whose_replayed_trace_has_moved_since(tmp_path: Path) -> None:
    """The spec a job ran with names a trace file that is gone now (moved, or a checkout without it): ``report``
    shows the job's timeline without the planned figures, never a traceback."""
    import shutil

    from orchestrator.cli.deadline_report import deadline_section
    from orchestrator.model.paths import data_dir

    trace = tmp_path / "trace.json"
    shutil.copy(data_dir() / "spot-availability" / "aws-10-26-2022_us-west-2b_v100_1.json", trace)
    user_dir()
    spec = validate_spec(yaml.safe_load(local_spec("moved-trace", tmp_path / "runs", "true").replace(
        "on_revocation: replace, max_replacements: 0", "on_revocation: deadline").replace(
        "emulation_k80_step_s: 0", f"emulation_k80_step_s: 0, availability_trace: {trace}")))
    with open_session() as session:
        job = create_job(session, spec)
        job.started_at = T0
        session.commit()
        trace.unlink()
        lines = deadline_section(session, [{"job_id": job.id}])
    assert lines[0].startswith(f"{job.id}: deadline 600s running")
    assert not any(line.strip().startswith("work:") for line in lines)


def test_the_pace_leaves_out_the_spans_the_pytorch_world_ran_shrunk(tmp_path: Path) -> None:
    """The elastic deadline policy counts work in hours of the whole cluster: 20 reports while the world ran on two of
    its three ranks (1.5x slower per step) -- the newest 20 the pace reads -- leave the whole world's pace as it was."""
    from orchestrator.store import queries

    spec = _deadline_spec("pace-shrunk", tmp_path)
    with open_session() as session:
        job = create_job(session, spec)
        job.started_at = T0
        queries.note(session, job.id, "world", "world 0 -> 3 at step 0", now=T0)
        t, step = T0, 0
        for _ in range(8):  # the whole world: 1 s a step
            t, step = t + 10.0, step + 10
            _report(session, job.id, step, t)
        queries.note(session, job.id, "shrink", "world 3 -> 2 at step 80", now=t + 0.5)
        for _ in range(20):  # two of three ranks: 1.5 s a step
            t, step = t + 15.0, step + 10
            _report(session, job.id, step, t)
        session.commit()
        assert deadline.shrunk_spans(session, job.id, t + 1.0) == ((T0 + 80.5, t + 1.0),)
        assert deadline.own_pace_s(session, job, spec, t + 1.0) == 1.0
        queries.note(session, job.id, "grow", "world 2 -> 3 at step 280", now=t + 0.5)
        session.commit()
        assert deadline.shrunk_spans(session, job.id, t + 1.0) == ((T0 + 80.5, t + 0.5),)
