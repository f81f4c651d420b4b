"""GCE quotas are checked before anything is created: the pure need/headroom maths, regions.get in the
emulator through the real client, and `orchestrator launch` refusing (exit 2) a cluster over quota."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.costmodel.launch_plan import plan_spec
from orchestrator.costmodel.slots import Slot, expand
from orchestrator.model.cloud_errors import InvalidRequestError
from orchestrator.model.instances import InstanceRequest, Role, instance_name
from orchestrator.model.spec import load_spec
from orchestrator.planning.quotas import read_spec_quotas, refuse_short_quota
from orchestrator.providers.gce.provider import GceProvider, RetrySettings
from orchestrator.providers.gce.quotas import gpu_quota_metric, headroom, quota_needs, quota_problems
from orchestrator_testing.gce_emulator import GceEmulator
from tests.cli_inproc import run_cli

REPO = Path(__file__).resolve().parent.parent
P = "test-project"
QUICK = RetrySettings(attempts=2, initial_backoff_s=0.005, max_backoff_s=0.01, request_timeout_s=5.0)
HINT = "ask for more quota (IAM & Admin > Quotas) or use another region/zone"


def slot(index: int, gpu: str | None, zone: str = "us-central1-c", spot: bool = True,
         machine: str = "n1-standard-4") -> Slot:
    return Slot(Role.WORKER if gpu else Role.PS, index, gpu, machine, zone, spot, 0.1)


# ---------------------------------------------------------------- pure functions


def test_gpu_quota_metric_names() -> None:
    assert gpu_quota_metric("nvidia-tesla-k80") == "NVIDIA_K80_GPUS"
    assert gpu_quota_metric("nvidia-tesla-k80", preemptible=True) == "PREEMPTIBLE_NVIDIA_K80_GPUS"
    assert gpu_quota_metric("nvidia-l4") == "NVIDIA_L4_GPUS"
    assert gpu_quota_metric("nvidia-tesla-a100") == "NVIDIA_A100_GPUS"
    assert gpu_quota_metric("nvidia-a100-80gb") == "NVIDIA_A100_80GB_GPUS"
    assert gpu_quota_metric("nvidia-h100-80gb") == "NVIDIA_H100_GPUS"  # as GCE (and the emulator) name it


def test_quota_needs_by_region_and_billing() -> None:
    slots = [slot(0, None, spot=False), *(slot(i, "k80") for i in range(4)),
             slot(4, "v100", zone="us-west1-b", spot=False, machine="n1-standard-8"), slot(5, "t4", machine="n9-x")]
    assert quota_needs(slots) == {
        "us-central1": {"INSTANCES": 6, "CPUS": 4, "PREEMPTIBLE_CPUS": 16, "PREEMPTIBLE_NVIDIA_K80_GPUS": 4,
                        "PREEMPTIBLE_NVIDIA_T4_GPUS": 1},  # n9-x: unknown machine type, vCPUs not counted
        "us-west1": {"INSTANCES": 1, "CPUS": 8, "NVIDIA_V100_GPUS": 1},
        "global": {"GPUS_ALL_REGIONS": 6},
    }


def test_quota_problems_messages_and_rules() -> None:
    needs = {"us-central1": {"PREEMPTIBLE_NVIDIA_K80_GPUS": 4.0, "PREEMPTIBLE_CPUS": 16.0, "INSTANCES": 5.0},
             "global": {"GPUS_ALL_REGIONS": 4.0}}
    quotas = {"us-central1": {"PREEMPTIBLE_NVIDIA_K80_GPUS": (4.0, 2.0), "INSTANCES": (100.0, 0.0)},
              "global": {"GPUS_ALL_REGIONS": (8.0, 0.0)}}
    assert quota_problems(needs, quotas) == [
        f"cluster: needs 4 PREEMPTIBLE_NVIDIA_K80_GPUS in us-central1 but only 2 of 4 are free; {HINT}"
    ]  # PREEMPTIBLE_CPUS and CPUS are not reported: no limit known, not checked
    # Without a PREEMPTIBLE_* quota, GCE charges spot VMs to the regular metric.
    quotas["us-central1"] = {"CPUS": (24.0, 12.0), "NVIDIA_K80_GPUS": (8.0, 0.0)}
    quotas["global"] = {"GPUS_ALL_REGIONS": (4.0, 1.0)}
    assert quota_problems(needs, quotas) == [
        f"cluster: needs 4 GPUS_ALL_REGIONS in all regions but only 3 of 4 are free; {HINT}",
        f"cluster: needs 16 CPUS in us-central1 but only 12 of 24 are free; {HINT}",
    ]
    rows = {(h.scope, h.metric): h for h in headroom(needs, quotas)}
    assert rows[("us-central1", "NVIDIA_K80_GPUS")].ok and rows[("us-central1", "NVIDIA_K80_GPUS")].free == 8
    assert quota_problems(needs, {}) == []  # nothing read: nothing known


# ---------------------------------------------------------------- regions.get in the emulator


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[GceEmulator]:
    emulator = GceEmulator({
        "boot_delay_s": 0.05, "op_delay_s": 0.02, "delete_delay_s": 0.02, "operation_wait_max_s": 5.0,
        "ssh_port": 2222, "workdir_root": str(tmp_path / "emu"),
        "quotas": {"us-central1": {"CPUS": 24, "PREEMPTIBLE_NVIDIA_T4_GPUS": 2, "INSTANCES": 10},
                   "global": {"GPUS_ALL_REGIONS": 2}},
    })
    emulator.start()
    yield emulator
    emulator.stop()


def test_region_quotas_report_limits_and_usage(emu: GceEmulator) -> None:
    gce = GceProvider(P, api_endpoint=emu.url, retry=QUICK)
    try:
        assert gce.region_quotas("us-central1") == {
            "CPUS": (24.0, 0.0), "INSTANCES": (10.0, 0.0), "PREEMPTIBLE_NVIDIA_T4_GPUS": (2.0, 0.0)}
        assert gce.region_quotas("us-west1") == {}  # no limits configured there
        assert gce.project_quotas() == {"GPUS_ALL_REGIONS": (2.0, 0.0)}
        gce.create(InstanceRequest(name=instance_name("job", Role.WORKER, 0, 0), job_id="job", role=Role.WORKER,
                                   index=0, generation=0, zone="us-central1-c", machine_type="n1-standard-4",
                                   spot=True, gpu="t4", gpu_count=1))
        # The same accounting the emulator uses for QUOTA_EXCEEDED: spot T4 -> PREEMPTIBLE_*, CPUS (no
        # PREEMPTIBLE_CPUS quota), one instance, one GPU globally.
        assert gce.region_quotas("us-central1") == {
            "CPUS": (24.0, 4.0), "INSTANCES": (10.0, 1.0), "PREEMPTIBLE_NVIDIA_T4_GPUS": (2.0, 1.0)}
        assert gce.project_quotas() == {"GPUS_ALL_REGIONS": (2.0, 1.0)}
        with pytest.raises(InvalidRequestError, match="HTTP 404"):
            gce.region_quotas("mars-north1")
        assert emu.snapshot()["calls"]["regions.get"] == 4
    finally:
        gce.close()


# ---------------------------------------------------------------- the CLI


def spec_text(url: str, workers: int) -> str:
    return f"""name: quota-check
provider:
  kind: gce
  project: {P}
  zones: [us-central1-c]
  api_endpoint: {url}
training: {{job: resnet-cifar, hparam_set: resnet_tiny, train_steps: 100, batch_per_worker: 32}}
cluster:
  parameter_servers: {{count: 1, machine_type: n1-standard-4, zone: us-central1-c}}
  chief: {{machine_type: n1-standard-4, zone: us-central1-c}}
  workers:
    - {{gpu: t4, count: {workers}, spot: true, zone: us-central1-c}}
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200", "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/x.db"}


def run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The console script, in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=_env(tmp_path), timeout=120)


def run_here(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The same answer, from this interpreter (tests/cli_inproc.py): a dry run is 9 s as a subprocess on a
    loaded 2-core host, nearly all of it importing google.cloud.compute_v1 / v1beta afresh."""
    return run_cli(args, _env(tmp_path), tmp_path)


def test_launch_over_quota_exits_2_and_creates_nothing(emu: GceEmulator, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(spec_text(emu.url, workers=4))
    out = run("launch", str(path), tmp_path=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    err = " ".join(out.stderr.split())
    assert "needs 4 PREEMPTIBLE_NVIDIA_T4_GPUS in us-central1 but only 2 of 2 are free" in err
    assert "needs 4 GPUS_ALL_REGIONS in all regions but only 2 of 2 are free" in err
    assert "CPUS" not in err.replace("NVIDIA", "")  # 6 x 4 vCPUs = 24: within quota
    snap = emu.snapshot()
    assert snap["instances"] == [] and snap["instances_created"] == 0
    assert "instances.insert" not in snap["calls"] and "firewalls.insert" not in snap["calls"]
    # projects.get twice: the set-up check (credentials, permission, project) and the global quotas.
    assert snap["calls"]["regions.get"] == 1 and snap["calls"]["projects.get"] == 2


def test_dry_run_shows_headroom_and_survives_unreadable_quotas(emu: GceEmulator, tmp_path: Path) -> None:
    # In process (the console script itself: test_launch_over_quota_exits_2_and_creates_nothing above).
    path = tmp_path / "job.yaml"
    path.write_text(spec_text(emu.url, workers=2))
    out = run_here("launch", "--dry-run", str(path), tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    dry = json.loads(out.stdout)  # a gce dry run: the Compute API requests, and the quota headroom, as JSON
    metrics = {h["metric"]: h for h in dry["quota_headroom"]}
    assert "PREEMPTIBLE_NVIDIA_T4_GPUS" in metrics and "GPUS_ALL_REGIONS" in metrics
    assert all(h["ok"] for h in metrics.values()) and dry["launch_would_be_refused"] is False
    # A permission failure while reading quotas is a warning, not a refusal.
    emu.inject_fault("regions.get", status=403, count=None)
    out = run_here("launch", "--dry-run", str(path), tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "could not read quotas" in out.stderr and "quota_headroom" not in json.loads(out.stdout)
    assert emu.snapshot()["instances_created"] == 0
    # An API that keeps answering 503 (or no network): the courtesy read is retried once, not five times.
    emu.clear_faults()
    emu.inject_fault("regions.get", status=503, count=None)
    before = emu.snapshot()["calls"]["regions.get"]
    out = run_here("launch", "--dry-run", str(path), tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "could not read quotas" in out.stderr and "gave up after 2 attempts" in " ".join(out.stderr.split())
    assert emu.snapshot()["calls"]["regions.get"] - before == 2


def test_within_quota_passes_the_check(emu: GceEmulator, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(spec_text(emu.url, workers=2))
    spec = load_spec(path)
    found = read_spec_quotas(spec, plan_spec(spec))
    refuse_short_quota(found)  # no UserError
    assert found is not None and found.unread is None and quota_problems(found.needs, found.quotas) == []
    assert len(expand(spec)) == 4 and emu.snapshot()["instances_created"] == 0
