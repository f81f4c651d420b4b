"""`launch --dry-run` on every gce example, against the Compute API emulator, with the 2026 catalog.

The dry run sends nothing; the JSON it prints is then sent to the emulator (which validates bodies as
GCE does), and must be accepted: spot VMs are SPOT + DELETE, every VM carries a cloud-side time limit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from orchestrator.model.spec import GceProvider as GceSpec
from orchestrator.model.spec import load_spec
from orchestrator.model.torch_spec import payload_framework
from orchestrator.providers.gce.backend import build as gce_backend
from orchestrator.providers.gce.dry_run import gce_dry_run, request_settings
from orchestrator.providers.gce.provider import GceProvider
from orchestrator.providers.gce.requests import startup_script
from orchestrator_testing.gce_emulator import GceEmulator
from tests.cli_inproc import run_cli

REPO = Path(__file__).resolve().parent.parent
GCE_EXAMPLES = sorted((REPO / "examples").glob("gce-*.yaml"))


@pytest.fixture(scope="module")
def emu() -> Iterator[GceEmulator]:
    emulator = GceEmulator({"boot_delay_s": 0.05, "op_delay_s": 0.01, "operation_wait_max_s": 5.0})
    emulator.start()
    yield emulator
    emulator.stop()


CONSOLE_SCRIPT_EXAMPLE = "gce-l4x4-spot.yaml"  # through the console script; the others in this interpreter


def dry_run(example: Path, emu: GceEmulator, tmp_path: Path) -> dict[str, Any]:
    data = yaml.safe_load(example.read_text())
    data["provider"]["api_endpoint"] = emu.url  # the launch would talk to the emulator, not GCE
    for name in data["training"].get("files", []):  # they (and a training.model file) live beside the spec
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(example.parent / name, tmp_path / name)
    spec = tmp_path / example.name
    spec.write_text(yaml.safe_dump(data))
    env = {"ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/x.db", "PATH": "/usr/bin:/bin"}
    args = ["launch", "--dry-run", str(spec)]
    if example.name == CONSOLE_SCRIPT_EXAMPLE:
        out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], capture_output=True, text=True,
                             timeout=300, cwd=REPO, env=env)
    else:  # as a fresh process would start (tests/cli_inproc.py), without its 6-7 s of importing compute_v1
        out = run_cli(args, env, REPO)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "x.db").exists()
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


def test_there_are_gce_examples_of_each_kind() -> None:
    names = {p.name for p in GCE_EXAMPLES}
    assert {"gce-l4x4-spot.yaml", "gce-mixed-t4-l4-a100.yaml", "gce-h100-machine-types.yaml",
            "gce-plan-search.yaml"} <= names
    assert not names & {"gce-k80x4-spot.yaml", "gce-hetero-multizone.yaml"}  # K80 / P100: retired


@pytest.mark.parametrize("example", GCE_EXAMPLES, ids=lambda p: p.name)
def test_dry_run_requests_are_spot_delete_time_limited_and_accepted(
    example: Path, emu: GceEmulator, tmp_path: Path
) -> None:
    def changes() -> int:  # calls other than the quota reads (regions.get / projects.get) a dry run may make
        return sum(n for call, n in emu.snapshot()["calls"].items() if not call.endswith(".get"))

    calls_before = changes()
    out = dry_run(example, emu, tmp_path)
    assert out["requests_sent"] == 0 and out["price_book"] == "2026-11"
    assert changes() == calls_before  # the dry run sent nothing
    inserts = out["instances.insert"]
    assert inserts and len(out["disks"]) == len(inserts) and len(out["firewalls.insert"]) == 2
    for item in inserts:
        scheduling = item["body"]["scheduling"]
        assert "maxRunDuration" in scheduling or "terminationTime" in scheduling, item["body"]["name"]
        assert scheduling["instanceTerminationAction"] == "DELETE"
        if "-worker-" in item["body"]["name"]:
            assert scheduling["provisioningModel"] in ("SPOT", "FLEX_START")
    assert any(i["body"]["scheduling"].get("provisioningModel") == "SPOT" for i in inserts)
    # What the dry run printed is what GCE (the emulator) accepts.
    options = ClientOptions(api_endpoint=emu.url)
    instances = compute_v1.InstancesClient(credentials=AnonymousCredentials(), client_options=options)  # type: ignore[no-untyped-call]
    firewalls = compute_v1.FirewallsClient(credentials=AnonymousCredentials(), client_options=options)  # type: ignore[no-untyped-call]
    project = out["project"]
    for rule in out["firewalls.insert"]:
        body = compute_v1.Firewall.from_json(json.dumps(rule["body"]))
        body.name = f"{example.stem}-{body.name}"[:62]
        firewalls.insert_unary(project=project, firewall_resource=body)
    for item in inserts:
        body = compute_v1.Instance.from_json(json.dumps(item["body"]))
        instances.insert_unary(project=project, zone=item["zone"], instance_resource=body)
        created = emu.instance(body.name)
        assert created is not None, body.name
        assert created["scheduling"]["instanceTerminationAction"] == "DELETE"
    instances.transport.close()  # type: ignore[no-untyped-call]
    firewalls.transport.close()  # type: ignore[no-untyped-call]


def test_h100_machine_type_shape_and_flex_start(emu: GceEmulator, tmp_path: Path) -> None:
    out = dry_run(REPO / "examples" / "gce-h100-machine-types.yaml", emu, tmp_path)
    bodies = {i["body"]["name"].rsplit("-", 3)[1] + i["body"]["name"][-4:]: i["body"] for i in out["instances.insert"]}
    shapes = [b["machineType"].rsplit("/", 1)[1] for b in bodies.values()]
    assert shapes == ["a3-highgpu-2g", "a3-highgpu-2g", "a3-highgpu-1g"]
    assert all("guestAccelerators" not in b for b in bodies.values())  # GCE attaches an A3's H100s
    models = [b["scheduling"]["provisioningModel"] for b in bodies.values()]
    assert models == ["SPOT", "SPOT", "FLEX_START"]


def test_dry_run_uses_the_settings_the_real_backend_uses(emu: GceEmulator) -> None:
    spec = load_spec(REPO / "examples" / "gce-l4x4-spot.yaml")
    assert isinstance(spec.provider, GceSpec)
    spec = spec.model_copy(update={"provider": spec.provider.model_copy(update={"api_endpoint": emu.url})})
    framework = payload_framework(spec)  # the registry builds the job's backend for its framework
    backend = gce_backend("test", spec.provider, framework)
    provider = backend.provider
    assert isinstance(provider, GceProvider)
    assert provider.settings == request_settings(spec.provider, framework)
    provider.close()
    # The cloud-side time limit follows the policy: 12 h deadline + 10 min grace vs $20 of budget.
    out = gce_dry_run(spec)
    hourly = out["cluster_usd_per_hour"]
    expected = int(min(12 * 3600 + 600, 20 / hourly * 3600))
    assert {int(i["body"]["scheduling"]["maxRunDuration"]["seconds"]) for i in out["instances.insert"]} == {expected}
    # The metadata too is what the real create sends (issue 21: enable-guest-attributes was missing), but
    # for the job's public key, which is made at launch.
    for insert in out["instances.insert"]:
        body = insert["body"]
        real = backend.instance_metadata("l4x4-spot-dryrun", body["name"], SimpleNamespace(uri=spec.storage))
        # The request builder adds the first-boot set-up (the job's framework) to both, from the same settings.
        real["startup-script"] = startup_script(provider.settings, "l4" if "-worker-" in body["name"] else None) or ""
        dry = {item["key"]: item["value"] for item in body["metadata"]["items"]}
        assert dry.keys() == real.keys()
        assert {k: v for k, v in dry.items() if k != "ssh-keys"} == {k: v for k, v in real.items() if k != "ssh-keys"}
