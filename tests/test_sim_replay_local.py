"""Replay self-consistency: a finished local job, replayed from its own DB rows, reproduces its time and cost.

One short local-provider job (real TensorFlow, tiny model, a spot K80 worker revoked mid-training and
replaced) runs through the CLI; then ``replay_job`` and ``orchestrator simulate --replay JOB --json``
rebuild it from its event rows (revocation, boot, startup, rejoin, notice and teardown times) and its
measured step rates, and the simulated wall time and cost must land within 10% of the measured ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import cli, tiny_spec
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.slow
pytest.importorskip("tensorflow")

TOLERANCE = 0.10
REVOKE_AT_STEP = 160  # a third of the way: mid-training however slow TF's start-up is


def test_replay_reproduces_a_local_job_with_a_revocation(tmp_path: Path) -> None:
    env = {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/results.db"}
    spec = tmp_path / "job.yaml"
    # K80 sleeps 0.3 s a step, the V100 0.1 s: emulated speed, not this machine's CPU, sets most of the pace.
    spec.write_text(tiny_spec("replay", tmp_path / "runs", schedule=[("worker-0", REVOKE_AT_STEP)], steps=480,
                              emulation_k80_step_s=0.3))
    out = cli("launch", str(spec), "--quiet", env=env, timeout=500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
    assert summary["status"] == "succeeded" and summary["revocations"] == 1, dict(summary)
    job_id = str(summary["job_id"])

    from orchestrator.sim.replay_db import replay_job
    from orchestrator.store.db import open_session

    with open_session(env["ORCHESTRATOR_DB_URL"]) as session:
        result = replay_job(session, job_id)
    measured, sim = result["measured"], result["simulated"]
    assert measured["wall_time_s"] == pytest.approx(summary["wall_time_s"])
    assert measured["cost_usd"] == pytest.approx(summary["cost_usd"])
    # The revocation hit a training job, and its replacement stepped before the end.
    (revocation,) = result["schedule"]
    assert revocation["slot"] == "worker-0"
    assert measured["first_step_at_s"] < revocation["at_s"] < measured["last_step_at_s"]
    assert set(result["set_rates"]) == {"worker-0,worker-1", "worker-1"}
    delays = result["delays"]
    assert delays["startup_s"] > 0 and delays["rejoin_s"] > 0 and delays["teardown_s"] > 0

    assert sim["finished"] and sim["revocations"] == 1 and sim["replacements"] == 1
    assert sim["steps_done"] == pytest.approx(480)
    report = (f"measured {measured['wall_time_s']:.1f} s ${measured['cost_usd']:.5f}, simulated "
              f"{sim['wall_time_s']:.1f} s ${sim['cost_usd']:.5f}; delays {delays}; "
              f"rates {result['set_rates']}")
    assert sim["wall_time_s"] == pytest.approx(measured["wall_time_s"], rel=TOLERANCE), report
    assert sim["cost_usd"] == pytest.approx(measured["cost_usd"], rel=TOLERANCE), report
    for role, usd in measured["cost_by_role_usd"].items():
        assert sim["cost_by_role_usd"][role] == pytest.approx(usd, rel=TOLERANCE), role

    # The CLI gives the same replay as JSON.
    out = cli("simulate", "--replay", job_id, "--json", env=env, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    via_cli = json.loads(out.stdout)["replay"]
    assert via_cli["job_id"] == job_id
    assert via_cli["simulated"]["wall_time_s"] == pytest.approx(sim["wall_time_s"])
    assert via_cli["simulated"]["cost_usd"] == pytest.approx(sim["cost_usd"])
    assert via_cli["measured"]["wall_time_s"] == pytest.approx(measured["wall_time_s"])
    print(report)
