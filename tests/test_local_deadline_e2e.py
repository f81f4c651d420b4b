"""``on_revocation: deadline`` end to end on one machine (issue 23): a local launch replays a measured spot
availability trace, the daemon's deadline policy starts on-demand while spot is out and hops back to spot when it
returns, draining the on-demand VM first, and the job meets its deadline with no step lost at the hop."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from e2e_helpers import cli, processes_under
from sqlalchemy import create_engine, text

from orchestrator.core.paths import data_dir

pytestmark = pytest.mark.slow
pytest.importorskip("tensorflow")

TRACE = data_dir() / "spot-availability" / "aws-10-26-2022_us-west-2b_v100_1.json"
# From tick 296 spot is out for 50 minutes of cloud time (50 s here), then back for hours: the deadline policy
# (learning in-job, as the simulator's replay) runs on-demand, then hops to spot once it is back and the job is
# ahead of the line of uniform progress (at 50 s at this job's pace; later on a loaded machine).
START_TICK = 296


def _spec(storage: Path) -> str:
    return f"""name: deadline-e2e
provider:
  kind: local
  time_scale: 60
  revocations: none
  availability_trace: {TRACE}
  availability_start_tick: {START_TICK}
  emulation_k80_step_s: 0.25
storage: {storage}
training:
  job: resnet-cifar
  model: resnet
  hparam_set: resnet_cifar_15
  mode: sync
  train_steps: 600
  batch_per_worker: 32
  checkpoint_every: 25
  log_every: 10
cluster:
  workers:
    - {{gpu: v100, count: 1, spot: true}}
policy:
  on_revocation: deadline
  deadline: 420s
pricing: {{book: 2019-02}}
"""


def _step(reason: str, pattern: str) -> int:
    found = re.search(pattern, reason)
    assert found is not None, reason
    return int(found.group(1))


def test_a_deadline_hop_drains_the_vm_and_loses_no_step(tmp_path: Path) -> None:
    env = {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/results.db"}
    spec = tmp_path / "job.yaml"
    spec.write_text(_spec(tmp_path / "runs"))
    out = cli("launch", str(spec), "--quiet", env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        events = conn.execute(text("SELECT e.entity, e.to_status, e.reason, i.name FROM events e LEFT JOIN "
                                   "instances i ON i.id = e.instance_id ORDER BY e.at, e.id")).all()
        ends = dict(conn.execute(text("SELECT name, end_reason FROM instances")).all())
    assert summary["status"] == "succeeded", summary
    drains = [k for k, e in enumerate(events) if e.to_status == "drain"]
    assert drains, [tuple(e) for e in events]  # the hop back to spot happened, and drained its VM
    for k in drains:
        drained = events[k].name
        assert "checkpoint before the hop" in events[k].reason
        assert ends[drained] == "replaced"  # the daemon's own notice was not read as a preemption
        after = events[k + 1:]
        ckpt = next(e for e in after if e.entity == "note" and e.to_status == "checkpoint")
        resumed = next(e for e in after if e.entity == "note" and e.to_status == "resumed")
        saved = _step(ckpt.reason, r"checkpoint at step (\d+) after a notice")
        # No step before the drain is lost: training resumes from the drain's checkpoint, or from a periodic one
        # that the drained VM wrote in the second before its delete (checkpoint_every: 25).
        assert saved <= _step(resumed.reason, r"resumed from the checkpoint at step (\d+)") < saved + 25
    assert not any(e.entity == "instance" and e.to_status == "revoked" for e in events)
    assert processes_under(tmp_path) == []
