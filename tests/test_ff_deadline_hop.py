"""``on_revocation: deadline`` fast-forwarded (tests/fastforward.py): the decisions tests/test_local_deadline_e2e.py
checks with a real payload, on a virtual clock: the daemon starts on-demand while the replayed trace's spot is out,
hops back to spot once it returns and the job is ahead, draining the on-demand VM first (checkpoint before the hop),
and the job meets its deadline with no step lost at the hop."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastforward import example_spec, fast_forward, spec_of

from orchestrator.model.paths import data_dir

TRACE = data_dir() / "spot-availability" / "aws-10-26-2022_us-west-2b_v100_1.json"
START_TICK = 296  # spot out for 50 minutes of cloud time (50 s at time_scale 60), then back for hours


def _spec(storage: Path, deadline: str = "1200s") -> str:
    return f"""name: deadline-ff
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
  train_steps: 1200
  batch_per_worker: 32
  checkpoint_every: 25
  log_every: 10
cluster:
  workers:
    - {{gpu: v100, count: 1, spot: true}}
policy:
  on_revocation: deadline
  deadline: {deadline}
pricing: {{book: 2019-02, overrides: {{v100: {{on_demand: 2.48, spot: 0.25}}}}}}
"""


def test_a_deadline_hop_drains_the_vm_and_loses_no_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = fast_forward(spec_of(_spec(tmp_path / "runs")), tmp_path, monkeypatch)
    assert run.job["status"] == "succeeded", run.timeline()
    assert run.wall_s <= 1200
    first = run.started[0]
    assert not run.instances[first]["spot"], run.timeline()  # spot is out at the start: on-demand
    drains = [k for k, e in enumerate(run.events) if e[1] == "drain"]
    assert drains, "no hop back to spot\n" + run.timeline()
    for k in drains:
        _, _, reason, drained, at = run.events[k]
        assert reason is not None and "checkpoint before the hop" in reason
        assert drained is not None and run.instances[drained]["end_reason"] == "replaced"
        saved = next((step for t, step in run.checkpoints if t >= at), None)
        resumed = next((e for e in run.events[k + 1:] if e[0] == "note" and e[1] == "resumed"), None)
        assert saved is not None and resumed is not None, run.timeline()
        found = re.search(r"resumed from the checkpoint at step (\d+)", resumed[2] or "")
        assert found is not None and int(found.group(1)) == saved  # no step lost: resumed where the drain saved
    assert any(i["spot"] for i in run.instances.values()), f"{run.instances}\n{run.timeline()}"
    drained_names = {run.events[k][3] for k in drains}
    assert not any(e[0] == "instance" and e[1] == "revoked" and e[3] in drained_names for e in run.events)


def test_a_spot_vm_lost_in_one_zone_moves_to_the_other_zones_spot(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # examples/local-deadline-zones.yaml: from tick 325 both zones have spot; zone-a's drops 4 ticks later
    run = fast_forward(example_spec("local-deadline-zones", tmp_path), tmp_path, monkeypatch)
    assert run.job["status"] == "succeeded", run.timeline()
    vms = sorted(run.instances.values(), key=lambda v: v["generation"])
    # spot in zone-a, preempted where zone-a's trace drops, then spot in zone-b: never on-demand, no wait
    assert [(v["zone"], v["spot"]) for v in vms] == [("zone-a", True), ("zone-b", True)], run.timeline()
    assert vms[0]["end_reason"] == "preempted"
    assert any(e[2] == "zone-a: spot capacity none" for e in run.notes("zone-spot-down")), run.timeline()
    moved = [e[2] or "" for e in run.notes("requested") if "in zone-b" in (e[2] or "")]
    assert moved and "moved from zone-a" in moved[0], run.timeline()
    assert not run.notes("spot-down"), run.timeline()
    assert run.wall_s <= 600  # the deadline met


def test_a_spot_vm_lost_on_one_gpu_type_moves_to_the_other_types_spot(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # examples/local-deadline-gpus.yaml: from tick 2243 the K80's spot lasts 50 minutes, the V100's 5.5 hours
    run = fast_forward(example_spec("local-deadline-gpus", tmp_path), tmp_path, monkeypatch)
    assert run.job["status"] == "succeeded", run.timeline()
    vms = sorted(run.instances.values(), key=lambda v: v["generation"])
    assert [(v["gpu"], v["spot"]) for v in vms] == [("k80", True), ("v100", True)], run.timeline()
    assert vms[0]["end_reason"] == "preempted"
    assert any(e[2] == "gpu v100: spot capacity there" for e in run.notes("zone-spot-up")), run.timeline()
    assert any("on v100" in (e[2] or "") for e in run.notes("requested")), run.timeline()
    assert run.wall_s <= 360  # the deadline met
