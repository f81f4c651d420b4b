"""PyTorch on the local provider end to end: real torchrun, gloo, DCP checkpoints (slow: ~3 min together).

Kept as real-payload tests (issue 53), each for a payload contract: PyTorch drain, shrink and grow
(shrinks_and_grows), a pipeline stage loss (survives the revocation of a stage), the own-script contract
(own_script_runs_to_exit_zero). The resplit and re-partition tests are the extended tier (`.ci/run --extended`):
their daemon side runs fast-forwarded in tests/test_ff_torch.py (tests/fastforward_torch.py speaks the PyTorch
payload's protocol: world events, rebalance, stages).

- examples/local-torch-hetero.yaml (fewer steps): three emulated GPU types, a spot worker revoked; every
  rank checkpoints on the notice, the world shrinks 3 -> 2, the replacement joins and it grows 2 -> 3;
  accuracy in the DB, the ledger has a row per instance, nothing left running.
- examples/local-own-script.yaml: a plain DDP script under torchrun; exit 0 ends the job, its JSON metric
  lines land in the DB, the spec's env and secret reach it, and the secret's value is stored nowhere.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, cli, processes_under
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.slow
pytest.importorskip("torch")


def _env(tmp_path: Path) -> dict[str, str]:
    return {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/results.db"}


def _spec(tmp_path: Path, example: str, provider: dict[str, object] | None = None, **training: object) -> Path:
    spec = yaml.safe_load((REPO / "examples" / example).read_text())
    spec["storage"] = str(tmp_path / "runs")
    spec["provider"].update(provider or {})
    spec["training"].update(training)
    path = tmp_path / example
    path.write_text(yaml.safe_dump(spec))
    return path


def test_torch_hetero_shrinks_and_grows(tmp_path: Path) -> None:
    env = _env(tmp_path)
    # The replacement boots in 35 s: revoke early enough that it joins well before the 300th step (it joined at step
    # 112 here, 2026-12-06; about 170 where every step ran at its emulated floor). On the progress clock (at_step), so
    # a loaded host that trains slowly is revoked mid-training all the same.
    spec = _spec(tmp_path, "local-torch-hetero.yaml", {"schedule": [{"instance": "worker-1", "at_step": 30}]},
                 train_steps=300)
    out = cli("launch", str(spec), "--quiet", env=env, timeout=540)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        notes = conn.execute(text("SELECT to_status, reason FROM events WHERE entity = 'note' ORDER BY at, id")).all()
        instances = conn.execute(text("SELECT COUNT(*) FROM instances")).scalar()
        ledger = conn.execute(text("SELECT COUNT(*), SUM(seconds) FROM ledger")).one()
    assert summary["status"] == "succeeded" and summary["accuracy"] > 0.5, summary
    assert summary["revocations"] == 1 and summary["replacements"] == 1
    kinds = [n[0] for n in notes]
    assert "ckpt_on_notice" in kinds, notes
    shrink = [r for k, r in notes if k == "shrink"]
    grow = [r for k, r in notes if k == "grow"]
    assert shrink and shrink[0].startswith("world 3 -> 2"), notes
    assert grow and grow[0].startswith("world 2 -> 3") and kinds.index("shrink") < kinds.index("grow")
    assert ledger[0] == instances == 4 and ledger[1] > 0  # every instance billed, the revoked one included
    assert processes_under(tmp_path) == []
    report = cli("report", env=env).stdout
    assert "3@0 → 2@" in report and "pytorch" in report


def test_own_script_runs_to_exit_zero(tmp_path: Path) -> None:
    env = {**_env(tmp_path), "DEMO_TOKEN": "s3cr3t-v4lue"}
    shutil.copytree(REPO / "examples" / "own-script", tmp_path / "own-script")  # files: are relative to the spec
    out = cli("launch", str(_spec(tmp_path, "local-own-script.yaml", run="python train.py --steps 100")),
              "--quiet", env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    db = tmp_path / "results.db"
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        job = conn.execute(text("SELECT status, accuracy, final_step, restarts FROM jobs")).mappings().one()
        steps = conn.execute(text("SELECT COUNT(*) FROM metrics WHERE kind = 'step'")).scalar()
    assert job["status"] == "succeeded" and job["restarts"] == 0 and job["final_step"] == 100, job
    assert job["accuracy"] > 0.8 and steps >= 5
    logs = "".join(p.read_text() for p in tmp_path.glob("runs/*/logs/*.log"))
    assert "lr 0.05" in logs and "DEMO_TOKEN: 12 chars" in logs  # env: and the secret reached the script
    for path in [db, *tmp_path.glob("runs/**/*")]:
        if path.is_file():
            assert b"s3cr3t-v4lue" not in path.read_bytes(), path
    assert processes_under(tmp_path) == []


def test_missing_secret_fails_before_anything_is_created(tmp_path: Path) -> None:
    env = _env(tmp_path)
    spec = _spec(tmp_path, "local-own-script.yaml", files=[], secrets=[{"name": "TOKEN", "file": "/nonexistent/t"}])
    out = cli("launch", str(spec), "--quiet", env=env, timeout=60)
    assert out.returncode != 0 and "training.secrets" in out.stderr + out.stdout
    assert "nothing was created" in out.stderr + out.stdout


@pytest.mark.extended
def test_a_running_job_resplits_when_a_worker_slows(tmp_path: Path) -> None:
    """examples/local-torch-resplit.yaml, shorter: worker 0 (the V100) slows 4x at step 30; the ranks time their
    own compute every 10 steps and move examples off it. `report --format json` lists each re-split. Worker 1
    is 1.25x slower from step 0: its rank probes its own compute alone right after the first step (which once
    hung the world in DDP's bucket rebuild)."""
    import json

    env = _env(tmp_path)
    slowdowns = [{"worker": 0, "at_step": 30, "factor": 4}, {"worker": 1, "at_step": 0, "factor": 1.25}]
    spec = _spec(tmp_path, "local-torch-resplit.yaml", {"slowdowns": slowdowns},
                 train_steps=150, resplit_every=10, checkpoint_every=150)
    out = cli("launch", str(spec), "--quiet", env=env, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(cli("report", "--format", "json", env=env).stdout)[0]
    after = [r for r in report["resplits"] if r["step"] > 30]
    assert after, report["resplits"]
    planned = report["worker_batches"]["0"]["planned"]
    assert after[-1]["batches"]["0"] < planned, (planned, after)  # the slowed V100 gave examples away
    assert all(sum(r["batches"].values()) == 96 for r in report["resplits"])  # the global batch never changes
    assert report["worker_batches"]["0"]["reported"] == after[-1]["batches"]["0"]
    assert processes_under(tmp_path) == []


def test_a_pipeline_survives_the_revocation_of_a_stage(tmp_path: Path) -> None:
    """examples/local-pipeline.yaml, shorter: three stages sized to three emulated GPUs; the P100 stage is revoked,
    every stage checkpoints on the notice, the pipeline waits for the replacement and trains on to the end."""
    env = _env(tmp_path)
    # at_step: mid-training however slowly a loaded host boots and trains (at_s 40 once came before training).
    spec = _spec(tmp_path, "local-pipeline.yaml", {"schedule": [{"instance": "worker-1", "at_step": 30}]},
                 train_steps=120, checkpoint_every=60)
    out = cli("launch", str(spec), "--quiet", env=env, timeout=540)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        kinds = [r[0] for r in conn.execute(text("SELECT to_status FROM events WHERE entity = 'note'")).all()]
    assert summary["status"] == "succeeded" and summary["revocations"] == 1 and summary["replacements"] == 1
    assert summary["accuracy"] > 0.5, summary
    assert "ckpt_on_notice" in kinds
    assert processes_under(tmp_path) == []


@pytest.mark.extended
def test_a_pipeline_re_partitions_over_the_survivors_where_waiting_is_dearer(tmp_path: Path) -> None:
    """examples/local-pipeline-repartition.yaml, shorter: the P100 stage is revoked; waiting for its replacement is
    predicted dearer than going on over the V100 and the K80, so the controller records both options, replaces
    nothing, and restarts the survivors as a 2-stage pipeline that resumes from the notice's checkpoint."""
    env = _env(tmp_path)
    # The P100 goes mid-training (the progress clock: at step 30, however loaded the host).
    spec = _spec(tmp_path, "local-pipeline-repartition.yaml", {"schedule": [{"instance": "worker-1", "at_step": 30}]},
                 train_steps=120, checkpoint_every=60)
    out = cli("launch", str(spec), "--quiet", env=env, timeout=540)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        notes = conn.execute(text("SELECT to_status, reason FROM events WHERE entity = 'note' ORDER BY at, id")).all()
    assert summary["status"] == "succeeded" and summary["revocations"] == 1 and summary["replacements"] == 0
    assert summary["accuracy"] > 0.5, summary
    kinds = [k for k, _ in notes]
    decided = [r for k, r in notes if k == "repartition"]
    assert len(decided) == 1 and "Predicted: wait" in decided[0], notes
    assert "re-partition over worker-0, worker-2" in decided[0], decided
    assert "ckpt_on_notice" in kinds and kinds.index("ckpt_on_notice") < kinds.index("restart"), notes
    shrink = [r for k, r in notes if k == "shrink"]  # the 2-stage world, stages worker-0 and worker-2
    assert shrink and shrink[-1].startswith("world 3 -> 2") and '"1"' not in shrink[-1] and "grow" not in kinds, notes
    noticed = [r for k, r in notes if k == "ckpt_on_notice"][0]
    resumed = int(shrink[-1].split(" at step ")[1].split(";")[0])
    assert resumed > 0 and f"at step {resumed}:" in noticed, (noticed, shrink)  # from the notice's checkpoint
    assert processes_under(tmp_path) == []
