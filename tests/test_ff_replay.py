"""Replay self-consistency, fast-forwarded (tests/fastforward.py): a finished local job with a revocation, replayed
from its own DB rows (``sim.replay_db.replay_job``), reproduces its time and cost within 10%. What
tests/test_sim_replay_local.py checked on a real TensorFlow job, on a virtual clock: the same every run."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import tiny_spec
from fastforward import fast_forward, spec_of

from orchestrator.clock import VirtualClock
from orchestrator.sim.replay_db import replay_job
from orchestrator.store.db import open_session

TOLERANCE = 0.10


def test_replay_reproduces_a_local_job_with_a_revocation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_of(tiny_spec("replay", tmp_path / "runs", schedule=[("worker-0", 160)], steps=480,
                             emulation_k80_step_s=0.3))
    run = fast_forward(spec, tmp_path, monkeypatch)
    assert run.job["status"] == "succeeded", run.timeline()
    with open_session(f"sqlite:///{tmp_path}/results.db", clock=VirtualClock(run.job["ended_at"])) as session:
        result = replay_job(session, run.job["id"])
    measured, sim = result["measured"], result["simulated"]
    (revocation,) = result["schedule"]
    assert revocation["slot"] == "worker-0"
    assert measured["first_step_at_s"] < revocation["at_s"] < measured["last_step_at_s"]
    assert set(result["set_rates"]) == {"worker-0,worker-1", "worker-1"}
    delays = result["delays"]
    assert delays["startup_s"] > 0 and delays["rejoin_s"] > 0 and delays["teardown_s"] > 0
    assert sim["finished"] and sim["revocations"] == 1 and sim["replacements"] == 1
    assert sim["steps_done"] == pytest.approx(480)
    report = f"measured {measured}, simulated {sim}; delays {delays}; rates {result['set_rates']}"
    assert sim["wall_time_s"] == pytest.approx(measured["wall_time_s"], rel=TOLERANCE), report
    assert sim["cost_usd"] == pytest.approx(measured["cost_usd"], rel=TOLERANCE), report
    for role, usd in measured["cost_by_role_usd"].items():
        assert sim["cost_by_role_usd"][role] == pytest.approx(usd, rel=TOLERANCE), role
