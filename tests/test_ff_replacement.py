"""Revocation, replacement and a daemon restart, fast-forwarded (tests/fastforward.py): the decisions
tests/test_local_e2e.py checked with real TensorFlow (the payload's own contract stays in tests/jobs and the
README demo), on a virtual clock, in seconds, the same every run."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import tiny_spec
from fastforward import fast_forward, spec_of
from sqlalchemy import create_engine, text


def _ledger_exact(tmp_path: Path, job_id: str) -> None:
    with create_engine(f"sqlite:///{tmp_path}/results.db").connect() as conn:
        rows = conn.execute(text(
            "SELECT i.name, i.requested_at, i.deleted_at, i.price_per_hour, i.end_reason, l.usd "
            "FROM instances i LEFT JOIN ledger l ON l.instance_id = i.id WHERE i.job_id = :j"), {"j": job_id}).all()
        total = conn.execute(text("SELECT cost_usd FROM job_summary WHERE job_id = :j"), {"j": job_id}).scalar()
        dup_metrics = conn.execute(text(
            "SELECT COUNT(*) FROM (SELECT kind, step, worker, at FROM metrics GROUP BY kind, step, worker, at "
            "HAVING COUNT(*) > 1) d")).scalar()
    assert rows and dup_metrics == 0
    expected = 0.0
    for name, requested, deleted, price, end_reason, usd in rows:
        assert deleted is not None, f"{name} was never deleted"
        billed = 0.0 if end_reason == "create_failed" else (deleted - requested) * price / 3600
        assert usd == pytest.approx(billed, rel=1e-9, abs=1e-12), name
        expected += billed
    assert total == pytest.approx(expected)


def _survived(run_events: list[tuple[str, str, str | None, str | None, float]]) -> None:
    kinds = [(e[0], e[1]) for e in run_events]
    revoked_at = kinds.index(("instance", "revoked"))
    assert ("job", "running") in kinds[:revoked_at]  # revoked mid-training ...
    assert ("job", "recovering") in kinds[revoked_at:] and ("job", "running") in kinds[revoked_at + 1:]  # ... survived
    assert [k for k in kinds if k[0] != "note"][-1] == ("job", "succeeded")


def test_local_job_survives_a_revocation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_of(tiny_spec("e2e", tmp_path / "runs", schedule=[("worker-0", 200)], steps=800))
    run = fast_forward(spec, tmp_path, monkeypatch)
    assert run.job["status"] == "succeeded", run.timeline()
    _survived(run.events)
    lost = [n for n, i in run.instances.items() if i["end_reason"] == "preempted"]
    assert [run.instances[n]["slot"] for n in lost] == ["worker-0"], run.timeline()
    # its replacement: the same slot, the next generation, trained to the end
    assert any(i["slot"] == "worker-0" and i["generation"] == 1 and i["end_reason"] == "job_finished"
               for i in run.instances.values()), run.instances
    _ledger_exact(tmp_path, run.job["id"])


def test_daemon_killed_mid_job_and_restarted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_of(tiny_spec("sigkill", tmp_path / "runs", schedule=[("worker-0", 200)], steps=800))
    run = fast_forward(spec, tmp_path, monkeypatch, interval_s=1.0, restart_daemon_at=30.0)
    assert run.job["status"] == "succeeded", run.timeline()
    assert run.job["final_step"] == 800
    _survived(run.events)
    assert len(run.notes("driver")) == 1  # the restarted daemon (same id) took its own lease back ...
    _ledger_exact(tmp_path, run.job["id"])
    plain = fast_forward(spec_of(tiny_spec("sigkill", tmp_path / "runs2", schedule=[("worker-0", 200)], steps=800)),
                         tmp_path / "plain", monkeypatch, interval_s=1.0)
    assert run.wall_s <= plain.wall_s + 2.0, (run.wall_s, plain.wall_s)  # ... at once: no lease to wait out


def test_chief_on_worker0_revoked_rolls_training_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = tiny_spec("onw0", tmp_path / "runs", schedule=[("worker-0", 100)], steps=400)
    spec = spec_of(raw.replace("  parameter_servers: {count: 1}",
                               "  parameter_servers: {count: 1}\n  chief: {on_worker0: true}"))
    run = fast_forward(spec, tmp_path, monkeypatch)
    assert run.job["status"] == "succeeded", run.timeline()
    assert sorted({i["slot"].split("-")[0] for i in run.instances.values()}) == ["ps", "worker"]  # no chief VM
    restarts = [e[2] or "" for e in run.notes("restart")]
    assert any("worker-0" in r for r in restarts), run.timeline()  # worker 0 took the chief down with it
    _ledger_exact(tmp_path, run.job["id"])
