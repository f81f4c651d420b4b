"""The measurement loop: workers report the batch, runtime and precision they ran; ingest stores them; `model
calibrate --from-db` fits per GPU x runtime x precision x model and leaves out a job with mixed labels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.control.ingest import ingest_metrics
from orchestrator.costmodel.slots import Slot
from orchestrator.model.instances import Role
from orchestrator.storage.local import LocalStorage
from orchestrator.store.db import open_session
from orchestrator.store.models import Event, Job, Metric
from orchestrator.store.queries import step_time_measurements


@pytest.fixture(autouse=True)
def _home(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir(exist_ok=True)  # conftest's ORCHESTRATOR_HOME, where the DB file goes


def _job(job_id: str, provider: str, training: dict[str, object]) -> Job:
    doc = {"name": job_id, "provider": {"kind": provider, "project": "my-project-1"}, "training": training,
           "cluster": {"workers": [{"gpu": "v100", "count": 1}]}}
    return Job(id=job_id, name=job_id, provider=provider, mode="sync", cluster_shape="1", spec_yaml=yaml.safe_dump(doc),
               storage_uri="gs://b/x", price_book="2026-11", status="succeeded", train_steps=100, created_at=0.0,
               ended_at=100.0, updated_at=100.0)


def _worker(job_id: str, gpu: str, batch: int, step_s: float, runtime: str | None, at: float,
            compute_s: float | None = None) -> Metric:
    return Metric(job_id=job_id, kind="worker", worker=0, gpu=gpu, batch=batch, step=int(at), step_time_s=step_s,
                  compute_s=compute_s, runtime=runtime, precision="fp32" if runtime else None, at=at)


def _ingest_one_step(tmp_path: Path, job: Job, worker: dict[str, object], slot: Slot) -> Metric:
    """One step line of a PyTorch worker ingested for ``job``: the worker row it became."""
    storage = LocalStorage(str(tmp_path), "s")
    line = {"kind": "step", "t": 10.0, "step": 40, "loss": 0.5, "examples_per_s": 300.0, "runtime":
            "pytorch-eager+torchjob", "precision": "fp32", "workers": {"0": worker}}
    (tmp_path / "s" / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    with open_session() as session:
        session.add(job)
        session.flush()
        ingest_metrics(session, job, storage, [slot])
        session.commit()
        row: Metric = session.query(Metric).filter_by(job_id=job.id, kind="worker").one()
        session.expunge(row)
    return row


def test_ingest_keeps_the_batch_runtime_and_compute_a_worker_reported(tmp_path: Path) -> None:
    slot = Slot(role=Role.WORKER, index=0, gpu="v100", machine_type="n1-standard-8", zone="local", spot=False,
                price_per_hour=1.0, batch=48)
    row = _ingest_one_step(tmp_path, _job("j1", "local", {"framework": "pytorch"}),
                           {"steps": 10, "batch": 30, "examples_per_s": 100.0, "step_time_s": 0.3, "compute_s": 0.21},
                           slot)
    assert (row.batch, row.runtime, row.precision, row.compute_s) == (30, "pytorch-eager+torchjob", "fp32", 0.21)
    assert row.gpus is None


def test_a_multi_gpu_nodes_batch_is_fitted_per_gpu(tmp_path: Path) -> None:
    # An a3-highgpu-2g node's two ranks ran 30 + 30 in 0.3 s: the worker row keeps the node's 60 and its 2 GPUs,
    # and the calibration sees one H100 at batch 30.
    slot = Slot(role=Role.WORKER, index=0, gpu="h100", machine_type="a3-highgpu-2g", zone="us-central1-a",
                spot=True, price_per_hour=1.0, batch=60, gpu_count=2)
    row = _ingest_one_step(tmp_path, _job("j2", "gce", {"framework": "pytorch", "hparam_set": "resnet_cifar_32"}),
                           {"steps": 10, "batch": 60, "examples_per_s": 200.0, "step_time_s": 0.3, "gpus": 2}, slot)
    with open_session() as session:
        (measured,) = step_time_measurements(session, ["j2"])
    assert (row.batch, row.gpus) == (60, 2)
    assert (measured["gpu"], measured["batch"], measured["step_time_s"]) == ("h100", 30, 0.3)
    # the TensorFlow job mirrors over the VM's GPUs and does not say: its machine type's count is taken
    tf_row = _ingest_one_step(tmp_path / "tf", _job("j3", "gce", {"framework": "tensorflow"}),
                              {"steps": 10, "batch": 60, "step_time_s": 0.3}, slot)
    assert tf_row.gpus == 2


def test_measurements_are_labelled_per_job_and_a_mixed_job_is_left_out() -> None:
    with open_session() as session:
        session.add_all([_job("tf-1", "gce", {"framework": "tensorflow", "hparam_set": "resnet_cifar_32"}),
                         _job("pt-1", "gce", {"framework": "pytorch", "hparam_set": "resnet_cifar_32"}),
                         _job("mixed-1", "gce", {"framework": "pytorch", "hparam_set": "resnet_cifar_32"})])
        session.flush()
        session.add_all([_worker("tf-1", "v100", 128, 0.105, None, 1.0),  # logged before labels: TF implied
                         _worker("pt-1", "v100", 128, 0.09, "pytorch-eager+torchjob", 2.0, compute_s=0.06),
                         _worker("mixed-1", "v100", 128, 0.09, "pytorch-eager+torchjob", 3.0),
                         _worker("mixed-1", "v100", 128, 0.09, "torch-compile", 4.0)])
        session.commit()
        rows = step_time_measurements(session)
    by_job = {r["job_id"]: r for r in rows}
    assert by_job["tf-1"]["runtime"] == "tf1-graph" and by_job["tf-1"]["step_time_s"] == 0.105
    # the PyTorch worker's own compute, not the window's (slowest rank's) step time
    assert by_job["pt-1"]["runtime"] == "pytorch-eager+torchjob" and by_job["pt-1"]["step_time_s"] == 0.06
    assert "refused" in by_job["mixed-1"] and "torch-compile" in by_job["mixed-1"]["refused"]


def test_calibrate_from_db_fits_a_tf_and_a_pytorch_job_apart(tmp_path: Path) -> None:
    with open_session() as session:
        session.add_all([_job("tf-2", "gce", {"framework": "tensorflow", "hparam_set": "resnet_cifar_32"}),
                         _job("pt-2", "gce", {"framework": "pytorch", "hparam_set": "resnet_cifar_32"}),
                         _job("mixed-2", "gce", {"framework": "pytorch", "hparam_set": "resnet_cifar_32"})])
        session.flush()
        session.add_all([_worker("tf-2", "v100", 128, 0.105, "tf1-graph", 1.0),
                         _worker("pt-2", "v100", 128, 0.04, "pytorch-eager+torchjob", 2.0, compute_s=0.035),
                         _worker("mixed-2", "v100", 128, 0.09, "pytorch-eager+torchjob", 3.0),
                         _worker("mixed-2", "v100", 128, 0.09, "torch-compile", 4.0)])
        session.add(Event(job_id="pt-2", entity="note", to_status="resplit", at=5.0,
                          reason='re-split at step 40: batches by slot {"0": 30} from {"0": 48}; '
                                 'compute s by slot {"0": 0.2}'))
        session.commit()
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "model", "calibrate", "--from-db"],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "v100/tf1-graph" in text and "v100/pytorch-eager+torchjob" in text, text
    assert "job mixed-2 left out" in text, text


def test_a_finished_real_job_refines_the_next_plans_calibration_and_an_emulated_one_is_kept_apart() -> None:
    from orchestrator.control.calibration_fold import fold_finished_job
    from orchestrator.store.models import Calibration as CalibrationRow

    with open_session() as session:
        session.add_all([_job("pt-3", "gce", {"framework": "pytorch", "hparam_set": "resnet_cifar_32"}),
                         _job("emu-3", "local", {"framework": "pytorch", "hparam_set": "resnet_cifar_32"})])
        session.flush()
        session.add_all([_worker("pt-3", "v100", 128, 0.05, "pytorch-eager+torchjob", 1.0, compute_s=0.04),
                         _worker("emu-3", "v100", 48, 0.2, "pytorch-eager+torchjob", 2.0, compute_s=0.1)])
        session.commit()
        real, emulated = (session.get(Job, "pt-3"), session.get(Job, "emu-3"))
        assert real is not None and emulated is not None
        said = fold_finished_job(session, real)
        assert said.startswith("calibration ") and "refined on 1 measured" in said, said
        assert "emulated GPUs" in fold_finished_job(session, emulated)
        rows = session.query(CalibrationRow).all()
        assert len(rows) == 1 and json.loads(rows[0].params)["name"].startswith("auto after pt-3")
    # ... and the next plan of a PyTorch job on that GPU reads it: the key the fold fitted is the one its
    # runtime looks up (before 2026-11-28 every job was planned under tf1-graph, and never read it)
    from orchestrator.cli.model_impl import latest_calibration
    from orchestrator.costmodel.batches import job_runtime
    from orchestrator.model.spec import validate_spec

    calib = latest_calibration()
    assert calib is not None
    spec = validate_spec({"name": "next", "provider": {"kind": "gce", "project": "my-project-1"},
                          "storage": "gs://my-bucket/runs", "training": {"framework": "pytorch", "mode": "sync"},
                          "search": {"gpus": ["v100"], "max_workers": 1}, "pricing": {"book": "2026-11"}})
    key, _ = calib.lookup("v100", job_runtime(spec.training), "resnet_cifar_32")
    assert key == "v100/pytorch-eager+torchjob" and calib.points[key] == 1


def test_a_model_never_profiled_here_is_left_out_and_does_not_stop_the_next_fold() -> None:
    """A finished job of a user's model whose profile this machine never made is named, not fitted; the
    next job's fold goes on without it (before, its UnknownModelError stopped every later fold)."""
    from orchestrator.control.calibration_fold import fold_finished_job

    user = {"job": "run", "run": "python train.py", "model": {"torch": "not_profiled_pkg.mod:build"}}
    with open_session() as session:
        session.add_all([_job("user-4", "gce", user),
                         _job("pt-4", "gce", {"framework": "pytorch", "hparam_set": "resnet_cifar_32"})])
        session.flush()
        session.add_all([_worker("user-4", "v100", 64, 0.2, "pytorch-eager", 1.0),
                         _worker("pt-4", "v100", 128, 0.05, "pytorch-eager+torchjob", 2.0, compute_s=0.04)])
        session.commit()
        rows = {r["job_id"]: r for r in step_time_measurements(session)}
        assert rows["user-4"]["model"] == "torch:not_profiled_pkg.mod:build"  # the cost model's name of it
        user_job, pt_job = session.get(Job, "user-4"), session.get(Job, "pt-4")
        assert user_job is not None and pt_job is not None
        said = fold_finished_job(session, user_job)
        assert "no cost-model profile of torch:not_profiled_pkg.mod:build" in said, said
        said = fold_finished_job(session, pt_job)
        assert "refined on 1 measured" in said, said
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "model", "calibrate", "--from-db"],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "step times of torch:not_profiled_pkg.mod:build left out" in text, text


def test_a_run_script_that_reports_its_workers_steps_is_folded_under_its_own_model(tmp_path: Path) -> None:
    """docs/pytorch.md: a `run:` script's step line with runtime, precision and per-worker timings is stored as
    the built-in job's are, named by the spec's `torch:` model, and folded once that model has a profile."""
    from dataclasses import replace

    from orchestrator.control.calibration_fold import fold_finished_job
    from orchestrator.costmodel.compute import model_profile
    from orchestrator.costmodel.profiles.user import register_profile

    storage = LocalStorage(str(tmp_path), "s")
    line = {"kind": "step", "t": 10.0, "step": 40, "loss": 0.5, "runtime": "pytorch-eager", "precision": "bf16",
            "workers": {"0": {"batch": 64, "step_time_s": 0.21}}}
    (tmp_path / "s" / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    slot = Slot(role=Role.WORKER, index=0, gpu="v100", machine_type="n1-standard-8", zone="us-central1-a",
                spot=False, price_per_hour=1.0, batch=64)
    user = {"job": "run", "run": "python train.py", "model": {"torch": "tests_loop_pkg.mod:build"}}
    with open_session() as session:
        session.add(_job("run-5", "gce", user))
        session.flush()
        job = session.get(Job, "run-5")
        assert job is not None
        ingest_metrics(session, job, storage, [slot])
        session.commit()
        (row,) = step_time_measurements(session, ["run-5"])
        assert (row["model"], row["runtime"], row["precision"], row["batch"]) == (
            "torch:tests_loop_pkg.mod:build", "pytorch-eager", "bf16", 64)
        register_profile(replace(model_profile("resnet_cifar_20"), name=row["model"]))  # as `plan` leaves it
        said = fold_finished_job(session, job)
        assert "refined on 1 measured" in said, said


def test_a_clouds_plan_reads_the_newest_real_calibration_past_a_newer_emulated_one() -> None:
    """One rule for every reader: a cloud's GPUs are planned from the newest calibration of real GPUs, even when
    a local job's (emulated) calibration is newer; a local plan reads the newest of any kind. (Before
    2026-11-28 `plan` fell back to the shipped calibration there, and skipped the real one.)"""
    from dataclasses import replace

    from orchestrator.cli.model_impl import latest_calibration
    from orchestrator.cli.model_torch import latest_real_calibration
    from orchestrator.costmodel.compute import DEFAULT_CALIBRATION
    from orchestrator.store.models import Calibration as CalibrationRow

    real = DEFAULT_CALIBRATION.with_meta(name="real-refined")
    emulated = replace(DEFAULT_CALIBRATION, name="this-host", emulated=True)
    with open_session() as session:
        for at, calib in ((1.0, real), (2.0, emulated)):
            session.add(CalibrationRow(name=calib.name, source="test", params=json.dumps(calib.to_dict()),
                                       mape=None, created_at=at))
        session.commit()
    newest, newest_real = latest_calibration(), latest_calibration(real=True)
    assert newest is not None and newest.name.startswith("this-host (DB id ")
    assert newest_real is not None and newest_real.name.startswith("real-refined (DB id ")
    assert latest_real_calibration().name == newest_real.name


def test_launch_plans_with_the_calibration_plan_showed(tmp_path: Path) -> None:
    """`launch` (and its dry run) plans with the stored calibration `plan` reads, so it provisions the cluster
    `plan` chose: here a refined calibration that makes the T4 slow moves both to the L4. (Before
    2026-11-28 `launch` planned with the shipped calibration whatever the DB held.)"""
    from dataclasses import replace

    from orchestrator.costmodel.compute import DEFAULT_CALIBRATION, Efficiency
    from orchestrator.store.models import Calibration as CalibrationRow

    doc = {"name": "agree", "provider": {"kind": "gce", "project": "my-project-1", "zones": ["us-central1-a"]},
           "storage": "gs://my-bucket/runs",
           "training": {"job": "resnet-cifar", "hparam_set": "resnet_cifar_32", "mode": "sync",
                        "train_steps": 2000, "batch_per_worker": 128},
           "search": {"gpus": ["t4", "l4"], "max_workers": 1, "spot": [True]}, "pricing": {"book": "current"}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp_path / "home"),
           "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path / 'results.db'}"}

    def chosen() -> tuple[str, str]:
        cli = [sys.executable, "-m", "orchestrator.cli.main"]
        plan = subprocess.run([*cli, "plan", str(path), "--format", "json"], env=env, capture_output=True,
                              text=True, timeout=180)
        dry = subprocess.run([*cli, "launch", "--dry-run", str(path)], env=env, capture_output=True, text=True,
                             timeout=180)
        assert plan.returncode == 0 and dry.returncode == 0, plan.stderr + dry.stderr
        planned = json.loads(plan.stdout)["chosen"]["workers"][0]["gpu"]
        body = json.loads(dry.stdout[dry.stdout.index("{"):])["instances.insert"][0]["body"]
        return planned, body["machineType"].rsplit("/", 1)[1]

    assert chosen() == ("t4", "n1-standard-4")  # the shipped calibration: the T4 is the cheaper
    slow_t4 = replace(DEFAULT_CALIBRATION, name="refined", per_gpu={
        **DEFAULT_CALIBRATION.per_gpu, "t4/tf1-graph": Efficiency(0.05, 0.05, 2.0)})
    with open_session(env["ORCHESTRATOR_DB_URL"]) as session:
        session.add(CalibrationRow(name="refined", source="test", params=json.dumps(slow_t4.to_dict()), mape=None,
                                   created_at=1.0))
        session.commit()
    assert chosen() == ("l4", "g2-standard-4")


def _slow_t4(name: str) -> Any:
    """A refined calibration whose T4 runs resnet_cifar_32 at 2 s a step (the shipped one: ~0.15 s)."""
    from dataclasses import replace

    from orchestrator.costmodel.compute import DEFAULT_CALIBRATION, Efficiency

    return replace(DEFAULT_CALIBRATION, name=name, per_gpu={
        **DEFAULT_CALIBRATION.per_gpu, "t4/tf1-graph": Efficiency(0.05, 0.05, 2.0)})


def _store_calibration(calibration: Any, created_at: float, url: str | None = None) -> None:
    from orchestrator.store.models import Calibration as CalibrationRow

    with open_session(url) as session:
        session.add(CalibrationRow(name=calibration.name, source="test", params=json.dumps(calibration.to_dict()),
                                   mape=None, created_at=created_at))
        session.commit()


def _deadline_job(job_id: str, created_at: float) -> tuple[Any, Job]:
    """A one-T4 spot job with ``on_revocation: deadline``, and its row created at ``created_at``."""
    from orchestrator.model.spec import validate_spec

    doc = {"name": job_id,
           "provider": {"kind": "gce", "project": "my-project-1", "zones": ["us-central1-a"]}, "storage": "gs://my-bucket/runs",
           "training": {"job": "resnet-cifar", "hparam_set": "resnet_cifar_32", "mode": "sync",
                        "train_steps": 2000, "batch_per_worker": 128},
           "cluster": {"workers": [{"gpu": "t4", "count": 1, "spot": True}]}, "pricing": {"book": "current"},
           "policy": {"deadline": "30h", "on_revocation": "deadline"}}
    return validate_spec(doc), Job(
        id=job_id, name=job_id, provider="gce", mode="sync", cluster_shape="1", spec_yaml=yaml.safe_dump(doc),
        storage_uri="gs://b/x", price_book="current", status="running", train_steps=2000, created_at=created_at,
        updated_at=created_at)


def test_the_daemon_plans_a_deadline_job_with_the_calibration_launch_used() -> None:
    """`on_revocation: deadline`: the work the daemon plans with (and `report` shows) comes from the stored
    calibration `launch` planned with, not the shipped one."""
    from orchestrator.control.deadline import planned_figures
    from orchestrator.sim.availability import deadline_figures

    spec, job = _deadline_job("slow-t4-deadline", created_at=2.0)
    slow_t4 = _slow_t4("refined")
    _store_calibration(slow_t4, created_at=1.0)
    with open_session() as session:
        planned = planned_figures(session, job, spec).work_s
    shipped = deadline_figures(spec).work_s
    assert planned == pytest.approx(deadline_figures(spec, calibration=slow_t4).work_s, rel=1e-9)
    assert planned > 5 * shipped  # 2 s a step against the shipped T4's ~0.15 s


def test_a_fold_during_a_deadline_job_leaves_its_planned_figures_alone() -> None:
    """A calibration stored after a job was launched (another job's fold) is the next launch's, not this job's:
    a daemon that already planned it and one started after the fold plan it alike (before 2026-11-28 each
    daemon read the newest calibration when it first saw the job, so two daemons could disagree)."""
    from orchestrator.control import deadline
    from orchestrator.sim.availability import deadline_figures

    spec, job = _deadline_job("fold-during-deadline", created_at=10.0)
    _store_calibration(_slow_t4("refined after launch"), created_at=11.0)
    shipped = deadline_figures(spec).work_s
    with open_session() as session:
        planned = deadline.DeadlineCache()  # the daemon that planned it before the fold
        assert deadline.planned_figures(session, job, spec, planned).work_s == pytest.approx(shipped, rel=1e-9)
        assert deadline.planned_figures(session, job, spec, planned).work_s == pytest.approx(shipped, rel=1e-9)
        after = deadline.DeadlineCache()  # a daemon started after the fold
        assert deadline.planned_figures(session, job, spec, after).work_s == pytest.approx(shipped, rel=1e-9)


def test_a_pinned_global_batch_is_split_by_the_calibration_the_launch_plans_with(tmp_path: Path) -> None:
    """A pinned sync cluster's global batch is split by the speeds of the calibration the job is planned with,
    in the plan `launch` stores and in the planner's figures alike (before 2026-11-28: the shipped one's)."""
    from dataclasses import replace

    from orchestrator.costmodel.compute import DEFAULT_CALIBRATION, Efficiency
    from orchestrator.planning.admission import judge_file

    doc = {"name": "split", "provider": {"kind": "gce", "project": "my-project-1", "zones": ["us-central1-a"]},
           "storage": "gs://my-bucket/runs",
           "training": {"job": "resnet-cifar", "hparam_set": "resnet_cifar_32", "mode": "sync",
                        "train_steps": 1000, "global_batch": 256},
           "cluster": {"workers": [{"gpu": "t4", "count": 1}, {"gpu": "l4", "count": 1}]},
           "pricing": {"book": "current"}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    slow_t4 = replace(DEFAULT_CALIBRATION, name="refined", per_gpu={
        **DEFAULT_CALIBRATION.per_gpu, "t4/tf1-graph": Efficiency(0.01, 0.01, 0.05)})

    def split(calibration: object) -> tuple[list[int], list[int]]:
        checked = judge_file(path, calibration=calibration)  # type: ignore[arg-type]
        assert checked.estimate is not None
        return list(checked.plan.worker_batches), [w.batch for w in checked.estimate.workers]

    (shipped, shown), (refined, shown_refined) = split(None), split(slow_t4)
    assert sum(shipped) == sum(refined) == 256
    assert shown == shipped and shown_refined == refined  # the plan shows what the launch runs
    assert refined[0] < shipped[0]  # the slower T4 gets fewer examples


def test_model_predict_reads_the_calibration_plan_reads(tmp_path: Path) -> None:
    """`model predict --model` without --calibration predicts with the newest stored calibration of real GPUs,
    as `plan` plans a cloud's GPUs (before 2026-11-28: always the shipped one, so it disagreed with `plan`)."""
    env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp_path / "home"),
           "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path / 'results.db'}"}

    def predicted() -> dict[str, object]:
        out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "model", "predict", "--model",
                              "resnet_cifar_32", "--gpu", "t4", "--batch", "128", "--json"], env=env,
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    shipped = predicted()
    _store_calibration(_slow_t4("refined"), created_at=1.0, url=env["ORCHESTRATOR_DB_URL"])
    refined = predicted()
    assert "refined (DB id 1)" in str(refined["calibration"]) and "refined" not in str(shipped["calibration"])
    assert float(str(refined["step_time_s"])) > 5 * float(str(shipped["step_time_s"]))
