"""`orchestrator image bake` against the GCE emulator (real google-cloud-compute client) and a real sshd.

The emulator reports the local sshd's port and a per-instance work directory in the instance metadata,
so everything but the recipe itself is real: VM creation, the ssh-keys metadata (installed into the
sshd's authorized_keys by an ``on_running`` hook, as GCE's guest agent would), the push, the detached run
over SSH, the exit-code check, the image and the cleanup. The recipe is replaced by a harmless command.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.control.images import BakeError, bake_image
from orchestrator.core.errors import UserError
from orchestrator.core.paths import user_dir
from orchestrator.providers.gce.provider import GceProvider, RetrySettings
from orchestrator_testing.cloud import provider_settings
from orchestrator_testing.gce_emulator import GceEmulator
from orchestrator_testing.sshd import Sshd

P, ZONE = "proj-bake", "us-central1-c"
REPO = Path(__file__).resolve().parent.parent
FAST = {
    "boot_delay_s": 0.05,
    "stop_delay_s": 0.03,
    "delete_delay_s": 0.03,
    "op_delay_s": 0.02,
    "image_delay_s": 0.03,
    "operation_wait_max_s": 5.0,
}
QUICK_RETRY = RetrySettings(
    attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02, request_timeout_s=5.0,
    wait_call_timeout_s=5.0, operation_timeout_s=10.0,
)
FAST_BAKE: dict[str, Any] = {"poll_s": 0.05, "ssh_timeout_s": 15.0, "boot_timeout_s": 15.0, "wait_s": 30.0}


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with Sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def running() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def emu(sshd: Sshd, tmp_path: Path, running: list[dict[str, Any]]) -> Iterator[GceEmulator]:
    def guest_agent(instance: dict[str, Any]) -> None:
        """What GCE's guest agent does on boot: install the ssh-keys metadata into authorized_keys."""
        running.append(instance)
        for item in instance.get("metadata", {}).get("items", []):
            if item["key"] == "ssh-keys":
                for line in item["value"].splitlines():
                    sshd.authorize(line.split(":", 1)[1])

    emulator = GceEmulator({**FAST, "ssh_port": sshd.port, "workdir_root": str(tmp_path / "disks")},
                           on_running=guest_agent)
    emulator.start()
    yield emulator
    emulator.stop()


def write_spec(path: Path, provider: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "bake-test",
        "provider": provider,
        "cluster": {"workers": [{"gpu": "v100", "count": 1, "zone": ZONE}]},
    }))
    return path


@pytest.fixture
def spec(emu: GceEmulator, tmp_path: Path) -> Path:
    return write_spec(tmp_path / "spec.yaml", {
        "kind": "gce", "project": P, "zones": [ZONE], **provider_settings(emu.url),
    })


@pytest.fixture
def gce(emu: GceEmulator) -> Iterator[GceProvider]:
    provider = GceProvider(P, api_endpoint=emu.url, retry=QUICK_RETRY)
    yield provider
    provider.close()


def test_bake_creates_family_image_and_deletes_builder(
    emu: GceEmulator, spec: Path, tmp_path: Path, running: list[dict[str, Any]]
) -> None:
    # The provider comes from the spec (api_endpoint -> the emulator); the transport is a real SshTransport.
    command = ["sh", "-c", 'echo "baked $GPU" > baked.txt; echo building']
    image = bake_image(role="worker", gpu="v100", spec_path=spec, name="orch-test-img",
                       recipe_command=command, **FAST_BAKE)

    assert image == "orch-test-img"
    body = emu.image(image, P)
    assert body is not None and body["family"] == "orchestrator-worker-v100"
    builder = "bake-orch-test-img"
    assert emu.instance(builder) is None, "the builder VM must be deleted"
    # What the builder looked like: on-demand, one V100, labelled for `orchestrator gc`.
    (vm,) = running
    assert vm["name"] == builder
    assert vm["labels"]["orchestrator"] == "1" and vm["labels"]["orch-job"] == builder
    assert vm["scheduling"].get("provisioningModel", "STANDARD") != "SPOT"
    assert [a["acceleratorType"].rsplit("/", 1)[-1] for a in vm["guestAccelerators"]] == ["nvidia-tesla-v100"]
    # The recipe was pushed to the instance's disk and the command ran there, with GPU in its environment.
    disk = tmp_path / "disks" / builder
    assert (disk / "worker.sh").read_text() == (REPO / "images" / "worker.sh").read_text()
    assert (disk / "baked.txt").read_text() == "baked v100\n"
    assert not (user_dir() / "keys" / builder).exists(), "the per-bake SSH key is forgotten"
    assert vm["tags"]["items"] == [f"orch-{builder}"], "the builder has a tag of its own"
    assert emu.firewall(f"orch-{builder}-ssh", P) is None, "its rules went with it"


def test_failing_recipe_leaves_no_vm_and_no_image(emu: GceEmulator, spec: Path, gce: GceProvider) -> None:
    with pytest.raises(BakeError, match=r"exited with code 7(.|\n)*boom") as err:
        bake_image(role="ps", gpu=None, spec_path=spec, name="orch-bad-img", provider=gce,
                   recipe_command=["sh", "-c", "echo boom; exit 7"], **FAST_BAKE)
    assert err.value.exit_code == 1
    assert emu.instance("bake-orch-bad-img") is None
    assert emu.image("orch-bad-img", P) is None
    assert emu.snapshot()["images"] == [] and emu.snapshot()["instances"] == []


def test_builder_that_cannot_be_deleted_is_reported(emu: GceEmulator, spec: Path, gce: GceProvider) -> None:
    emu.inject_fault("instances.delete", status=403, count=None)
    with pytest.raises(BakeError, match="could not be deleted"):
        bake_image(role="ps", gpu=None, spec_path=spec, name="orch-leak-img", provider=gce,
                   recipe_command=["true"], **FAST_BAKE)
    assert emu.image("orch-leak-img", P) is not None
    emu.clear_faults()
    gce.delete("bake-orch-leak-img", ZONE)


def test_refusals_cost_nothing(emu: GceEmulator, spec: Path, tmp_path: Path) -> None:
    local = write_spec(tmp_path / "local.yaml", {"kind": "local"})
    with pytest.raises(UserError, match="provider.kind: gce"):
        bake_image(role="worker", gpu="v100", spec_path=local)
    with pytest.raises(UserError, match="K80") as k80:
        bake_image(role="worker", gpu="k80", spec_path=spec)
    assert k80.value.hint is not None and "k80" not in k80.value.hint and "l4" in k80.value.hint
    with pytest.raises(UserError, match="retired from Compute Engine 2026-09-15") as p100:
        bake_image(role="worker", gpu="p100", spec_path=spec)  # suggests only GPUs GCE sells today
    assert p100.value.hint is not None and "p100" not in p100.value.hint and "h100" in p100.value.hint
    with pytest.raises(UserError, match="--gpu"):
        bake_image(role="worker", gpu=None, spec_path=spec)
    with pytest.raises(UserError, match="CPU-only"):
        bake_image(role="ps", gpu="t4", spec_path=spec)
    assert emu.snapshot()["calls"] == {}, "refused before any API call"
