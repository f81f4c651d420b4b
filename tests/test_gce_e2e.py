"""`orchestrator launch` with provider gce, end to end: the real google-cloud-compute client against the
Compute API emulator, real SSH to a local sshd, real TensorFlow, storage in (emulated) GCS synced by the
payload itself; one stockout fails over to the next zone, one preemption is detected and recovered.

Kept as a real-payload test (issue 53): the GCE emulator path (the Compute client, SSH, GCS sync)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_helpers import gce_spec_head, launch_in_background, preempt_worker_at, processes_under
from sqlalchemy import create_engine, text

from orchestrator_testing.cloud import EmulatedCloud

pytestmark = pytest.mark.slow
pytest.importorskip("tensorflow")


def spec(url: str, storage: str) -> str:
    zones = "[us-central1-c, us-central1-a, us-west1-b]"
    return gce_spec_head("gce-e2e", url, storage, zones) + """\
training: {job: resnet-cifar, hparam_set: resnet_tiny, train_steps: 700, batch_per_worker: 32,
            checkpoint_every: 100, log_every: 10}
cluster:
  parameter_servers: {count: 1, machine_type: n1-standard-4, zone: us-central1-c}
  chief: {machine_type: n1-standard-4, zone: us-central1-c}
  workers:
    - {gpu: t4, count: 1, spot: true, zone: us-central1-c}
    - {gpu: l4, count: 1, spot: true, zone: us-central1-c}
    - {gpu: v100, count: 1, spot: true, zone: us-central1-c}
policy: {on_revocation: replace, max_replacements: 4, deadline: 20m}
pricing: {book: 2026-11}
"""


def test_gce_job_with_stockout_and_preemption(tmp_path: Path) -> None:
    with EmulatedCloud(tmp_path / "cloud") as cloud:
        assert cloud.compute is not None
        cloud.compute.set_stockout("us-central1-c", gpu="nvidia-tesla-t4")  # T4 must fail over
        proc, scalar = launch_in_background(tmp_path, spec(cloud.url, cloud.gcs.uri("runs")))
        engine = create_engine(f"sqlite:///{tmp_path}/results.db")
        victim, out = preempt_worker_at(cloud, proc, scalar, slot=1, step=60)
        with engine.connect() as conn:
            summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
            notes = [r[0] for r in conn.execute(text("SELECT reason FROM events WHERE entity = 'note'"))]
            t4_zone = conn.execute(text("SELECT zone FROM instances WHERE gpu = 't4'")).scalar()
            revoked = conn.execute(text("SELECT name FROM instances WHERE end_reason = 'preempted'")).scalars().all()
            bad_ledger = conn.execute(text(
                "SELECT COUNT(*) FROM instances i JOIN ledger l ON l.instance_id = i.id WHERE i.end_reason <> "
                "'create_failed' AND abs(l.usd - (i.deleted_at - i.requested_at) * i.price_per_hour / 3600) > 1e-9"
            )).scalar()
            undeleted = conn.execute(text("SELECT COUNT(*) FROM instances WHERE deleted_at IS NULL")).scalar()
        assert summary["status"] == "succeeded", (summary, out[-3000:])
        assert summary["accuracy"] is not None and summary["accuracy"] > 0.3
        assert revoked == [victim] and summary["replacements"] >= 1
        assert t4_zone == "us-central1-a"  # the spec's next allowed zone offering T4
        assert any("ZONE_RESOURCE_POOL_EXHAUSTED" in n or "us-central1-c" in n for n in notes if n)
        assert bad_ledger == 0 and undeleted == 0
        snap = cloud.compute.snapshot()
        assert sum(v for k, v in snap["instances_by_status"].items()) == 0, snap  # nothing left in the cloud
        time.sleep(0.5)
    assert processes_under(tmp_path) == []
