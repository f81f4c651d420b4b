"""Google's provisioning rules and image routes (data/gce_rules.csv, data/gce_images.csv), end to end: the
dry run of every current GPU group, the spec's refusals through the real CLI (exit 2, one line, no job), and
the Compute API emulator refusing the same bodies when the real google-cloud-compute client sends them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from orchestrator.model.gce_rules import load_gce_rules
from orchestrator.model.instances import InstanceRequest, Role
from orchestrator.model.spec import GceProvider as GceSpec
from orchestrator.model.spec import validate_spec
from orchestrator.providers.gce.backend import request_settings
from orchestrator.providers.gce.dry_run import gce_dry_run
from orchestrator.providers.gce.requests import instance_resource
from orchestrator_testing.gce_emulator import GceEmulator
from tests.cli_inproc import run_cli

REPO = Path(__file__).resolve().parent.parent
DLVM = "projects/deeplearning-platform-release/"
DEBIAN = "projects/debian-cloud/global/images/family/debian-12"
# name -> (worker group, zone, expected boot disk)
GROUPS: dict[str, tuple[dict[str, Any], str, str]] = {
    "h200": ({"gpu": "h200", "machine_type": "a3-ultragpu-8g", "spot": True}, "us-central1-b", "hyperdisk-balanced"),
    "b200": ({"gpu": "b200", "machine_type": "a4-highgpu-8g", "spot": True}, "us-central1-b", "hyperdisk-balanced"),
    "g4": ({"gpu": "rtx-pro-6000", "machine_type": "g4-standard-48", "spot": True}, "us-central1-b",
           "hyperdisk-balanced"),
    "h100": ({"gpu": "h100", "machine_type": "a3-highgpu-2g", "spot": True}, "us-central1-a", "pd-balanced"),
    "h100-flex": ({"gpu": "h100", "machine_type": "a3-highgpu-1g", "provisioning": "flex_start"}, "us-central1-a",
                  "pd-balanced"),
    "l4": ({"gpu": "l4", "count": 2, "spot": True}, "us-central1-a", "pd-balanced"),
}


def doc(group: dict[str, Any], zone: str, deadline: str = "4h", **provider: Any) -> dict[str, Any]:
    return {
        "name": "rules", "storage": "gs://my-bucket/orchestrator",
        "provider": {"kind": "gce", "project": "my-gcp-project", "zones": [zone], **provider},
        "training": {"framework": "pytorch", "job": "resnet-cifar", "hparam_set": "resnet_cifar_32",
                     "train_steps": 2000, "checkpoint_every": 500},
        "cluster": {"workers": [group]},
        "policy": {"budget_usd": 500, "deadline": deadline},
        "pricing": {"book": "2026-11"},
    }


@pytest.mark.parametrize("name", list(GROUPS))
def test_dry_run_bodies_follow_googles_rules_and_parse_as_instances(name: str) -> None:
    group, zone, disk = GROUPS[name]
    out = gce_dry_run(validate_spec(doc(group, zone)))
    for insert in out["instances.insert"]:
        body = insert["body"]
        assert insert["image_route"] == "dlvm" and insert["boot_s"] > 70  # the route's first boot, from data/
        compute_v1.Instance.from_json(json.dumps(body))  # strict: an unknown field would raise
        assert body["disks"][0]["initializeParams"]["diskType"].endswith(f"/diskTypes/{disk}")
        assert [nic["nicType"] for nic in body["networkInterfaces"]] == ["GVNIC"]
        assert body["disks"][0]["initializeParams"]["sourceImage"].startswith(DLVM)  # an image with a driver
        scheduling = body["scheduling"]
        if group.get("provisioning") == "flex_start":
            assert scheduling["provisioningModel"] == "FLEX_START"
            assert body["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
            assert 600 <= int(scheduling["maxRunDuration"]["seconds"]) <= 7 * 86400
        else:
            assert scheduling["provisioningModel"] == "SPOT"
        # The VM's identity: the storage scope only, never cloud-platform.
        assert body["serviceAccounts"] == [{"email": "default", "scopes": [
            "https://www.googleapis.com/auth/devstorage.read_write"]}]
        keys = {item["key"] for item in body["metadata"]["items"]}
        assert {"ssh-keys", "block-project-ssh-keys", "enable-guest-attributes"} <= keys  # = the real create


def test_spec_options_reach_the_body() -> None:
    group, zone, _ = GROUPS["l4"]
    spec = validate_spec(doc(group, zone, preemption_notice_s=120, image=DEBIAN, gpu_driver="installer",
                             boot_disk_type="pd-ssd", service_account="trainer@my-gcp-project.iam.gserviceaccount.com"))
    body = gce_dry_run(spec)["instances.insert"][0]["body"]
    assert body["scheduling"]["preemptionNoticeDuration"] == {"seconds": "120"}
    assert body["disks"][0]["initializeParams"]["sourceImage"] == DEBIAN
    assert body["disks"][0]["initializeParams"]["diskType"].endswith("/pd-ssd")
    items = {item["key"]: item["value"] for item in body["metadata"]["items"]}
    assert "cuda_installer.pyz" in items["startup-script"]  # Google's installer route, run again after its reboot
    assert body["serviceAccounts"][0]["email"] == "trainer@my-gcp-project.iam.gserviceaccount.com"
    assert not _body("x", group, zone, service_account="none").service_accounts  # "none": no account at all
    (msg,) = _errors(doc(group, zone, service_account="none"))  # gs:// storage needs an account
    assert msg.startswith("provider.service_account: with no service account the VMs cannot write")


def test_the_planner_never_proposes_what_gce_refuses() -> None:
    from orchestrator.costmodel.planner import plan

    spec = validate_spec({**doc(GROUPS["h100"][0], "us-central1-a"), "cluster": None,
                          "search": {"gpus": ["h100", "h200"], "max_workers": 2, "spot": [True, False]}})
    rules = load_gce_rules()
    result = plan(spec)
    assert result.candidates
    for cand in result.candidates:
        for w in cand.workers:
            assert rules.allows(w.machine_type, "SPOT" if w.spot else "STANDARD"), (w.machine_type, w.spot)


def test_boot_time_per_image_route_comes_from_cloud_facts() -> None:
    from orchestrator.model import timings

    group, zone, _ = GROUPS["l4"]
    dlvm = timings.gce_boot_extra_s(validate_spec(doc(group, zone)))
    installer = timings.gce_boot_extra_s(validate_spec(doc(group, zone, image=DEBIAN, gpu_driver="installer")))
    assert dlvm == timings.image_boot_extra_s("dlvm") and installer == timings.image_boot_extra_s("installer")
    assert installer > dlvm > 0


REFUSED: dict[str, tuple[dict[str, Any], str, str, str]] = {
    "on-demand a3-highgpu-2g": ({"gpu": "h100", "machine_type": "a3-highgpu-2g", "spot": False}, "us-central1-a",
                                "4h", "GCE does not create a3-highgpu-2g on-demand"),
    "on-demand H200": ({"gpu": "h200", "machine_type": "a3-ultragpu-8g", "spot": False}, "us-central1-b", "4h",
                       "GCE does not create a3-ultragpu-8g on-demand"),
    "5-minute flex-start": ({"gpu": "h100", "machine_type": "a3-highgpu-1g", "provisioning": "flex_start"},
                            "us-central1-a", "5m", "a Flex-start VM runs at least 10 minutes"),
    "GPU on debian-12": ({"gpu": "l4", "spot": True}, "us-central1-a", "4h", "has no NVIDIA driver for l4"),
}


def test_refusals_exit_2_in_one_line_and_create_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "ORCHESTRATOR_DB_URL": f"sqlite:///{home / 'o.db'}",
           "PYTHONPATH": str(REPO)}
    for what, (group, zone, deadline, expected) in REFUSED.items():
        extra = {"image": DEBIAN} if "debian" in what else {}
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(doc(group, zone, deadline, **extra)))
        for dry in ([], ["--dry-run"]):
            args = ["launch", *dry, str(path)]
            if what == next(iter(REFUSED)) and not dry:  # the console script once; the rest in this interpreter
                out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], capture_output=True,
                                     text=True, env=env, timeout=120)
            else:
                out = run_cli(args, env, Path.cwd())  # the cwd the subprocess inherits
            assert out.returncode == 2, (what, out.stderr)
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and expected in lines[0] and "nothing was created" in lines[0], (what, lines)
            assert "Traceback" not in out.stderr
    assert not (home / "o.db").exists()  # no job row: no database at all


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[GceEmulator]:
    emulator = GceEmulator({"boot_delay_s": 0.1, "op_delay_s": 0.02, "workdir_root": str(tmp_path / "disks")})
    emulator.start()
    yield emulator
    emulator.stop()


def _client(emu: GceEmulator) -> compute_v1.InstancesClient:
    return compute_v1.InstancesClient(credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                                      client_options=ClientOptions(api_endpoint=emu.url))


def _send(client: compute_v1.InstancesClient, body: compute_v1.Instance) -> None:
    zone = body.machine_type.split("/")[1]
    client.insert_unary(project="my-gcp-project", zone=zone, instance_resource=body, retry=None)


def _body(name: str, group: dict[str, Any], zone: str, **provider: Any) -> compute_v1.Instance:
    """What the request builder makes for a group, without the spec check in front (as a buggy client would), as
    the client's message (the provider sends it so: providers/gce/compute_api.message)."""
    spec = GceSpec(project="my-gcp-project", **provider)  # the provider section alone: no spec check
    machine = group.get("machine_type", "g2-standard-4")
    request = InstanceRequest(name=name, job_id="rules", role=Role.WORKER, index=0, generation=0, zone=zone,
                              machine_type=machine, spot=bool(group.get("spot")), gpu=group["gpu"], gpu_count=1,
                              max_run_s=3600, flex_start=group.get("provisioning") == "flex_start")
    return compute_v1.Instance.from_json(json.dumps(instance_resource(request, request_settings(spec))))


def test_the_emulator_accepts_googles_bodies_and_refuses_the_same_ones_gce_refuses(emu: GceEmulator) -> None:
    client = _client(emu)
    for i, name in enumerate(GROUPS):
        group, zone, _ = GROUPS[name]
        for body in gce_dry_run(validate_spec(doc(group, zone)), job_id=f"ok{i}")["instances.insert"]:
            _send(client, compute_v1.Instance.from_json(json.dumps(body["body"])))  # accepted, as GCE would
    refused = {
        "on-demand a3-highgpu-2g": (_body("r1", REFUSED["on-demand a3-highgpu-2g"][0], "us-central1-a"),
                                    "provisioningModel"),
        "on-demand H200": (_body("r2", REFUSED["on-demand H200"][0], "us-central1-b"), "provisioningModel"),
    }
    flex = _body("r3", REFUSED["5-minute flex-start"][0], "us-central1-a")
    flex.scheduling.max_run_duration = compute_v1.Duration(seconds=300)
    refused["5-minute flex-start"] = (flex, "maxRunDuration")
    pd = _body("r4", GROUPS["b200"][0], "us-central1-b")
    pd.disks[0].initialize_params.disk_type = "zones/us-central1-b/diskTypes/pd-balanced"
    refused["B200 on pd-balanced"] = (pd, "diskType")
    virtio = _body("r5", GROUPS["h200"][0], "us-central1-b")
    virtio.network_interfaces[0].nic_type = "VIRTIO_NET"
    refused["H200 without gVNIC"] = (virtio, "nicType")
    for what, (body, field) in refused.items():
        with pytest.raises(gexc.BadRequest) as err:
            _send(client, body)
        assert err.value.code == 400 and field in err.value.message, what
        assert [e["reason"] for e in err.value.errors] == ["invalid"], what  # Google's error shape
    # A GPU VM on debian-12 is created by GCE (it just cannot train): the emulator creates it too; the
    # product refuses it before sending (test_refusals_exit_2_in_one_line_and_create_nothing).
    _send(client, _body("r6", {"gpu": "l4", "spot": True}, "us-central1-a", image=DEBIAN))


def _errors(document: dict[str, Any]) -> list[str]:
    from orchestrator.model.spec import SpecError

    with pytest.raises(SpecError) as err:
        validate_spec(document)
    return [str(e) for e in err.value.errors]


def test_spec_refuses_a_disk_or_a_fallback_gce_would_refuse() -> None:
    group, zone, _ = GROUPS["b200"]
    (msg,) = _errors(doc(group, zone, boot_disk_type="pd-balanced"))
    assert msg.startswith("provider.boot_disk_type: a4-highgpu-8g boots only from hyperdisk-balanced")
    fallback = {**doc(*GROUPS["h100"][:2]), "policy": {"on_revocation": "fallback-on-demand", "deadline": "4h"}}
    (msg,) = _errors(fallback)
    assert msg.startswith("policy.on_revocation: fallback-on-demand would replace a preempted a3-highgpu-2g")


def test_the_notice_window_is_the_one_the_vm_has() -> None:
    from orchestrator.decide import replacement as replacing
    from orchestrator.model import timings

    group, zone, _ = GROUPS["l4"]
    short, long = (validate_spec(doc(group, zone, preemption_notice_s=s)).provider for s in (0, 120))
    assert timings.notice_window_s(short) == 30 and timings.notice_window_s(long) == 120
    # The controller keeps a revoked VM through its window and as long again (checkpoint upload), then deletes it.
    assert replacing.in_notice_grace(0.0, 200.0, timings.notice_window_s(long))
    assert not replacing.in_notice_grace(0.0, 200.0, timings.notice_window_s(short))


def test_the_emulator_gives_a_spot_vm_the_notice_it_asked_for(tmp_path: Path) -> None:
    emulator = GceEmulator({"boot_delay_s": 0.05, "op_delay_s": 0.01, "preempt_delay_s": 0.3,
                            "workdir_root": str(tmp_path / "disks")})
    emulator.start()
    try:
        client = _client(emulator)
        group = GROUPS["l4"][0]
        _send(client, _body("short", group, "us-central1-a"))
        _send(client, _body("long", group, "us-central1-a", preemption_notice_s=120))
        deadline = time.monotonic() + 10
        while any((emulator.instance(n) or {}).get("status") != "RUNNING" for n in ("short", "long")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        emulator.preempt("short")
        emulator.preempt("long")
        time.sleep(0.6)  # past the 30 s window (0.3 s here), inside the 120 s one (1.2 s)
        assert emulator.instance("short") is None  # spot, DELETE: gone after its window
        assert (emulator.instance("long") or {}).get("status") == "STOPPING"
    finally:
        emulator.stop()


def test_the_most_specific_rule_wins_and_every_row_has_a_public_source() -> None:
    rules = load_gce_rules()
    assert rules.allows("a3-highgpu-8g", "STANDARD") and not rules.allows("a3-highgpu-2g", "STANDARD")
    assert not rules.allows("a4-highgpu-8g", "STANDARD") and rules.allows("a4-highgpu-8g", "FLEX_START")
    assert not rules.allows("a4x-highgpu-4g", "FLEX_START")  # a4x is its own family, not a4's
    assert rules.allows("g2-standard-4", "FLEX_START") and not rules.allows("g4-standard-48", "FLEX_START")
    assert rules.boot_disk("g4-standard-48") == "hyperdisk-balanced"
    assert rules.boot_disk("n1-standard-4") == "pd-balanced"
    assert rules.gvnic_required("a3-ultragpu-8g") and not rules.gvnic_required("g2-standard-4")
    assert rules.gpu_count_message("n1-standard-8", "nvidia-tesla-t4", 3) is not None
    assert (rules.flex_run_s(300), rules.flex_run_s(30 * 86400)) == (600, 7 * 86400)
    assert rules.image_route("images/family/orchestrator-worker-l4", "p").route == "baked"
    assert rules.image_route(DEBIAN).driver is False
    assert rules.image_route(DEBIAN, installer=True).route == "installer"
    assert all(row.source.startswith("https://") for row in (*rules.families, *rules.images))
