"""A PyTorch job on torchft replica groups on gce, end to end (issue 54 item 5; about 60 s): the real
google-cloud-compute client against the Compute API emulator, real SSH to a local sshd, storage in (emulated) GCS.
Every worker is spot and worker 0 is preempted: the survivors go on in the processes they started in, the
replacement heals from a live peer, the job succeeds with no restart.

What it pins beyond the local provider's twin (test_torch_ft_e2e.py): each VM reaches the controller's Lighthouse
through a reverse SSH forward of its own (control/lighthouse.reach: a port on the VM's loopback, none opened to
anything), the firewall opens the run-time ports between the job's own tagged VMs only, the metrics the writer
wrote before and after it moved off worker 0 all reach the bucket (jobs/storage_sync.py appends), and no forward is
left running at the end."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import gce_spec_head, launch_in_background, preempt_worker_at, processes_under
from sqlalchemy import create_engine, text

from orchestrator.storage import open_storage
from orchestrator_testing.cloud import EmulatedCloud

pytestmark = pytest.mark.slow
pytest.importorskip("torchft")


def spec(url: str, storage: str) -> str:
    return gce_spec_head("gce-torchft", url, storage) + """\
training:
  framework: pytorch
  fault_tolerance: torchft
  hparam_set: resnet_tiny
  problem: image_cifar10
  train_steps: 240
  global_batch: 48
  checkpoint_every: 100
  log_every: 10
  min_workers: 1
cluster:
  workers:
    - {gpu: t4, count: 3, spot: true, zone: us-central1-c}
policy: {on_revocation: replace, max_replacements: 2, deadline: 20m}
pricing: {book: 2026-11}
"""


def _firewalls(cloud: EmulatedCloud) -> list[dict[str, Any]]:
    assert cloud.compute is not None
    with cloud.compute.state.lock:
        return [dict(fw) for fw in cloud.compute.state.resources.firewalls.values()]


def test_replica_groups_on_gce_lose_worker_0_and_the_survivors_keep_their_processes(tmp_path: Path) -> None:
    with EmulatedCloud(tmp_path / "cloud") as cloud:
        assert cloud.compute is not None
        proc, scalar = launch_in_background(tmp_path, spec(cloud.url, cloud.gcs.uri("runs")))
        engine = create_engine(f"sqlite:///{tmp_path}/results.db")
        rules: list[dict[str, Any]] = []
        victim, out = preempt_worker_at(cloud, proc, scalar, slot=0, step=40,
                                        before=lambda: rules.extend(_firewalls(cloud)))
        with engine.connect() as conn:
            summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
            notes = conn.execute(text("SELECT to_status, reason FROM events WHERE entity = 'note' "
                                      "ORDER BY at, id")).all()
            revoked = conn.execute(text("SELECT name FROM instances WHERE end_reason = 'preempted'")).scalars().all()
            undeleted = conn.execute(text("SELECT COUNT(*) FROM instances WHERE deleted_at IS NULL")).scalar()
        assert summary["status"] == "succeeded" and summary["accuracy"] > 0.5, (summary, out[-3000:])
        assert revoked == [victim] and summary["revocations"] == 1 and summary["replacements"] == 1
        kinds = [k for k, _ in notes]
        assert "restart" not in kinds, notes  # no survivor's process was restarted
        assert any(k == "quorum" and "3 -> 2" in r for k, r in notes), notes
        assert any(k == "heal" for k, _ in notes), notes  # the replacement healed from a live peer
        assert undeleted == 0 and sum(cloud.compute.snapshot()["instances_by_status"].values()) == 0

        # The run-time ports are open between the job's own VMs only; the Lighthouse's port to nothing.
        (internal,) = [r for r in rules if r["name"].endswith("-internal")]
        assert internal["allowed"] == [{"IPProtocol": "tcp", "ports": ["1024-65535"]}]
        assert internal["sourceTags"] == internal["targetTags"] and not internal.get("sourceRanges")
        assert all(r["allowed"][0]["ports"] == ["22"] for r in rules if r.get("sourceRanges"))

        # Each VM reached the Lighthouse at a port of its own loopback (its forward), not at the Lighthouse's.
        # (A replacement may get the port its predecessor's forward freed: only the first three must differ.)
        vms = tmp_path / "cloud" / "vms"
        tasks = {d.name: json.loads((d / "task.json").read_text())["torch"] for d in vms.iterdir()}
        bucket = open_storage(cloud.gcs.uri("runs"), str(summary["job_id"]))
        own = f"http://127.0.0.1:{json.loads(bucket.read_text('lighthouse.json') or '{}')['port']}"
        first = [t["lighthouse"] for name, t in tasks.items() if name.endswith("-0")]
        assert len(tasks) == 4 and len(set(first)) == 3 and own not in {t["lighthouse"] for t in tasks.values()}
        assert all(t["lighthouse"].startswith("http://127.0.0.1:") and t["replica_host"] for t in tasks.values())

        for d in vms.iterdir():  # the survivors: one process from the start to the end, through 3 -> 2
            if d.name == victim or not (d / "storage" / "torchft_members.jsonl").exists():
                continue
            members = [json.loads(ln) for ln in (d / "storage" / "torchft_members.jsonl").read_text().splitlines()]
            worlds = [m["world"] for m in members]
            if d.name.endswith("-0-1"):  # the replacement
                continue
            assert 2 in worlds and len({m["pid"] for m in members}) == 1, (d.name, members)

        # The metrics the writer wrote on worker 0 and, after it moved, on a survivor: all in the bucket, in order.
        records = [json.loads(ln) for ln in (bucket.read_text("metrics.jsonl") or "").splitlines()]
        steps = [r["step"] for r in records if r["kind"] == "step"]
        assert steps == sorted(set(steps)) and steps[0] <= 10 and steps[-1] == 240, (steps, records)
        time.sleep(0.5)
    assert processes_under(tmp_path) == []  # no Lighthouse, no reverse forward, no task left
