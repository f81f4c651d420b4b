"""`orchestrator image bake` against the GCE emulator (real google-cloud-compute client) and a real sshd.

The emulator reports the local sshd's port and a per-instance work directory in the instance metadata,
so everything but the recipe itself is real: VM creation, the ssh-keys metadata (installed into the
sshd's authorized_keys by an ``on_running`` hook, as GCE's guest agent would), the push, the detached run
over SSH, the exit-code check, the image and the cleanup. The recipe is replaced by a harmless command.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text as sql_text

from orchestrator.control.bake_record import BakeRecord
from orchestrator.control.daemon import sweep
from orchestrator.control.driver import spec_to_yaml
from orchestrator.control.gc import find_orphans, finish_pending_deletes
from orchestrator.control.images import BakeError, bake_image
from orchestrator.control.launcher import cancel_job
from orchestrator.control.signals import Terminated
from orchestrator.model.catalog import CURRENT_BOOK, load_catalog
from orchestrator.model.errors import UserError
from orchestrator.model.instances import InstanceRequest, Role
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import load_spec
from orchestrator.model.status import InstanceStatus, JobStatus
from orchestrator.providers.gce.provider import GceProvider, RetrySettings
from orchestrator_testing.cloud import provider_settings
from orchestrator_testing.gce_emulator import GceEmulator
from orchestrator_testing.sshd import Sshd

# Google's Deep Learning VM base family (driver + CUDA, no framework) for every current GPU: what bakes build on.
WORKER_BASE_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu129-ubuntu-2204-nvidia-580"

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


@pytest.fixture(autouse=True)
def _home() -> None:
    user_dir()  # the per-test home holds the results DB (conftest points ORCHESTRATOR_DB_URL there)


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
    # What the builder looked like: on-demand, one V100, labelled for `orchestrator gc` and its sweep.
    (vm,) = running
    builder = vm["name"]
    assert builder.startswith("bake-orch-test-img-"), "named after the image, stamped: a retry gets its own"
    assert emu.instance(builder) is None, "the builder VM must be deleted"
    assert vm["labels"]["orchestrator"] == "1" and vm["labels"]["orch-job"] == builder
    assert float(vm["labels"]["orch-bake-until"]) > time.time(), "the sweep leaves it alone until then"
    assert vm["scheduling"].get("provisioningModel", "STANDARD") != "SPOT"
    assert int(vm["scheduling"]["maxRunDuration"]["seconds"]) > FAST_BAKE["wait_s"], "GCE bounds its spend"
    assert [a["acceleratorType"].rsplit("/", 1)[-1] for a in vm["guestAccelerators"]] == ["nvidia-tesla-v100"]
    # From a base image with a driver route (a Deep Learning VM family), so the image trains on first boot.
    from orchestrator.providers.gce.bake import GceImageBuilder

    builder_of = GceImageBuilder(load_spec(spec).provider.as_gce())  # type: ignore[arg-type]
    made = builder_of.provider(builder_of.plan("worker", "v100", "tensorflow", None, print))
    assert made.settings.image_url == WORKER_BASE_IMAGE  # type: ignore[attr-defined]
    made.close()
    # The recipe was pushed to the instance's disk and the command ran there, with GPU in its environment.
    disk = tmp_path / "disks" / builder
    assert (disk / "gpu-worker.sh").read_text() == (REPO / "images" / "gpu-worker.sh").read_text()
    assert (disk / "baked.txt").read_text() == "baked v100\n"
    assert not (user_dir() / "keys" / builder).exists(), "the per-bake SSH key is forgotten"
    assert vm["tags"]["items"] == [f"orch-{builder}"], "the builder has a tag of its own"
    assert emu.firewall(f"orch-{builder}-ssh", P) is None, "its rules went with it"


def test_pytorch_h100_image_is_baked_on_spot_through_the_launch_request_builder(
    emu: GceEmulator, spec: Path, tmp_path: Path, running: list[dict[str, Any]]
) -> None:
    # a3-highgpu-1g has no on-demand (Spot / Flex-start only): an on-demand builder would be refused by GCE.
    command = ["sh", "-c", 'echo "$FRAMEWORK $GPU" > baked.txt']
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line)  # what `orchestrator image bake` prints (pytest -s shows it)

    image = bake_image(role="worker", gpu="h100", framework="pytorch", spec_path=spec, recipe_command=command,
                       say=say, **FAST_BAKE)
    assert image.startswith("orchestrator-worker-torch-h100-")
    assert emu.image(image, P)["family"] == "orchestrator-worker-torch-h100"  # type: ignore[index]
    (vm,) = running
    assert vm["scheduling"]["provisioningModel"] == "SPOT" and vm["machineType"].endswith("/a3-highgpu-1g")
    assert "guestAccelerators" not in vm, "an A3 type comes with its GPU"
    assert (tmp_path / "disks" / vm["name"] / "baked.txt").read_text() == "pytorch h100\n"
    assert any("a3-highgpu-1g, 1xh100, spot" in line for line in lines), lines
    # The body is the launch's: requests.instance_resource with the builder's provider settings.
    from orchestrator.providers.gce.bake import GceImageBuilder
    from orchestrator.providers.gce.requests import GceRequestSettings, bundled_machine_types, instance_resource

    builder = GceImageBuilder(load_spec(spec).provider.as_gce())  # type: ignore[arg-type]
    plan = builder.plan("worker", "h100", "pytorch", image, print)
    req = builder.request(plan, ZONE, "KEY", dict(vm["labels"]), int(vm["scheduling"]["maxRunDuration"]["seconds"]))
    settings = GceRequestSettings(project=P, image=plan.base_image, network_tag="orch-{job}",
                                  bundled=bundled_machine_types())
    expected = instance_resource(req, settings)  # the API's JSON
    keys = ("provisioningModel", "instanceTerminationAction", "onHostMaintenance", "automaticRestart")
    assert {k: vm["scheduling"].get(k) for k in keys} == {k: expected["scheduling"].get(k) for k in keys}
    assert expected["machineType"].rsplit("/", 1)[-1] == vm["machineType"].rsplit("/", 1)[-1]
    # The ledger bills the builder at today's spot price.
    price = load_catalog().price_book(CURRENT_BOOK).instance_price("a3-highgpu-1g", "h100", 1, spot=True)
    assert _sql("SELECT spot, price_per_hour FROM instances") == [(1, pytest.approx(price))]


def test_every_current_gpu_and_framework_plans_a_bake() -> None:
    from orchestrator.providers.gce.bake_plan import plan_bake

    catalog = load_catalog()
    for gpu in catalog.current_gpus():
        for framework in ("tensorflow", "pytorch"):
            plan = plan_bake("worker", gpu, [], framework=framework, say=lambda _: None)
            assert plan.base_image == WORKER_BASE_IMAGE and plan.recipe.name == "gpu-worker.sh"
            assert plan.recipe_env["FRAMEWORK"] == framework and plan.gpu_count >= 1
            # Spot exactly where GCE has no on-demand VM of the type (a3-highgpu-1g, A3 Ultra, A4).
            assert plan.spot == (gpu in ("h100", "h200", "b200")), (gpu, plan.machine_type)
    with pytest.raises(UserError, match="no parameter servers"):
        plan_bake("ps", None, [], framework="pytorch")
    with pytest.raises(UserError, match="--framework"):
        plan_bake("worker", "l4", [], framework="jax")


def test_failing_recipe_leaves_no_vm_and_no_image(emu: GceEmulator, spec: Path, gce: GceProvider) -> None:
    with pytest.raises(BakeError, match=r"exited with code 7(.|\n)*boom") as err:
        bake_image(role="ps", gpu=None, spec_path=spec, name="orch-bad-img", provider=gce,
                   recipe_command=["sh", "-c", "echo boom; exit 7"], **FAST_BAKE)
    assert err.value.exit_code == 1
    assert emu.image("orch-bad-img", P) is None
    assert emu.snapshot()["images"] == [] and emu.snapshot()["instances"] == []
    (bake,) = _sql("SELECT status, mode, cost_usd FROM job_summary")
    assert bake[:2] == ("failed", "bake") and bake[2] > 0, "a failed bake is billed too"
    assert _sql("SELECT role FROM ledger") == [("builder",)]


def test_builder_that_cannot_be_deleted_is_reported(emu: GceEmulator, spec: Path, gce: GceProvider) -> None:
    emu.inject_fault("instances.delete", status=403, count=None)
    with pytest.raises(BakeError, match="could not be deleted"):
        bake_image(role="ps", gpu=None, spec_path=spec, name="orch-leak-img", provider=gce,
                   recipe_command=["true"], **FAST_BAKE)
    assert emu.image("orch-leak-img", P) is not None
    (builder,) = [i["name"] for i in emu.snapshot()["instances"]]
    # Still billing: its row stays open (costed to now) until it is gone.
    assert _sql("SELECT i.status, c.ledger FROM instances i JOIN instance_costs c ON c.instance_id = i.id") == [
        ("deleting", "open")]
    emu.clear_faults()
    # What the message says to run: the bake is over, so its builder is an orphan now, label or not.
    assert [o.name for _, o in find_orphans()] == [builder]
    assert finish_pending_deletes() == []
    assert emu.instance(builder) is None
    assert _sql("SELECT status FROM instances") == [("deleted",)] and len(_sql("SELECT id FROM ledger")) == 1


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


def _sql(query: str) -> list[tuple[Any, ...]]:
    from sqlalchemy import text

    from orchestrator.store.db import open_session

    with open_session() as session:
        return [tuple(r) for r in session.execute(text(query)).all()]


def _request(name: str, job: str, labels: dict[str, str]) -> InstanceRequest:
    return InstanceRequest(name=name, job_id=job, role=Role.PS, index=0, generation=0, zone=ZONE,
                           machine_type="n1-standard-4", spot=False, labels=labels)


def test_sweep_during_a_bake_keeps_the_builder_and_the_ledger_bills_the_bake(
    emu: GceEmulator, spec: Path, gce: GceProvider
) -> None:
    # A real orphan (a job this DB never recorded) waits in the project; the daemon's sweep runs while the
    # recipe is about to start, as it would every 5 minutes during a real bake.
    gce.create(_request("lost-job-ps-0-0", "lost-job", {}))
    swept: list[str] = []

    def say(line: str) -> None:
        if line.startswith("running ") and not swept:
            sweep()
            swept.append(line)

    bake_image(role="ps", gpu=None, spec_path=spec, name="orch-swept-img", provider=gce,
               recipe_command=["sh", "-c", "sleep 0.3"], say=say, **FAST_BAKE)
    assert swept, "the sweep ran mid-bake"
    assert emu.image("orch-swept-img", P) is not None, "the builder survived the sweep: the bake finished"
    assert emu.instance("lost-job-ps-0-0") is None, "the sweep still deletes a real orphan"
    # The ledger: one row for the builder, seconds x its on-demand price, under a 'bake' pseudo-job.
    price = load_catalog().price_book(CURRENT_BOOK).instance_price("n1-standard-4", None, 0, spot=False)
    ((job, role, seconds, hourly, usd),) = _sql("SELECT job_id, role, seconds, price_per_hour, usd FROM ledger")
    assert job.startswith("bake-orch-swept-img-") and role == "builder" and hourly == pytest.approx(price)
    assert seconds > 0 and usd == pytest.approx(seconds * price / 3600)
    assert _sql("SELECT mode, status, cost_usd, cluster_shape FROM job_summary") == [
        ("bake", "succeeded", pytest.approx(usd), "builder n1-standard-4")]


def test_sweep_respects_the_label_alone_until_it_expires(emu: GceEmulator, spec: Path, gce: GceProvider) -> None:
    # The bakes run from another machine (another DB): only the labels speak for them. One recorded gce job
    # (finished) makes the sweep list this project.
    from orchestrator.control.launcher import create_job
    from orchestrator.store.db import open_session

    with open_session() as session:
        job_id = create_job(session, load_spec(spec)).id
        session.execute(sql_text("UPDATE jobs SET status = 'cancelled' WHERE id = :j"), {"j": job_id})
    later, past = str(int(time.time()) + 3600), str(int(time.time()) - 1)
    gce.create(_request("bake-live", "bake-live", {"orch-bake": "1", "orch-bake-until": later}))
    gce.create(_request("bake-stale", "bake-stale", {"orch-bake": "1", "orch-bake-until": past}))
    gce.create(_request(f"{job_id}-ps-0-0", job_id, {}))  # its job is over
    sweep()
    assert emu.instance("bake-live") is not None, "a bake in progress keeps its builder"
    assert emu.instance("bake-stale") is None, "past its time limit the builder is an orphan"
    assert emu.instance(f"{job_id}-ps-0-0") is None


def test_an_abandoned_bake_is_closed_by_the_sweep(emu: GceEmulator, spec: Path, gce: GceProvider) -> None:
    # The bake process died (kill -9) after creating its builder; the time limit has passed.
    record = BakeRecord.start(job_id="bake-dead", builder="bake-dead", image="img-dead", spec_yaml=spec_to_yaml(
        load_spec(spec)), price_book="2026-11", shape="builder n1-standard-4", gpu=None,
        machine_type="n1-standard-4", zone=ZONE, price_per_hour=0.19, limit_s=0.0, provider="gce")
    gce.create(_request("bake-dead", "bake-dead", {"orch-bake": "1", "orch-bake-until": "1"}))
    record.step("builder VM created", JobStatus.PROVISIONING, InstanceStatus.PROVISIONING)
    sweep()
    assert emu.instance("bake-dead") is None
    assert _sql("SELECT status, status_reason FROM jobs")[0][0] == "failed"
    ((seconds, usd),) = _sql("SELECT seconds, usd FROM ledger")
    assert usd == pytest.approx(seconds * 0.19 / 3600)


def test_cancel_of_a_bake_says_who_drives_it(spec: Path) -> None:
    BakeRecord.start(job_id="bake-x", builder="bake-x", image="img-x", spec_yaml=spec_to_yaml(load_spec(spec)),
                     price_book="2026-11", shape="builder n1-standard-4", gpu=None, machine_type="n1-standard-4",
                     zone=ZONE, price_per_hour=0.19, limit_s=600.0, provider="gce")
    with pytest.raises(UserError, match="driven by its own `orchestrator image bake` process"):
        cancel_job("bake-x")


def test_sigterm_mid_bake_deletes_the_builder(emu: GceEmulator, spec: Path, gce: GceProvider) -> None:
    def say(line: str) -> None:
        if line.startswith("running "):
            os.kill(os.getpid(), signal.SIGTERM)  # `kill` / `timeout` of `orchestrator image bake`

    before = signal.getsignal(signal.SIGTERM)  # another test in this process may have left its own
    with pytest.raises(Terminated):
        bake_image(role="ps", gpu=None, spec_path=spec, name="orch-term-img", provider=gce,
                   recipe_command=["sh", "-c", "sleep 30"], say=say, **FAST_BAKE)
    assert emu.snapshot()["instances"] == [] and emu.image("orch-term-img", P) is None
    assert _sql("SELECT status, status_reason FROM jobs") == [("cancelled", "interrupted (SIGTERM); builder deleted")]
    assert _sql("SELECT status FROM instances") == [("deleted",)] and len(_sql("SELECT id FROM ledger")) == 1
    assert signal.getsignal(signal.SIGTERM) is before, "the previous handler is back"
