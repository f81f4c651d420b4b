"""A running job is a probe too (control/live_pace.py): the daemon holds each worker's measured pace to its plan's
interval as the step lines arrive, says once per excursion when it leaves it (an event, and `orchestrator status`),
and folds the step times into the calibration while the job runs, without counting them twice at its end."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from fastforward import example_spec, fast_forward
from fastforward_torch import cpu_s
from sqlalchemy.orm import Session

from orchestrator.control.calibration_fold import fold_finished_job, fold_running_job, live_source
from orchestrator.control.driver import emulation, job_spec
from orchestrator.control.launcher import record_plan
from orchestrator.control.live_pace import (
    FOLD_S,
    INSIDE,
    LOOK_STEPS,
    OUTSIDE,
    LiveWatch,
    PlannedStep,
    pace_changes,
    pace_excursions,
    planned_steps,
)
from orchestrator.costmodel.slots import Slot
from orchestrator.model.instances import Role
from orchestrator.planning.step_sources import StepSource
from orchestrator.store import queries
from orchestrator.store.calibrations import newest_calibration
from orchestrator.store.db import open_session
from orchestrator.store.models import Calibration as CalibrationRow
from orchestrator.store.models import Event, Job, Metric
from tests.cli_inproc import run_cli

REPO = Path(__file__).resolve().parent.parent

@pytest.fixture(autouse=True)
def _home(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir(exist_ok=True)  # conftest's ORCHESTRATOR_HOME, where the DB file goes


PLAN = PlannedStep("v100", 128, 0.65, 0.6, 0.7, "predicted")


def test_the_pace_leaves_the_plan_once_per_excursion_and_comes_back() -> None:
    planned = {0: PLAN, 1: PLAN}
    assert pace_changes(planned, {0: 0.65, 1: 0.69}, set(), 100) == []
    (change,) = pace_changes(planned, {0: 0.812, 1: 0.66}, set(), 812)
    assert change == (0, OUTSIDE, "worker-0 step 812 ms at step 812, plan 600-700 ms (predicted 650 ms)")
    assert pace_changes(planned, {0: 0.9}, {0}, 900) == []  # still out: said once
    assert pace_changes(planned, {1: 0.5}, {0}, 950)[0][:2] == (1, OUTSIDE)  # too fast is outside too
    (back,) = pace_changes(planned, {0: 0.66}, {0}, 1000)
    assert back[:2] == (0, INSIDE) and "back inside plan 600-700 ms" in back[2]
    assert pace_changes(planned, {2: 5.0}, set(), 1000) == []  # a worker the plan does not know: nothing said


def test_each_worker_slot_is_held_to_its_own_group() -> None:
    slots = [Slot(role=Role.WORKER, index=i, gpu=g, machine_type="local", zone="local", spot=False,
                  price_per_hour=0.0, batch=b) for i, (g, b) in enumerate([("v100", 45), ("k80", 14), ("k80", 99)])]
    groups = [StepSource("v100", "n1-standard-8", 45, 1, 0.3, "predicted", 0.24, 0.37).to_dict(),
              StepSource("k80", "n1-standard-4", 14, 1, 0.23, "measured", 0.2, 0.25, 0.22, 40).to_dict(),
              {"gpu": "p100", "batch": 37}]  # one another version stored without an interval
    found = planned_steps(groups, slots)
    assert sorted(found) == [0, 1]  # the k80 at batch 99 was not planned so: no interval to hold it to
    assert (found[0].low_s, found[0].high_s, found[1].source) == (0.24, 0.37, "measured")


def _gce_job(job_id: str, status: str = "running") -> Job:
    doc = {"name": job_id, "provider": {"kind": "gce", "project": "my-project-1"},
           "training": {"framework": "pytorch", "hparam_set": "resnet_cifar_32"},
           "cluster": {"workers": [{"gpu": "v100", "count": 2}]}}
    return Job(id=job_id, name=job_id, provider="gce", mode="sync", cluster_shape="2xv100",
               spec_yaml=yaml.safe_dump(doc), storage_uri="gs://b/x", price_book="2026-11", status=status,
               train_steps=10_000, created_at=0.0, updated_at=0.0)


def _steps(session: Session, job_id: str, first: int, last: int, every: int, worker_s: dict[int, float]) -> None:
    for step in range(first, last + 1, every):
        at = float(step)
        session.add(Metric(job_id=job_id, kind="step", worker=-1, step=step, at=at))
        session.add_all([Metric(job_id=job_id, kind="worker", worker=w, gpu="v100", batch=128, step=step,
                                step_time_s=s, compute_s=s * 0.9, runtime="pytorch-eager+torchjob", precision="fp32",
                                at=at) for w, s in worker_s.items()])
    session.commit()


def _slots() -> list[Slot]:
    return [Slot(role=Role.WORKER, index=i, gpu="v100", machine_type="n1-standard-8", zone="us-central1-a",
                 spot=True, price_per_hour=1.0, batch=128) for i in range(2)]


def test_a_running_job_says_when_its_pace_leaves_the_plan_and_folds_as_it_goes() -> None:
    from orchestrator.model.spec import validate_spec

    doc = yaml.safe_load(_gce_job("x").spec_yaml)
    doc["cluster"]["workers"][0]["zone"] = "us-central1-a"
    spec = validate_spec({**doc, "storage": "gs://my-bucket/runs", "pricing": {"book": "2026-11"}})
    with open_session() as session:
        session.add(_gce_job("live-1"))
        session.flush()
        record_plan(session, "live-1", spec, None,
                    [StepSource("v100", "n1-standard-8", 128, 2, 0.1, "predicted", 0.08, 0.12)])
        job = session.get(Job, "live-1")
        assert job is not None
        watch = LiveWatch()
        _steps(session, "live-1", 10, 100, 10, {0: 0.1, 1: 0.1})  # compute 90 ms: inside 80-120
        watch.look(session, job, spec, _slots(), now=100.0)
        _steps(session, "live-1", 110, 130, 10, {0: 0.1, 1: 0.2})  # worker 1 slows to 180 ms ...
        watch.look(session, job, spec, _slots(), now=130.0)  # ... 30 steps, 30 s after the last look: not yet
        assert pace_excursions(session, "live-1") == []
        watch.look(session, job, spec, _slots(), now=100.0 + 61)  # a minute on: the new rows are read
        (said,) = pace_excursions(session, "live-1")
        assert said == "worker-1 step 180 ms at step 130, plan 80-120 ms (predicted 100 ms)"
        _steps(session, "live-1", 140, 100 + 2 * LOOK_STEPS, 10, {0: 0.1, 1: 0.2})
        watch.look(session, job, spec, _slots(), now=170.0)  # still out: said once
        assert len(session.query(Event).filter_by(job_id="live-1", to_status=OUTSIDE).all()) == 1
        assert newest_calibration(session, real=True) is None  # no fold before FOLD_S
        _steps(session, "live-1", 210, 300, 10, {0: 0.1, 1: 0.1})
        watch.look(session, job, spec, _slots(), now=100.0 + FOLD_S)
        assert pace_excursions(session, "live-1") == []  # back inside
        back = session.query(Event).filter_by(job_id="live-1", to_status=INSIDE).one().reason or ""
        assert back.startswith("worker-1 step 90 ms at step 300, back inside"), back
        live = newest_calibration(session, real=True)  # what a plan made now reads: this job's step times so far
        assert live is not None and live.name.startswith("live live-1")
        fresh = LiveWatch()  # a daemon started anew: the excursions in force come from the events
        fresh.look(session, job, spec, _slots(), now=1000.0)
        assert fresh.jobs["live-1"].outside == set()


def test_the_fold_at_the_end_counts_the_live_folds_step_times_once() -> None:
    with open_session() as session:
        session.add(_gce_job("fold-1"))
        session.flush()
        _steps(session, "fold-1", 10, 200, 10, {0: 0.05, 1: 0.06})
        job = session.get(Job, "fold-1")
        assert job is not None
        for _ in range(3):  # each live fold replaces the job's last
            assert fold_running_job(session, job) is not None
        (row,) = session.query(CalibrationRow).all()
        assert row.source == live_source("fold-1")
        job.status = "succeeded"
        session.commit()
        said = fold_finished_job(session, job)
        assert "refined on 1 measured step times (1 from this job)" in said, said
        (after_live,) = session.query(CalibrationRow).all()  # the live row is gone, replaced
        assert after_live.source != live_source("fold-1")
        session.delete(after_live)
        session.commit()
        fold_finished_job(session, job)  # the same fold with no live one before it
        (alone,) = session.query(CalibrationRow).all()
        assert json.loads(alone.params) == json.loads(after_live.params)


def _record_emulated_plan(relative: float) -> Callable[[Session, str], None]:
    """What a launch stores for the fast-forwarded job: each worker group's step as the PyTorch stub runs it (the
    emulated GPU's sleep and the stub's compute, tests/fastforward_torch.py), within ``relative`` either side."""
    def recorded(session: Session, job_id: str) -> None:
        job = session.get(Job, job_id)
        assert job is not None
        spec = job_spec(job.spec_yaml)
        sleep = emulation(spec)
        plan = queries.stored_intent(session, job_id)
        assert plan is not None
        groups = [StepSource(s.gpu or "", s.machine_type, s.batch or 0, 1,
                             sleep(s.gpu, s.batch or 0) + cpu_s(s.batch or 0), "predicted", 0.0, 0.0)
                  for s in plan.slots]
        groups = [StepSource(g.gpu, g.machine_type, g.batch, 1, g.step_s, g.step_source, g.step_s / (1 + relative),
                             g.step_s * (1 + relative)) for g in groups]
        record_plan(session, job_id, spec, None, groups)
    return recorded


def test_a_gpu_that_slows_mid_run_leaves_the_plan_once_fast_forwarded(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # examples/local-torch-resplit.yaml: the V100 (worker 0) runs at half speed from step 150; no re-split here
    spec = example_spec("local-torch-resplit", tmp_path, training={"resplit_every": 0})
    run = fast_forward(spec, tmp_path, monkeypatch, recorded=_record_emulated_plan(0.2332))
    assert run.job["status"] == "succeeded", run.timeline()
    # The stub reports each rank's own compute only where it re-splits; here each rank's step is the world's, which
    # the slowed V100 sets: every group leaves its interval, after the slowdown, once.
    reasons = [o[2] or "" for o in run.notes(OUTSIDE)]
    assert any(r.startswith("worker-0 step ") and "plan " in r for r in reasons), run.timeline()
    assert all(int(r.split(" at step ")[1].split(",")[0]) >= 150 for r in reasons), reasons  # after, not before
    assert len({r.split(" ")[0] for r in reasons}) == len(reasons), reasons  # once per worker
    reason = next(r for r in reasons if r.startswith("worker-0 "))
    assert run.notes(INSIDE) == []
    assert run.notes("calibration")[-1] == run.events[-1]  # the end-of-job fold's note is still the last event
    status = run_cli(["status", run.job["id"], "--format", "json"], {**os.environ, "COLUMNS": "200"}, REPO)
    assert status.returncode == 0, status.stderr
    assert sorted(json.loads(status.stdout)["pace_outside_plan"]) == sorted(reasons)
    table = run_cli(["status", run.job["id"]], {**os.environ, "COLUMNS": "200"}, REPO)
    assert f"pace outside the plan: {reason}" in " ".join(table.stdout.split()), table.stdout
