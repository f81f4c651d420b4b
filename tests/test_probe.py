"""`orchestrator probe` (issue 55): the points it picks, the refusal past policy.budget_usd (exit 2, nothing
created), the ledger of its jobs, the clean-up after a probe that fails or is interrupted (SIGTERM), and the
plan built on what was measured (`plan --format json`: step_source measured | predicted)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, example_doc, processes_under, wait_until
from sqlalchemy import create_engine, text

from orchestrator.costmodel import DEFAULT_CALIBRATION
from orchestrator.costmodel.accounting import local_worker_steps
from orchestrator.costmodel.batches import memory_params
from orchestrator.costmodel.measured import MeasuredStep, point_key, with_points
from orchestrator.costmodel.memory import max_batch
from orchestrator.costmodel.stepmodel import step_fn
from orchestrator.model.spec import load_spec
from orchestrator.planning.admission import judge_file
from orchestrator.planning.calibration import latest_calibration
from orchestrator.planning.probe import candidate_points, probe_spec, second_batch
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.store import queries
from orchestrator.store.db import open_session
from tests.cli_inproc import run_cli

HETERO = REPO / "examples" / "local-hetero.yaml"


def _env(tmp_path: Path) -> dict[str, str]:
    """conftest's home and DB (tmp_path/home/orchestrator.db), which this process's store opens too."""
    (tmp_path / "home").mkdir(exist_ok=True)
    return {**os.environ, "COLUMNS": "160"}


def _hetero(tmp_path: Path, **policy: object) -> Path:
    doc = example_doc(HETERO, tmp_path)
    doc["policy"].update(policy)
    path = tmp_path / "hetero.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _command_spec(tmp_path: Path, command: str, gpus: tuple[str, ...] = ("k80",), budget: float = 5.0) -> Path:
    workers = ", ".join(f"{{gpu: {g}, count: 1, spot: true}}" for g in gpus)
    path = tmp_path / "job.yaml"
    path.write_text(f"""name: probed
provider: {{kind: local, time_scale: 600, revocations: none, emulation_k80_step_s: 0}}
storage: {tmp_path / 'runs'}
training: {{job: command, command: "{command}", mode: sync, train_steps: 10}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{workers}]
policy: {{on_revocation: replace, max_replacements: 0, budget_usd: {budget}}}
pricing: {{book: 2019-02}}
""")
    return path


def _measured(spec_path: Path, gpu: str, step_s: float, spread: float = 0.05) -> dict[str, MeasuredStep]:
    spec = load_spec(spec_path)
    key = point_key(gpu, "tf1-graph", spec.training.profile_name, 32)
    return {key: MeasuredStep(step_s, step_s * (1 - spread), step_s * (1 + spread), 6, "test")}


def test_a_measured_point_is_what_the_curve_passes_through() -> None:
    calib = with_points(DEFAULT_CALIBRATION, {point_key("v100", "tf1-graph", "resnet_cifar_15", 64):
                                              MeasuredStep(0.2, 0.19, 0.21, 6)}, "t", "t", emulated=False)
    before, after = step_fn("resnet_cifar_15", "v100", DEFAULT_CALIBRATION), step_fn("resnet_cifar_15", "v100", calib)
    assert after.at(64.0) == pytest.approx(0.2)
    assert after.at(128.0) / after.at(64.0) == pytest.approx(before.at(128.0) / before.at(64.0))  # same shape
    assert step_fn("resnet_cifar_15", "p100", calib).at(64.0) == step_fn("resnet_cifar_15", "p100").at(64.0)


def test_two_measured_batches_are_what_the_curve_passes_through_and_the_split_reads() -> None:
    key = functools.partial(point_key, "v100", "tf1-graph", "resnet_cifar_15")
    points = {key(64): MeasuredStep(0.2, 0.19, 0.21, 6), key(128): MeasuredStep(0.3, 0.29, 0.31, 6)}
    calib = with_points(DEFAULT_CALIBRATION, points, "t", "t", emulated=False)
    curve = step_fn("resnet_cifar_15", "v100", calib)
    assert [curve.at(64.0), curve.at(128.0)] == pytest.approx([0.2, 0.3])  # both, not their mean
    assert curve.host_s > step_fn("resnet_cifar_15", "v100").host_s  # the measured fixed part: host time
    assert 0.3 < curve.at(256.0) < 0.3 * 2  # past the measured batches: the fitted GPU part, not a scaled guess


def test_the_second_batch_is_double_where_it_fits_else_half(tmp_path: Path) -> None:
    spec = load_spec(_hetero(tmp_path))
    cap = max_batch(spec.training.profile_name, "k80", None, memory_params(spec))
    assert second_batch(spec, "k80", 32) == 64 and second_batch(spec, "k80", cap) == cap // 2
    assert second_batch(spec, "k80", 1) == 2


def test_a_local_probe_sets_the_workers_cpu_part(tmp_path: Path) -> None:
    spec = load_spec(_hetero(tmp_path))
    calib = with_points(DEFAULT_CALIBRATION, _measured(tmp_path / "hetero.yaml", "k80", 2.0), "t", "t", True)
    alone = local_worker_steps(spec, ["k80"], [32], calib, steps=step_model_for(spec))
    assert alone[0] == pytest.approx(2.0, rel=0.02)  # one worker alone: the measured step
    steps = step_model_for(spec)
    shared = local_worker_steps(spec, ["k80", "p100"], [32, 32], calib, steps=steps)
    assert shared[0] > local_worker_steps(spec, ["k80", "p100"], [32, 32], steps=steps)[0]  # measured CPU shared too


def test_points_are_the_plans_overlapping_candidates_unmeasured_and_on_spot(tmp_path: Path) -> None:
    path = _hetero(tmp_path)
    judged = judge_file(path)
    points, skipped = candidate_points(judged.spec, judged.result, None, 0.23)
    assert [(p[0], p[3], p[4]) for p in points] == [(g, b, True) for g in ("k80", "p100", "v100") for b in (32, 64)]
    calib = with_points(DEFAULT_CALIBRATION, _measured(path, "p100", 0.3), "t", "t", True)
    points, skipped = candidate_points(judged.spec, judged.result, calib, 0.23)
    assert [(p[0], p[3]) for p in points] == [("k80", 32), ("k80", 64), ("p100", 64), ("v100", 32), ("v100", 64)]
    assert skipped == ["p100 n1-standard-8 fp32 b32: measured already"]
    probe = probe_spec(judged.spec, "k80", "n1-standard-4", 32, True, None)
    assert probe.worker_count == 1 and probe.training.train_steps == 40 and probe.training.checkpoint_every > 40
    assert probe.training.hparam_set == judged.spec.training.hparam_set and probe.name == "local-demo-probe"


def test_probe_past_the_budget_is_refused_in_one_line_and_creates_nothing(tmp_path: Path) -> None:
    env = _env(tmp_path)
    out = run_cli(["probe", str(_hetero(tmp_path, budget_usd=0.001)), "--yes", "--json"], env, tmp_path)
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: policy.budget_usd:"), out.stderr
    assert "nothing was created" in errors[0] and out.stdout == ""
    assert not (tmp_path / "home" / "orchestrator.db").exists() and not (tmp_path / "runs").exists()


def test_probe_without_yes_and_no_terminal_creates_nothing(tmp_path: Path) -> None:
    out = run_cli(["probe", str(_hetero(tmp_path))], _env(tmp_path), tmp_path)
    assert out.returncode == 2 and "pass --yes" in out.stderr and "k80" in out.stderr, out.stderr
    assert not (tmp_path / "home" / "orchestrator.db").exists()


def test_plan_marks_measured_groups_and_reranks_on_them(tmp_path: Path) -> None:
    env = _env(tmp_path)
    path = _hetero(tmp_path)
    before = json.loads(run_cli(["plan", str(path), "--format", "json", "--host-load", "0"], env, tmp_path).stdout)
    assert {g["step_source"] for g in before["worker_groups"]} == {"predicted"}
    points = {**_measured(path, "k80", 1.5), **_measured(path, "p100", 0.4), **_measured(path, "v100", 0.35)}
    calib = with_points(DEFAULT_CALIBRATION, points, "probed", "test", emulated=True)
    with open_session() as session:  # as control.probe_run stores a probe's fold
        queries.save_calibration(session, "probed", "test", calib.to_dict(), None)
        session.commit()
    after = json.loads(run_cli(["plan", str(path), "--format", "json", "--host-load", "0"], env, tmp_path).stdout)
    groups = {g["gpu"]: g for g in after["worker_groups"]}
    assert {g["step_source"] for g in groups.values()} == {"measured"}
    k80 = groups["k80"]
    assert k80["measured_step_s"] == 1.5 and k80["step_low_s"] == pytest.approx(k80["step_s"] * 0.95)
    assert after["prediction_interval"]["kind"] == "measured"
    assert after["prediction_interval"]["relative"] == pytest.approx(0.05)
    assert after["chosen"]["time_s"] > before["chosen"]["time_s"]  # the slow measured K80 moved the plan


def _jobs(db_url: str) -> list[tuple[str, str, float]]:
    with create_engine(db_url).connect() as conn:
        return [(r[0], r[1], float(r[2] or 0)) for r in conn.execute(text(
            "SELECT j.id, j.status, (SELECT COUNT(*) FROM ledger l WHERE l.job_id = j.id) FROM jobs j"))]


def test_a_failed_probe_is_torn_down_billed_and_the_next_point_tried(tmp_path: Path) -> None:
    env = _env(tmp_path)
    out = run_cli(["probe", str(_command_spec(tmp_path, "exit 3", ("k80", "p100"))), "--yes", "--json",
                   "--poll", "0.2"], env, tmp_path)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert [p["gpu"] for p in doc["probes"]] == ["k80", "k80", "p100", "p100"]  # two batches a point
    assert len({(p["gpu"], p["batch"]) for p in doc["probes"]}) == 4
    assert all(set(p) == {"gpu", "machine_type", "precision", "batch", "step_ms", "steps", "wall_s", "cost_usd"}
               for p in doc["probes"])
    assert set(doc) == {"probes", "total_cost_usd"} and all(p["step_ms"] is None for p in doc["probes"])
    jobs = _jobs(env["ORCHESTRATOR_DB_URL"])
    assert len(jobs) == 4 and all(status == "failed" and ledger >= 1 for _, status, ledger in jobs), jobs
    with open_session() as session:  # every cent under the probe's job: the JSON is the ledger's sum
        ledger = sum(queries.job_cost(session, job_id)["total"] for job_id, _, _ in jobs)
    assert doc["total_cost_usd"] == pytest.approx(ledger) and ledger > 0
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        assert {r[0] for r in conn.execute(text("SELECT status FROM instances"))} == {"deleted"}
    assert processes_under(tmp_path) == []


def _training(db_url: str) -> bool:
    try:
        with create_engine(db_url).connect() as conn:
            return conn.execute(text("SELECT COUNT(*) FROM instances WHERE status = 'training'")).scalar() == 1
    except Exception:  # noqa: BLE001 - the DB may not exist yet
        return False


def test_sigterm_tears_the_running_probe_down_and_creates_no_later_one(tmp_path: Path) -> None:
    env = _env(tmp_path)
    spec = _command_spec(tmp_path, "sleep 600", ("k80", "p100"))
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "probe", str(spec), "--yes", "--poll",
                             "0.2"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: _training(env["ORCHESTRATOR_DB_URL"]), timeout=120)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    assert "Traceback" not in out
    jobs = _jobs(env["ORCHESTRATOR_DB_URL"])
    assert [status for _, status, _ in jobs] == ["cancelled"], (jobs, out)  # no later probe created
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        assert {r[0] for r in conn.execute(text("SELECT status FROM instances"))} == {"deleted"}
        owners = [r[0] for r in conn.execute(text("SELECT job_id FROM ledger"))]
    assert owners and set(owners) == {jobs[0][0]}, owners  # every cent of the VM's time under the probe's job
    with open_session() as session:
        assert queries.job_cost(session, jobs[0][0])["total"] > 0
    wait_until(lambda: processes_under(tmp_path) == [], timeout=20)


@pytest.mark.slow
@pytest.mark.extended  # a real torchrun launch beside the own-script contract's (test_torch_e2e); CI's 15 minutes
def test_a_probe_of_a_run_script_runs_it_and_folds_its_metric_lines(tmp_path: Path) -> None:
    """examples/local-own-script.yaml's train.py on one emulated V100, 60 steps a batch: its own metric lines
    (every 20 steps) are the timed windows; both batches folded into the calibration."""
    env = {**_env(tmp_path), "DEMO_TOKEN": "s3cr3t"}
    doc = example_doc(REPO / "examples" / "local-own-script.yaml", tmp_path)
    shutil.copy(REPO / "examples" / "own-script" / "train.py", tmp_path / "train.py")
    doc["training"].update(run="python train.py --steps 60", files=["train.py"])
    doc["cluster"]["workers"] = [{"gpu": "v100", "count": 1, "spot": True}]
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = run_cli(["probe", str(path), "--yes", "--json", "--poll", "0.2"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    probes = json.loads(out.stdout)["probes"]
    assert [(p["gpu"], p["batch"]) for p in probes] == [("v100", 32), ("v100", 64)]
    assert all(p["step_ms"] > 0 and p["steps"] == 40 for p in probes), probes
    calib = latest_calibration()
    assert calib is not None and len(calib.measured) == 2, calib
    assert all(m["source"].startswith("probe job ") for m in calib.measured.values())
