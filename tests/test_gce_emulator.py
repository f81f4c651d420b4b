"""The GCE emulator, driven by the real google-cloud-compute client (REST transport, anonymous)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exc
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1 as c

from orchestrator_testing.gce_emulator import GceEmulator
from orchestrator_testing.gce_emulator_filter import FilterError, compile_filter
from orchestrator_testing.processes import stop

P, Z, Z2 = "proj", "us-central1-a", "us-central1-b"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
FAST = {
    "boot_delay_s": 0.1,
    "stop_delay_s": 0.05,
    "delete_delay_s": 0.05,
    "preempt_delay_s": 0.05,
    "op_delay_s": 0.02,
    "image_delay_s": 0.05,
    "operation_wait_max_s": 5.0,
}


class Clients:
    def __init__(self, url: str) -> None:
        kw: dict[str, Any] = {
            "credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
            "client_options": ClientOptions(api_endpoint=url),
        }
        self.instances = c.InstancesClient(**kw)
        self.zone_ops = c.ZoneOperationsClient(**kw)
        self.global_ops = c.GlobalOperationsClient(**kw)
        self.firewalls = c.FirewallsClient(**kw)
        self.images = c.ImagesClient(**kw)

    def insert(self, inst: c.Instance, request_id: str | None = None) -> c.Operation:
        zone = inst.machine_type.split("/")[1]  # "zones/<zone>/machineTypes/<type>"
        req = c.InsertInstanceRequest(project=P, zone=zone, instance_resource=inst)
        if request_id:
            req.request_id = request_id
        return self.instances.insert_unary(request=req, retry=None)

    def wait(self, op: c.Operation, zone: str | None = Z) -> c.Operation:
        if zone is None:
            return self.global_ops.wait(project=P, operation=op.name)
        return self.zone_ops.wait(project=P, zone=zone, operation=op.name)

    def get(self, name: str, zone: str = Z) -> c.Instance:
        return self.instances.get(project=P, zone=zone, instance=name, retry=None)


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[GceEmulator]:
    emulator = GceEmulator({**FAST, "ssh_port": 2222, "workdir_root": str(tmp_path / "disks")})
    emulator.start()
    yield emulator
    emulator.stop()


@pytest.fixture
def api(emu: GceEmulator) -> Clients:
    return Clients(emu.url)


def instance(
    name: str,
    zone: str = Z,
    *,
    gpu: str | None = "nvidia-tesla-t4",
    count: int = 1,
    spot: bool = True,
    labels: dict[str, str] | None = None,
    machine: str = "n1-standard-4",
    action: str = "STOP",
    image: str = IMAGE,
) -> c.Instance:
    sched = c.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=not spot)
    if spot:
        sched.provisioning_model = "SPOT"
        sched.instance_termination_action = action
    inst = c.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{machine}",
        scheduling=sched,
        labels=labels if labels is not None else {"orchestrator": "1", "orch-job": "j"},
        disks=[
            c.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=c.AttachedDiskInitializeParams(source_image=image),
            )
        ],
        network_interfaces=[
            c.NetworkInterface(access_configs=[c.AccessConfig(name="nat", type_="ONE_TO_ONE_NAT")])
        ],
        metadata=c.Metadata(items=[c.Items(key="startup-script", value="echo hi")]),
    )
    if gpu:
        inst.guest_accelerators = [
            c.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{gpu}", accelerator_count=count
            )
        ]
    return inst


def until(predicate: Any, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_lifecycle_fields_and_hooks(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    ran = threading.Event()

    def on_running(i: dict[str, Any]) -> None:
        seen.append(("running", i["status"]))
        ran.set()

    emulator = GceEmulator(
        {**FAST, "ssh_port": 2200, "workdir_root": str(tmp_path)},
        on_running=on_running,
        on_deleted=lambda i: seen.append(("deleted", i["name"])),
    )
    with emulator:
        api = Clients(emulator.url)
        # Long emulated delays, crossed with advance(): transitional states are checked without races.
        emulator.configure(boot_delay_s=100.0, delete_delay_s=100.0)
        op = api.insert(instance("a-worker-0-0"))
        assert op.status != c.Operation.Status.DONE and op.operation_type == "insert"
        assert api.get("a-worker-0-0").status == "PROVISIONING"
        emulator.advance(50)
        until(lambda: api.get("a-worker-0-0").status == "STAGING")
        emulator.advance(50)
        assert api.wait(op).status == c.Operation.Status.DONE
        got = api.get("a-worker-0-0")
        assert got.status == "RUNNING" and got.kind == "compute#instance" and got.id > 0
        assert got.zone.endswith(f"/projects/{P}/zones/{Z}") and got.self_link.endswith(
            "/instances/a-worker-0-0"
        )
        assert got.labels["orch-job"] == "j" and got.label_fingerprint and got.creation_timestamp
        assert got.scheduling.provisioning_model == "SPOT" and got.scheduling.preemptible
        assert got.scheduling.instance_termination_action == "STOP"
        assert got.guest_accelerators[0].accelerator_type.endswith("/acceleratorTypes/nvidia-tesla-t4")
        nic = got.network_interfaces[0]
        assert nic.network_i_p == "127.0.0.1" and nic.access_configs[0].nat_i_p == "127.0.0.1"
        items = {i.key: i.value for i in got.metadata.items}
        assert items["orchestrator-ssh-port"] == "2200" and items["startup-script"] == "echo hi"
        assert (
            Path(items["orchestrator-workdir"]) == tmp_path / "a-worker-0-0"
            and (tmp_path / "a-worker-0-0").is_dir()
        )
        assert ran.wait(2)
        op = api.instances.delete_unary(project=P, zone=Z, instance="a-worker-0-0")
        assert api.get("a-worker-0-0").status == "STOPPING"
        emulator.advance(100)
        api.wait(op)
        with pytest.raises(gexc.NotFound):
            api.get("a-worker-0-0")
        until(lambda: ("deleted", "a-worker-0-0") in seen)
        assert ("running", "RUNNING") in seen


def test_request_id_dedupes_and_same_name_conflicts(emu: GceEmulator, api: Clients) -> None:
    rid = str(uuid.uuid4())
    first = api.insert(instance("dup"), request_id=rid)
    again = api.insert(instance("dup"), request_id=rid)
    assert again.name == first.name
    with pytest.raises(gexc.Conflict, match="already exists"):
        api.insert(instance("dup"), request_id=str(uuid.uuid4()))
    api.wait(first)
    assert api.insert(instance("dup"), request_id=rid).status == c.Operation.Status.DONE  # replayed, DONE now
    assert emu.snapshot()["instances_created"] == 1


def test_delete_unknown_is_not_found_and_busy_instance_not_ready(emu: GceEmulator, api: Clients) -> None:
    with pytest.raises(gexc.NotFound):
        api.instances.delete_unary(project=P, zone=Z, instance="nope", retry=None)
    emu.configure(boot_delay_s=100.0)
    api.insert(instance("busy"))
    with pytest.raises(gexc.BadRequest, match="not ready"):
        api.instances.delete_unary(project=P, zone=Z, instance="busy", retry=None)


def test_aggregated_list_label_filters_and_paging(emu: GceEmulator, api: Clients) -> None:
    for i in range(3):
        api.insert(instance(f"a-{i}", Z, labels={"orchestrator": "1", "orch-job": "a"}))
        api.insert(instance(f"a-{i}", Z2, labels={"orchestrator": "1", "orch-job": "a"}))
    api.insert(instance("b-0", labels={"orchestrator": "1", "orch-job": "b"}))
    api.insert(instance("other", labels={"team": "x"}))

    def names(flt: str, max_results: int = 500) -> list[str]:
        req = c.AggregatedListInstancesRequest(project=P, filter=flt, max_results=max_results)
        return sorted(
            i.name for _, scoped in api.instances.aggregated_list(request=req) for i in scoped.instances
        )

    assert len(names('labels.orch-job = "a"')) == 6
    assert names('(labels.orchestrator = "1") AND (labels.orch-job = "b")') == ["b-0"]
    assert len(names('labels.orchestrator = "1"')) == 7
    assert names("labels.team:*") == ["other"]
    assert names('name eq "a-.*" status != TERMINATED') == names('labels.orch-job = "a"')
    emu.reset_calls()
    assert len(names('labels.orch-job = "a"', max_results=4)) == 6
    assert emu.snapshot()["calls"]["instances.aggregatedList"] == 2  # two pages, one call each
    page = api.instances.aggregated_list(request=c.AggregatedListInstancesRequest(project=P, max_results=1))
    first = next(iter(page.pages))
    warning = first.items["zones/us-east1-b"].warning
    assert first.next_page_token and warning.code == "NO_RESULTS_ON_PAGE"  # type: ignore[attr-defined]
    listed = api.instances.list(request=c.ListInstancesRequest(project=P, zone=Z2, max_results=2))
    assert [i.name for i in listed] == ["a-0", "a-1", "a-2"]
    with pytest.raises(gexc.BadRequest):
        api.instances.list(
            request=c.ListInstancesRequest(project=P, zone=Z, filter="labels.x = ("), retry=None
        )


def test_stockout_is_an_operation_error(emu: GceEmulator, api: Clients) -> None:
    emu.set_stockout(Z, gpu="nvidia-tesla-t4")
    op = api.wait(api.insert(instance("s-0")))
    assert op.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert f"zones/{Z}" in op.error.errors[0].message and op.http_error_status_code == 503
    with pytest.raises(gexc.NotFound):
        api.get("s-0")
    assert not api.wait(api.insert(instance("s-1", gpu=None, machine="g2-standard-4"))).error.errors  # L4s
    assert not api.wait(api.insert(instance("s-2", Z2)), Z2).error.errors


def test_quota_as_operation_error_and_as_http_403(emu: GceEmulator, api: Clients) -> None:
    emu.set_quota("us-central1", "PREEMPTIBLE_NVIDIA_T4_GPUS", 4)
    assert not api.wait(api.insert(instance("q-0", count=4))).error.errors
    op = api.wait(api.insert(instance("q-1", Z2, count=1)), Z2)
    assert op.error.errors[0].code == "QUOTA_EXCEEDED"
    assert "Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded." in op.error.errors[0].message
    assert "Limit: 4.0 in region us-central1." in op.error.errors[0].message
    assert not api.wait(api.insert(instance("q-2", count=1, spot=False))).error.errors  # on-demand quota
    emu.configure(quota_errors_as_http=True)
    emu.set_quota("us-central1", "CPUS", 8)
    with pytest.raises(gexc.Forbidden, match="Quota 'CPUS' exceeded"):
        api.insert(instance("q-3", gpu=None, machine="n1-standard-8"))


def test_invalid_requests_fail_synchronously(emu: GceEmulator, api: Clients) -> None:
    with pytest.raises(gexc.BadRequest, match="Accelerator type 'nvidia-tesla-k80' does not exist"):
        api.insert(instance("bad-0", gpu="nvidia-tesla-k80"))  # retired: the emulator models GCE in 2026
    emu.configure(accelerators={Z: ["nvidia-tesla-t4"]})
    bad = instance("bad-1", gpu="nvidia-tesla-t4")
    bad.scheduling = c.Scheduling(on_host_maintenance="MIGRATE")
    with pytest.raises(gexc.BadRequest, match="live migration"):
        api.insert(bad)
    with pytest.raises(gexc.BadRequest, match="Machine type"):
        api.insert(instance("bad-2", machine="n9-weird"))
    with pytest.raises(gexc.BadRequest, match="labels"):
        api.insert(instance("bad-3", labels={"Job": "X"}))
    with pytest.raises(gexc.NotFound, match="global/images/nope"):
        api.insert(instance("bad-4", gpu=None, image=f"projects/{P}/global/images/nope"))


def test_fault_injection_errors_timeouts_and_auth(emu: GceEmulator, api: Clients) -> None:
    api.wait(api.insert(instance("f-0")))
    emu.inject_fault("instances.get", 503, count=2)
    for _ in range(2):
        with pytest.raises(gexc.ServiceUnavailable):
            api.get("f-0")
    assert api.get("f-0").name == "f-0"
    emu.inject_fault("instances.*", 500)
    with pytest.raises(gexc.InternalServerError):
        api.get("f-0")
    emu.inject_timeout("instances.get", 1.0)
    with pytest.raises(OSError):  # requests' ReadTimeout
        api.instances.get(project=P, zone=Z, instance="f-0", retry=None, timeout=0.2)
    emu.inject_auth_failure(401, count=1)
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(f"{emu.url}/compute/v1/projects/{P}/zones/{Z}/instances/f-0", timeout=5)
    assert (
        raw.value.code == 401 and json.loads(raw.value.read())["error"]["errors"][0]["reason"] == "required"
    )
    emu.inject_auth_failure(401, count=1)
    # On a 401 google-auth refreshes the credentials and retries; anonymous ones cannot be refreshed.
    with pytest.raises(auth_exc.GoogleAuthError):
        api.get("f-0")
    emu.inject_auth_failure(403, endpoint="instances.delete", count=1)
    with pytest.raises(gexc.Forbidden, match="compute.instances.delete"):
        api.instances.delete_unary(project=P, zone=Z, instance="f-0", retry=None)
    emu.configure(latency_s={"instances.get": 0.2})
    started = time.monotonic()
    api.get("f-0")
    assert time.monotonic() - started >= 0.2
    calls = emu.snapshot()["calls"]
    assert calls["instances.get"] == 8 and calls["instances.delete"] == 1


def test_preemption_stop_and_delete_actions(emu: GceEmulator, api: Clients) -> None:
    api.wait(api.insert(instance("p-stop")))
    api.wait(api.insert(instance("p-del", action="DELETE")))
    api.wait(api.insert(instance("p-std", spot=False)))
    emu.configure(preempt_delay_s=30.0)
    emu.preempt("p-stop")
    emu.preempt("p-del", Z)
    assert api.get("p-stop").status == "STOPPING" and api.get("p-del").status == "STOPPING"
    emu.advance(30)
    until(lambda: api.get("p-stop").status == "TERMINATED")
    got = api.get("p-stop")
    assert not got.network_interfaces[0].access_configs[0].nat_i_p and got.last_stop_timestamp
    until(lambda: emu.instance("p-del") is None)
    req = c.ListZoneOperationsRequest(
        project=P, zone=Z, filter='operationType = "compute.instances.preempted"'
    )
    ops = list(api.zone_ops.list(request=req))
    assert sorted(o.target_link.rsplit("/", 1)[1] for o in ops) == ["p-del", "p-stop"]
    assert all(
        o.status == c.Operation.Status.DONE and o.status_message == "Instance was preempted." for o in ops
    )
    with pytest.raises(Exception, match="not a spot"):
        emu.preempt("p-std")
    assert emu.snapshot()["instances_by_status"] == {"TERMINATED": 1, "RUNNING": 1}


def test_legacy_preemptible_stops_after_24h_and_stop_start(emu: GceEmulator, api: Clients) -> None:
    inst = instance("legacy", spot=False)
    inst.scheduling = c.Scheduling(preemptible=True, automatic_restart=False, on_host_maintenance="TERMINATE")
    api.wait(api.insert(inst))
    emu.advance(86400)
    until(lambda: api.get("legacy").status == "TERMINATED")
    op = api.wait(api.instances.start_unary(project=P, zone=Z, instance="legacy"))
    assert not op.error.errors and api.get("legacy").status == "RUNNING"
    api.wait(api.instances.stop_unary(project=P, zone=Z, instance="legacy"))
    assert api.get("legacy").status == "TERMINATED"


def test_wait_returns_early_when_operation_is_slow(emu: GceEmulator, api: Clients) -> None:
    emu.configure(boot_delay_s=5.0, operation_wait_max_s=0.2)
    op = api.wait(api.insert(instance("slow")))
    assert op.status == c.Operation.Status.RUNNING
    assert api.zone_ops.get(project=P, zone=Z, operation=op.name).status == c.Operation.Status.RUNNING


def test_firewalls_and_images(emu: GceEmulator, api: Clients) -> None:
    rule = c.Firewall(
        name="orch-internal",
        allowed=[c.Allowed(I_p_protocol="tcp", ports=["2222-2230"])],
        source_tags=["orch"],
        target_tags=["orch"],
    )
    op = api.firewalls.insert_unary(project=P, firewall_resource=rule)
    assert op.operation_type == "insert" and api.wait(op, zone=None).status == c.Operation.Status.DONE
    got = api.firewalls.get(project=P, firewall="orch-internal")
    assert got.source_tags == ["orch"] and got.target_tags == ["orch"] and got.direction == "INGRESS"
    assert got.network.endswith("/global/networks/default") and got.allowed[0].ports == ["2222-2230"]
    with pytest.raises(gexc.Conflict):
        api.firewalls.insert_unary(project=P, firewall_resource=rule)
    assert [f.name for f in api.firewalls.list(project=P)] == ["orch-internal"]
    api.wait(api.firewalls.delete_unary(project=P, firewall="orch-internal"), zone=None)
    with pytest.raises(gexc.NotFound):
        api.firewalls.get(project=P, firewall="orch-internal")

    api.wait(api.insert(instance("bake", gpu=None, spot=False)))
    disk = api.get("bake").disks[0].source
    image = c.Image(name="orch-gpu-1", source_disk=disk, family="orch-gpu")
    with pytest.raises(gexc.BadRequest, match="already being used"):
        api.images.insert_unary(project=P, image_resource=image)
    api.wait(api.instances.stop_unary(project=P, zone=Z, instance="bake"))
    emu.configure(image_delay_s=100.0)
    op = api.images.insert_unary(project=P, image_resource=image)
    assert api.images.get(project=P, image="orch-gpu-1").status == "PENDING"
    emu.advance(100)
    api.wait(op, zone=None)
    assert api.images.get_from_family(project=P, family="orch-gpu").name == "orch-gpu-1"
    assert not api.wait(
        api.insert(instance("from-image", image="global/images/family/orch-gpu"))
    ).error.errors


def test_cli_process_and_http_control_api(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({**FAST, "zones": [Z]}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator_testing.gce_emulator", "--port", "0", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        api = Clients(url)
        api.wait(api.insert(instance("cli-0")))

        def control(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
            data = json.dumps(body).encode() if body is not None else None
            req = urllib.request.Request(f"{url}/_emulator/{path}", data=data, method=method)
            with urllib.request.urlopen(req, timeout=5) as resp:
                result: dict[str, Any] = json.loads(resp.read())
                return result

        assert control("POST", "preempt", {"name": "cli-0"})["operation"].startswith("operation-")
        control("POST", "faults", {"endpoint": "instances.get", "status": 503, "count": 1})
        with pytest.raises(gexc.ServiceUnavailable):
            api.get("cli-0")
        control("POST", "stockouts", {"zone": Z})
        assert api.wait(api.insert(instance("cli-1"))).error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
        snap = control("GET", "snapshot")
        assert snap["calls"]["instances.insert"] == 2 and snap["instances"][0]["name"] == "cli-0"
    finally:
        assert stop(proc, timeout_s=5) == 0


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('labels.orch-job = "a"', True),
        ("labels.orch-job = b", False),
        ('(labels.orchestrator = "1") AND (labels.orch-job = "a")', True),
        ('(labels.orchestrator = "1") (labels.orch-job = "b")', False),
        ('labels.orch-job = "b" OR status = RUNNING', True),
        ("NOT labels.orch-job = a", False),
        ("labels.orch-job != a", False),
        ("labels.missing:*", False),
        ("labels.orch-job:*", True),
        ("name eq 'job-.*'", True),
        ("name ne 'job-.*'", False),
        ("scheduling.preemptible = true", True),
        ('name = "job-*"', True),
        ("cpus > 3", True),
        ("networkInterfaces.networkIP = 10.0.0.1", True),
    ],
)
def test_filter_expressions(expr: str, expected: bool) -> None:
    obj = {
        "name": "job-worker-0-0",
        "status": "RUNNING",
        "cpus": 4,
        "scheduling": {"preemptible": True},
        "labels": {"orchestrator": "1", "orch-job": "a"},
        "networkInterfaces": [{"networkIP": "10.0.0.1"}],
    }
    assert compile_filter(expr)(obj) is expected


@pytest.mark.parametrize("expr", ["(a = 1", "a =", "= 1", "a ~ 1", "a = 1)"])
def test_bad_filters_are_rejected(expr: str) -> None:
    with pytest.raises(FilterError):
        compile_filter(expr)


def test_accelerator_optimized_types_time_limits_and_flex_start(emu: GceEmulator, api: Clients) -> None:
    a3 = instance("a3-0", gpu=None, machine="a3-highgpu-2g", action="DELETE")
    a3.scheduling.max_run_duration = c.Duration(seconds=3600)
    api.wait(api.insert(a3))
    got = emu.instance("a3-0")
    assert got is not None and got["scheduling"]["maxRunDuration"] == {"seconds": "3600"}
    assert emu.state.get_instance(P, Z, "a3-0")["scheduling"]["provisioningModel"] == "SPOT"
    both = instance("a3-1", gpu="nvidia-h100-80gb", machine="a3-highgpu-2g", count=2)
    with pytest.raises(gexc.BadRequest, match="comes with its GPUs attached"):
        api.insert(both)
    limited = instance("lim-0", spot=False)
    limited.scheduling.max_run_duration = c.Duration(seconds=3600)
    with pytest.raises(gexc.BadRequest, match="instanceTerminationAction"):
        api.insert(limited)  # GCE asks what to do at the limit
    flex = instance("flex-0", gpu=None, machine="g4-standard-48", spot=False)  # G4: no flex-start (G2 has it)
    flex.scheduling.provisioning_model = "FLEX_START"
    flex.scheduling.max_run_duration = c.Duration(seconds=3600)
    flex.scheduling.instance_termination_action = "DELETE"
    with pytest.raises(gexc.BadRequest, match="FLEX_START is not supported"):
        api.insert(flex)
    flex.machine_type = f"zones/{Z}/machineTypes/a2-highgpu-1g"
    flex.scheduling.max_run_duration = c.Duration(seconds=8 * 86400)
    with pytest.raises(gexc.BadRequest, match="maxRunDuration"):
        api.insert(flex)  # flex-start VMs run at most 7 days
    flex.scheduling.max_run_duration = c.Duration(seconds=3600)
    with pytest.raises(gexc.BadRequest, match="NO_RESERVATION"):
        api.insert(flex)  # Google's flex-start requests never consume a reservation
    flex.reservation_affinity = c.ReservationAffinity(consume_reservation_type="NO_RESERVATION")
    api.wait(api.insert(flex))
    # The limit is the cloud's own: with no controller, the VM goes at maxRunDuration.
    until(lambda: (emu.instance("a3-0") or {}).get("status") == "RUNNING")
    emu.advance(3601)
    until(lambda: emu.instance("a3-0") is None)


def test_the_emulator_process_answers_every_request_after_the_latency_asked_for() -> None:
    """``--latency-s``: a slow cloud for benchmarks (bench/pass_time.py); the control API stays instant."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator_testing.gce_emulator", "--port", "0",
                             "--latency-s", "0.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}/compute/v1/projects/p/zones", timeout=10) as answer:
            assert json.loads(answer.read())["kind"] == "compute#zoneList"
        assert time.monotonic() - started >= 0.5
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}/_emulator/snapshot", timeout=10) as answer:
            answer.read()
        assert time.monotonic() - started < 0.5
    finally:
        stop(proc, timeout_s=10)
