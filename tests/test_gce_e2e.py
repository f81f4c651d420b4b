"""`orchestrator launch` with provider gce, end to end: the real google-cloud-compute client against the
Compute API emulator, real SSH to a local sshd, real TensorFlow, storage in (emulated) GCS synced by the
payload itself; one stockout fails over to the next zone, one preemption is detected and recovered.

Kept as a real-payload test (issue 53): the GCE emulator path (the Compute client, SSH, GCS sync)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import REPO, processes_under, wait_until
from sqlalchemy import create_engine, text

from orchestrator_testing.cloud import EmulatedCloud, provider_yaml
from orchestrator_testing.processes import stop

pytestmark = pytest.mark.slow
pytest.importorskip("tensorflow")


def spec(url: str, storage: str) -> str:
    return f"""name: gce-e2e
provider:
  kind: gce
  project: test-project
  zones: [us-central1-c, us-central1-a, us-west1-b]
  {provider_yaml(url).replace(", ", chr(10) + "  ")}
storage: {storage}
training: {{job: resnet-cifar, hparam_set: resnet_tiny, train_steps: 700, batch_per_worker: 32,
            checkpoint_every: 100, log_every: 10}}
cluster:
  parameter_servers: {{count: 1, machine_type: n1-standard-4, zone: us-central1-c}}
  chief: {{machine_type: n1-standard-4, zone: us-central1-c}}
  workers:
    - {{gpu: t4, count: 1, spot: true, zone: us-central1-c}}
    - {{gpu: l4, count: 1, spot: true, zone: us-central1-c}}
    - {{gpu: v100, count: 1, spot: true, zone: us-central1-c}}
policy: {{on_revocation: replace, max_replacements: 4, deadline: 20m}}
pricing: {{book: 2026-11}}
"""


def test_gce_job_with_stockout_and_preemption(tmp_path: Path) -> None:
    with EmulatedCloud(tmp_path / "cloud") as cloud:
        assert cloud.compute is not None
        cloud.compute.set_stockout("us-central1-c", gpu="nvidia-tesla-t4")  # T4 must fail over
        db_url = f"sqlite:///{tmp_path}/results.db"
        env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": db_url,
               "COLUMNS": "200"}
        path = tmp_path / "job.yaml"
        path.write_text(spec(cloud.url, cloud.gcs.uri("runs")))
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "launch", str(path), "--quiet"],
                                env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        engine = create_engine(db_url)

        def scalar(sql: str) -> object:
            try:
                with engine.connect() as conn:
                    return conn.execute(text(sql)).scalar()
            except Exception:  # the DB may not exist for the first second
                return None

        try:
            wait_until(lambda: (scalar("SELECT final_step FROM jobs") or 0) >= 60, timeout=300)
            victim = str(scalar("SELECT name FROM instances WHERE slot_index = 1 AND role = 'worker' "
                                "AND status = 'training'"))
            cloud.compute.preempt(victim)
            out, _ = proc.communicate(timeout=600)
        finally:
            stop(proc, timeout_s=120)  # SIGTERM: the launch tears its instances down
        assert proc.returncode == 0, out[-4000:]
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
