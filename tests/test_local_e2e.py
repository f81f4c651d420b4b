"""The whole loop on one machine with real TensorFlow: revocation survived, ledger exact, nothing left.

Kept as real-payload tests (issue 53), each for a payload contract: the TF notice, checkpoint and resume through a
real launch (the README's demo path: launch, report, logs), and (the extended tier) the chief in worker 0's own
process. The daemon's decisions (replacement, a daemon restart, chief-on-worker0's roll-back) run fast-forwarded in
tests/test_ff_replacement.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import cli, processes_under, tiny_spec
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.slow
pytest.importorskip("tensorflow")


def _env(tmp_path: Path) -> dict[str, str]:
    return {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/results.db"}


def _check_ledger_exact(db_url: str, job_id: str) -> None:
    with create_engine(db_url).connect() as conn:
        rows = conn.execute(text(
            "SELECT i.name, i.requested_at, i.deleted_at, i.price_per_hour, i.end_reason, l.usd, l.seconds "
            "FROM instances i LEFT JOIN ledger l ON l.instance_id = i.id WHERE i.job_id = :j"), {"j": job_id}).all()
        total = conn.execute(text("SELECT cost_usd FROM job_summary WHERE job_id = :j"), {"j": job_id}).scalar()
        by_role = conn.execute(text("SELECT SUM(usd) FROM ledger WHERE job_id = :j"), {"j": job_id}).scalar()
    assert rows
    expected = 0.0
    for name, requested, deleted, price, end_reason, usd, _seconds in rows:
        assert deleted is not None, f"{name} was never deleted"
        billed = 0.0 if end_reason == "create_failed" else (deleted - requested) * price / 3600
        assert usd == pytest.approx(billed, rel=1e-9, abs=1e-12), name
        expected += billed
    assert total == pytest.approx(expected) and by_role == pytest.approx(expected)


def test_local_job_survives_a_revocation(tmp_path: Path) -> None:
    env = _env(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(tiny_spec("e2e", tmp_path / "runs", schedule=[("worker-0", 200)], steps=800))
    out = cli("launch", str(spec), "--quiet", env=env, timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    db_url = env["ORCHESTRATOR_DB_URL"]
    with create_engine(db_url).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        events = conn.execute(text("SELECT entity, to_status, reason FROM events ORDER BY at, id")).all()
    assert summary["status"] == "succeeded", summary
    assert summary["accuracy"] > 0.3  # 10 classes: chance is 0.1
    assert summary["revocations"] >= 1 and summary["replacements"] >= 1
    assert summary["wall_time_s"] > 0 and summary["cost_usd"] > 0
    kinds = [(e[0], e[1]) for e in events]
    revoked_at = kinds.index(("instance", "revoked"))
    assert ("job", "running") in kinds[:revoked_at]  # revoked mid-training ...
    assert ("job", "recovering") in kinds[revoked_at:] and ("job", "running") in kinds[revoked_at + 1:]  # ... survived
    assert kinds[-1] == ("note", "calibration")  # after it succeeded: what its step times did to the calibration
    assert [k for k in kinds if k[0] != "note"][-1] == ("job", "succeeded")
    _check_ledger_exact(db_url, summary["job_id"])
    assert processes_under(tmp_path) == []
    # report and logs read the same DB
    rep = cli("report", "--format", "json", env=env)
    assert json.loads(rep.stdout)[0]["revocations"] >= 1
    assert "revoked" in cli("logs", summary["job_id"], env=env).stdout
    out = cli("logs", summary["job_id"], "--instance", "worker-1", "-n", "5", env=env)  # its log, kept in storage
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"# {summary['job_id']}-worker-1-0 (deleted): the log kept in the job's storage")


@pytest.mark.extended
def test_chief_on_worker0_runs_in_worker0s_process(tmp_path: Path) -> None:
    # cluster.chief.on_worker0 (the ICAC'19 setup): no chief instance, no chief ledger row; worker 0's task
    # runs the chief, and worker 0's revocation rolls training back like a chief's would, then it finishes.
    env = _env(tmp_path)
    spec = tmp_path / "job.yaml"
    text_ = tiny_spec("onw0", tmp_path / "runs", schedule=[("worker-0", 100)], steps=400)
    spec.write_text(text_.replace("  parameter_servers: {count: 1}",
                                  "  parameter_servers: {count: 1}\n  chief: {on_worker0: true}"))
    out = cli("launch", str(spec), "--quiet", env=env, timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    db_url = env["ORCHESTRATOR_DB_URL"]
    with create_engine(db_url).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        roles = sorted(r[0] for r in conn.execute(text("SELECT DISTINCT role FROM instances")))
        ledger_roles = sorted(r[0] for r in conn.execute(text("SELECT DISTINCT role FROM ledger")))
        restarts = conn.execute(text("SELECT reason FROM events WHERE to_status = 'restart'")).scalars().all()
    assert summary["status"] == "succeeded" and summary["accuracy"] > 0.2, summary
    assert summary["cluster_shape"].startswith("1ps+chief@worker0+")
    assert roles == ["ps", "worker"] and ledger_roles == ["ps", "worker"], "no chief instance, no chief bill"
    assert summary["chief_cost_usd"] == 0.0 and summary["revocations"] >= 1
    assert any("worker-0" in r for r in restarts), restarts  # worker 0 took the chief down with it
    logs = "".join(f.read_text() for f in (tmp_path / "runs").glob("*/logs/*-worker-0-*.log"))
    assert "worker:0 runs the chief at" in logs and "done: step 400" in logs  # in worker 0's own task
    _check_ledger_exact(db_url, summary["job_id"])
    assert processes_under(tmp_path) == []
