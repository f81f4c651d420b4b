"""``on_revocation: deadline`` end to end on one machine (issue 23): a local launch replays a measured spot
availability trace, the daemon's deadline policy starts on-demand while spot is out and hops back to spot when it
returns, draining the on-demand VM first, and the job meets its deadline with no step lost at the hop; with the
TensorFlow payload and with the PyTorch one (whose drained rank leaves the world after the checkpoint)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from e2e_helpers import cli, processes_under
from sqlalchemy import create_engine, text

from orchestrator.model.paths import data_dir

pytestmark = pytest.mark.slow

TRACE = data_dir() / "spot-availability" / "aws-10-26-2022_us-west-2b_v100_1.json"
# From tick 296 spot is out for 50 minutes of cloud time (50 s here), then back for hours: the deadline policy
# (learning in-job, as the simulator's replay) runs on-demand, then hops to spot once it is back and the job is
# ahead of the line of uniform progress (at 50 s at this job's pace; later on a loaded machine).
START_TICK = 296


TRAINING = {
    "tf": """  job: resnet-cifar
  model: resnet
  hparam_set: resnet_cifar_15
  mode: sync
  train_steps: 600
  batch_per_worker: 32
  checkpoint_every: 25""",
    "torch": """  framework: pytorch
  hparam_set: resnet_tiny
  problem: image_cifar10
  train_steps: 1200
  global_batch: 32
  checkpoint_every: 25""",
}
# Slack enough that on a loaded machine the job is still ahead of the uniform line when spot comes back (the hop
# gate): the TF job's 420 s was too little under CI's load once (2026-11-29: it finished at 419.7 s with no hop
# back), as the PyTorch job's 900 s was (2026-11-28: no hop, in a run 25% slower than usual; it hops at 50 s here),
# and so was the TF job's 700 s in CI (2026-11-29: 600 steps took 407 s there, 107 s here, and the job never got
# one overhead ahead of a line that slow before the job ended). The hop needs the job ahead of the line by an
# overhead: (1 - work / deadline) x elapsed > first step's delay + overhead, so the deadline is ~3x the slow run.
# The PyTorch payload's step is this host's CPU, not an emulated GPU's pace: more. With either deadline the
# policy still starts on-demand while spot is out (`simulate --availability-trace ... --start-tick 296`: "os|").
DEADLINE = {"tf": "1200s", "torch": "1500s"}
# A hop must save more than it costs: (on-demand - spot) x min(the spot stretch's age, the work left) against the
# restart overhead at both prices, and the daemon measures that overhead (request to first step). Under CI's load
# the PyTorch job's first step came 31.6 s after its request (10 s planned) and, at the 2019 V100 prices ($2.14 /
# $0.86), the hop never paid before the job finished (2026-11-29; right, at that overhead). A wider gap between the
# prices ($0.29 / $2.62 an hour with the host) makes it pay at 1.25 overheads of stretch instead of 2.3.
# The hop pays only while both the stretch's age and the work left exceed those 1.25 overheads: a window that a
# loaded machine narrows from both sides (a slower first step is a larger overhead). With 800 PyTorch steps the
# window was [93 s, 97 s] when the first step came 35 s after the request, between two 10 s decision ticks, and
# the job finished on on-demand (2026-11-29, in a fresh-clone CI run); 1200 steps widen it by ~50 s.


def _spec(storage: Path, payload: str) -> str:
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
{TRAINING[payload]}
  log_every: 10
cluster:
  workers:
    - {{gpu: v100, count: 1, spot: true}}
policy:
  on_revocation: deadline
  deadline: {DEADLINE[payload]}
pricing: {{book: 2019-02, overrides: {{v100: {{on_demand: 2.48, spot: 0.25}}}}}}
"""


def _step(reason: str, pattern: str) -> int:
    found = re.search(pattern, reason)
    assert found is not None, reason
    return int(found.group(1))


# The job may run to its deadline (the policy waits out spot outages while the slack allows): more than pytest's
# 600 s default. On a slow machine (2026-11-29: the PyTorch job's first step 68 s after the request) the PyTorch job
# was still training at 600 s, after four of the trace's drops, and pytest-timeout killed it mid-job.
@pytest.mark.timeout(max(int(d.rstrip("s")) for d in DEADLINE.values()) + 600)
@pytest.mark.parametrize("payload", ["tf", "torch"])
def test_a_deadline_hop_drains_the_vm_and_loses_no_step(tmp_path: Path, payload: str) -> None:
    pytest.importorskip("tensorflow" if payload == "tf" else "torch")
    env = {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/results.db"}
    spec = tmp_path / "job.yaml"
    spec.write_text(_spec(tmp_path / "runs", payload))
    # The daemon may use the whole deadline (it waits out spot outages while the slack allows), so the launch gets the
    # deadline and then some: 900 s was less than the PyTorch job's 1500 s deadline, and on a slow machine
    # (2026-11-29: its first step 68 s after the request) the job was still waiting for spot when the test gave up.
    out = cli("launch", str(spec), "--quiet", env=env, timeout=int(DEADLINE[payload].rstrip("s")) + 300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        events = conn.execute(text("SELECT e.entity, e.to_status, e.reason, i.name, e.at FROM events e LEFT JOIN "
                                   "instances i ON i.id = e.instance_id ORDER BY e.at, e.id")).all()
        ends = dict(conn.execute(text("SELECT name, end_reason FROM instances")).all())
        checkpoints = conn.execute(text("SELECT at, step FROM metrics WHERE kind = 'checkpoint' ORDER BY at")).all()
    assert summary["status"] == "succeeded", summary
    drains = [k for k, e in enumerate(events) if e.to_status == "drain"]
    # the hop back to spot happened, and drained its VM
    if not drains:  # what the daemon planned with and measured: why it never found the hop worth it
        planned = cli("report", env=env).stdout
        timeline = "\n".join(f"{e.at - events[0].at:7.1f} s {e.entity} {e.to_status}: {e.reason}" for e in events)
        pytest.fail(f"no hop back to spot\n{timeline}\n{planned[planned.find('deadline policy'):]}")
    for k in drains:
        drained = events[k].name
        assert "checkpoint before the hop" in events[k].reason
        assert ends[drained] == "replaced"  # the daemon's own notice was not read as a preemption
        # The VM goes once a checkpoint newer than its notice is in: the one the notice asked for, or a periodic one
        # the VM wrote before it polled the notice (checkpoint_every: 25); either way no step before it is lost.
        saved = next((step for at, step in checkpoints if at >= events[k].at), None)
        resumed = next((e for e in events[k + 1:] if e.entity == "note" and e.to_status == "resumed"), None)
        assert saved is not None and resumed is not None, "\n".join(map(str, events))
        # Training resumes from that checkpoint, or from a periodic one the drained VM wrote in the second before
        # its delete.
        assert saved <= _step(resumed.reason, r"resumed from the checkpoint at step (\d+)") < saved + 25
    # A VM is revoked only where the trace drops (the spot VMs after the hop, on a machine slow enough that the job
    # outlives the next drop: 2026-11-29), never a drained one: the daemon's own notice is not a preemption.
    drained_names = {events[k].name for k in drains}
    for k, e in enumerate(events):
        if e.entity == "instance" and e.to_status == "revoked":
            assert e.name not in drained_names, e
            assert any(x.entity == "note" and x.to_status == "spot-down" and abs(x.at - e.at) < 2.0
                       for x in events[max(0, k - 5):k + 5]), f"{e.name} revoked without the trace's drop"
    assert processes_under(tmp_path) == []
