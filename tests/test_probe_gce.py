"""`orchestrator probe` on provider gce against the Compute API emulator (real Compute client, real SSH to a
local sshd, real TensorFlow, emulated GCS): one VM a probed (point, batch), created and deleted, every cent
under its probe's job, nothing left in the cloud (issue 55 item 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import REPO, gce_spec_head, processes_under, wait_until
from sqlalchemy import create_engine, text

from orchestrator_testing.cloud import EmulatedCloud

# The extended tier: two real TensorFlow VMs in a row, beside the GCE emulator path's own e2e (test_gce_e2e).
pytestmark = [pytest.mark.slow, pytest.mark.extended]
pytest.importorskip("tensorflow")


def spec(url: str, storage: str) -> str:
    return gce_spec_head("gce-probe", url, storage) + """\
training: {job: resnet-cifar, hparam_set: resnet_tiny, train_steps: 100, batch_per_worker: 16, mode: sync}
cluster:
  parameter_servers: {count: 0}
  workers:
    - {gpu: t4, count: 1, spot: true, zone: us-central1-c}
policy: {on_revocation: replace, max_replacements: 0, budget_usd: 5}
pricing: {book: 2026-11}
"""


def test_a_gce_probe_creates_and_deletes_one_vm_a_batch(tmp_path: Path) -> None:
    with EmulatedCloud(tmp_path / "cloud") as cloud:
        assert cloud.compute is not None
        db_url = f"sqlite:///{tmp_path}/results.db"
        env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": db_url,
               "COLUMNS": "200"}
        path = tmp_path / "job.yaml"
        path.write_text(spec(cloud.url, cloud.gcs.uri("runs")))
        out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "probe", str(path), "--yes", "--json",
                              "--max-probes", "1", "--poll", "0.5"], env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-4000:]
        probes = json.loads(out.stdout)["probes"]
        assert [(p["gpu"], p["batch"]) for p in probes] == [("t4", 16), ("t4", 32)], probes
        assert all(p["step_ms"] > 0 and p["cost_usd"] > 0 for p in probes), probes
        with create_engine(db_url).connect() as conn:
            vms = conn.execute(text("SELECT job_id, status FROM instances")).all()
            jobs = conn.execute(text("SELECT id FROM jobs")).scalars().all()
            owners = conn.execute(text("SELECT DISTINCT job_id FROM ledger")).scalars().all()
        assert len(jobs) == 2 and sorted(j for j, _ in vms) == sorted(jobs), vms  # one VM a (point, batch)
        assert {s for _, s in vms} == {"deleted"} and sorted(owners) == sorted(jobs)
        snap = cloud.compute.snapshot()
        assert sum(snap["instances_by_status"].values()) == 0, snap  # nothing left in the cloud
    wait_until(lambda: processes_under(tmp_path) == [], timeout=20)
