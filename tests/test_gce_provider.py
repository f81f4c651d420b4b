"""GceProvider against the GCE emulator, through the real google-cloud-compute client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.model.cloud_errors import AuthError, CapacityError, InvalidRequestError, QuotaError, TransientError
from orchestrator.model.instances import InstanceRequest, ObservedState, Role, instance_name
from orchestrator.providers.gce.provider import GceProvider, RetrySettings
from orchestrator_testing.gce_emulator import GceEmulator

P, Z, Z2 = "proj", "us-central1-a", "us-central1-b"
FAST = {
    "boot_delay_s": 0.06,
    "stop_delay_s": 0.03,
    "delete_delay_s": 0.03,
    "preempt_delay_s": 0.05,
    "op_delay_s": 0.02,
    "image_delay_s": 0.03,
    "operation_wait_max_s": 5.0,
}
QUICK_RETRY = RetrySettings(
    attempts=5,
    initial_backoff_s=0.005,
    max_backoff_s=0.02,
    request_timeout_s=2.0,
    wait_call_timeout_s=2.0,
    operation_timeout_s=10.0,
)


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[GceEmulator]:
    emulator = GceEmulator({**FAST, "ssh_port": 2222, "workdir_root": str(tmp_path)})
    emulator.start()
    yield emulator
    emulator.stop()


@pytest.fixture
def gce(emu: GceEmulator) -> Iterator[GceProvider]:
    provider = GceProvider(P, api_endpoint=emu.url, retry=QUICK_RETRY, network_tag="orch-c1")
    yield provider
    provider.close()


def req(
    job: str = "job",
    role: Role = Role.WORKER,
    index: int = 0,
    gen: int = 0,
    zone: str = Z,
    *,
    gpu: str | None = "t4",
    count: int = 1,
    spot: bool = True,
    machine: str = "n1-standard-4",
) -> InstanceRequest:
    return InstanceRequest(
        name=instance_name(job, role, index, gen),
        job_id=job,
        role=role,
        index=index,
        generation=gen,
        zone=zone,
        machine_type=machine,
        spot=spot,
        gpu=gpu,
        gpu_count=count if gpu else 0,
        metadata={"startup-script": "#!/bin/sh\necho hi", "shutdown-script": "echo bye"},
    )


def found(resource: dict[str, Any] | None) -> dict[str, Any]:
    assert resource is not None
    return resource


def until(predicate: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_create_sends_the_right_instance_and_list_reads_it_back(
    emu: GceEmulator, gce: GceProvider, tmp_path: Path
) -> None:
    gce.create(req())
    gce.create(req("job", Role.PS, 0, gen=3, gpu=None, spot=False))
    body = emu.instance("job-worker-0-0")
    assert body is not None
    assert body["labels"] == {
        "orchestrator": "1",
        "orch-job": "job",
        "orch-role": "worker",
        "orch-index": "0",
        "orch-gen": "0",
    }
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"  # nothing left billing after a preemption
    assert (
        body["scheduling"]["onHostMaintenance"] == "TERMINATE" and not body["scheduling"]["automaticRestart"]
    )
    assert body["guestAccelerators"][0]["acceleratorType"].endswith(
        f"zones/{Z}/acceleratorTypes/nvidia-tesla-t4"
    )
    assert body["tags"]["items"] == ["orch-c1"]
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["startup-script"].startswith("#!/bin/sh") and meta["shutdown-script"] == "echo bye"
    ps = emu.instance("job-ps-0-3")
    assert (
        ps is not None
        and ps["scheduling"]["onHostMaintenance"] == "MIGRATE"
        and "guestAccelerators" not in ps
    )
    observed = {o.name: o for o in gce.list()}
    worker = observed["job-worker-0-0"]
    assert worker.state == ObservedState.RUNNING and worker.role == Role.WORKER and worker.generation == 0
    assert worker.gpu == "t4" and worker.spot and not worker.preempted and worker.zone == Z
    assert worker.host == "127.0.0.1" and worker.ssh_port == 2222
    assert worker.workdir == str(tmp_path / "job-worker-0-0") and worker.provider_id
    assert observed["job-ps-0-3"].generation == 3 and observed["job-ps-0-3"].gpu is None
    assert not observed["job-ps-0-3"].spot


def test_create_is_idempotent_and_delete_tolerates_missing(emu: GceEmulator, gce: GceProvider) -> None:
    gce.create(req())
    gce.create(req())  # 409 -> success
    assert emu.snapshot()["instances_created"] == 1
    gce.delete("job-worker-0-0", Z)
    assert emu.instance("job-worker-0-0") is None
    gce.delete("job-worker-0-0", Z)
    gce.delete("never-existed", Z2)


def test_list_is_one_aggregated_call_per_page(emu: GceEmulator) -> None:
    provider = GceProvider(P, api_endpoint=emu.url, retry=QUICK_RETRY, page_size=2)
    emu.configure(boot_delay_s=0.01)
    for i in range(3):
        provider.create(req("a", index=i, zone=Z if i % 2 else Z2))
    provider.create(req("b"))
    emu.reset_calls()
    assert len(provider.list()) == 4
    assert emu.snapshot()["calls"] == {"instances.aggregatedList": 2}  # 4 instances, pages of 2
    emu.reset_calls()
    assert sorted(o.index for o in provider.list(["a"])) == [0, 1, 2]
    assert [o.job_id for o in provider.list({"b"})] == ["b"]
    assert len(provider.list(["a", "b", "c"])) == 4
    assert provider.list([]) == []
    assert emu.snapshot()["calls"] == {"instances.aggregatedList": 2 + 1 + 2}


def test_unmanaged_and_malformed_instances_are_ignored(emu: GceEmulator, gce: GceProvider) -> None:
    gce.create(req())

    def insert(name: str, labels: dict[str, str]) -> None:
        body = {
            "name": name,
            "machineType": f"zones/{Z}/machineTypes/e2-small",
            "labels": labels,
            "disks": [
                {"boot": True, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/x"}}
            ],
        }
        emu.state.insert_instance(P, Z, body, request_id=None)

    insert("unmanaged", {"team": "x"})
    insert("malformed", {"orchestrator": "1", "orch-job": "x", "orch-role": "worker", "orch-index": "zero"})
    assert [o.name for o in gce.list()] == ["job-worker-0-0"]


def test_slow_operations_are_polled_until_done(emu: GceEmulator, gce: GceProvider) -> None:
    emu.configure(boot_delay_s=0.4, operation_wait_max_s=0.1)  # each wait returns before the op is DONE
    gce.create(req())
    assert emu.snapshot()["calls"]["zoneOperations.wait"] >= 3
    assert gce.list()[0].state == ObservedState.RUNNING


def test_stockout_raises_capacity_error_with_zone(emu: GceEmulator, gce: GceProvider) -> None:
    emu.set_stockout(Z, gpu="nvidia-tesla-t4", provisioning="spot")
    with pytest.raises(CapacityError) as err:
        gce.create(req())
    assert (
        err.value.zone == Z
        and err.value.resource == "t4"
        and "ZONE_RESOURCE_POOL_EXHAUSTED" in str(err.value)
    )
    assert emu.instance("job-worker-0-0") is None
    gce.create(req(zone=Z2))  # next zone works; same name, fresh requestId
    gce.create(req(index=1, spot=False))  # the stockout is spot-only
    emu.set_stockout(Z, gpu="nvidia-tesla-t4", provisioning="spot", enabled=False)
    gce.create(req(index=2))


@pytest.mark.parametrize("as_http", [False, True])
def test_quota_raises_quota_error_naming_the_metric(
    emu: GceEmulator, gce: GceProvider, as_http: bool
) -> None:
    emu.configure(quota_errors_as_http=as_http)
    emu.set_quota("us-central1", "PREEMPTIBLE_NVIDIA_T4_GPUS", 4)
    gce.create(req(count=4))
    with pytest.raises(QuotaError) as err:
        gce.create(req(index=1, zone=Z2))
    assert err.value.metric == "PREEMPTIBLE_NVIDIA_T4_GPUS" and err.value.region == "us-central1"
    assert err.value.zone == Z2 and not err.value.retryable
    emu.set_quota("global", "GPUS_ALL_REGIONS", 4)
    with pytest.raises(QuotaError) as err:
        gce.create(req(index=2, zone="us-east1-b"))
    assert err.value.metric == "GPUS_ALL_REGIONS" and err.value.region == "global"


def test_invalid_requests(emu: GceEmulator, gce: GceProvider) -> None:
    emu.configure(accelerators={Z: ["nvidia-l4"]})
    with pytest.raises(InvalidRequestError, match="nvidia-tesla-t4"):
        gce.create(req())
    with pytest.raises(InvalidRequestError, match="unknown GPU"):
        gce.create(req(gpu="tpu9"))
    with pytest.raises(InvalidRequestError, match="gpu_count"):
        gce.create(InstanceRequest(**{**req().__dict__, "gpu_count": 0}))
    with pytest.raises(InvalidRequestError):
        gce.create(req(machine="n9-nope"))
    assert emu.snapshot()["calls"]["instances.insert"] == 2  # the client-side checks never called GCE


def test_auth_failures(
    emu: GceEmulator, gce: GceProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu.inject_auth_failure(401, count=1)
    with pytest.raises(AuthError, match="GOOGLE_APPLICATION_CREDENTIALS"):
        gce.list()
    emu.inject_auth_failure(403, endpoint="instances.insert", count=1)
    with pytest.raises(AuthError, match="roles/compute.instanceAdmin.v1") as err:
        gce.create(req())
    assert "compute.instances.insert" in str(err.value)
    assert emu.snapshot()["calls"]["instances.aggregatedList"] == 1  # not retried
    key = tmp_path / "key.json"
    key.write_text('{"type": "service_account", "private_key": "SECRET-KEY-MATERIAL"}')
    with pytest.raises(AuthError) as err:
        GceProvider(P, credentials=key)
    assert "SECRET" not in str(err.value) and str(key) in str(err.value)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))  # GCE itself: ADC
    with pytest.raises(AuthError, match="gcloud auth application-default login"):
        GceProvider(P)


def test_the_endpoint_alone_decides_the_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An https Google API endpoint gets the user's credentials (here none: refused); a loopback one is called
    anonymously and its VMs are reached at 127.0.0.1; any other host is refused before a client is built."""
    from google.auth.credentials import AnonymousCredentials

    from orchestrator.model.errors import UserError
    from orchestrator.providers.gce.network import address_learner, public_address

    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no ADC file of the developer's
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # not on GCE: no metadata-server credentials
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    for endpoint in (None, "https://compute.googleapis.com", "compute.googleapis.com"):
        with pytest.raises(AuthError, match="no Google credentials found"):
            GceProvider(P, api_endpoint=endpoint)
        assert address_learner(endpoint) is public_address
    local = GceProvider(P, api_endpoint="http://127.0.0.1:9")
    assert all(isinstance(c._transport._credentials, AnonymousCredentials) for c in local.api._clients())
    local.close()
    assert address_learner("http://127.0.0.1:9")() == "127.0.0.1" == address_learner("http://[::1]:9")()
    for hostile in ("http://169.254.169.254", "https://example.com", "http://compute.googleapis.com"):
        with pytest.raises(UserError, match="provider.api_endpoint"):
            GceProvider(P, api_endpoint=hostile)


def _setup_instance(gce: GceProvider) -> None:
    gce.create(req())


def _ensure_fw(gce: GceProvider) -> None:
    gce.ensure_cluster_firewall("orch-c1", "2222-2230")


# endpoint -> (setup, action); each action is retried through 2 injected 503s, then fails for good.
ACTIONS: dict[str, tuple[Callable[[GceProvider], None] | None, Callable[[GceProvider], Any]]] = {
    "instances.insert": (None, lambda g: g.create(req())),
    "zoneOperations.wait": (None, lambda g: g.create(req())),
    "instances.delete": (_setup_instance, lambda g: g.delete("job-worker-0-0", Z)),
    "instances.aggregatedList": (_setup_instance, lambda g: g.list()),
    "firewalls.get": (None, _ensure_fw),
    "firewalls.insert": (None, _ensure_fw),
    "globalOperations.wait": (None, _ensure_fw),
    "firewalls.update": (_ensure_fw, lambda g: g.ensure_cluster_firewall("orch-c1", "2222-2240")),
    "instances.get": (_setup_instance, lambda g: g.create_image("img", "job-worker-0-0", Z)),
    "instances.stop": (_setup_instance, lambda g: g.create_image("img", "job-worker-0-0", Z)),
    "images.insert": (_setup_instance, lambda g: g.create_image("img", "job-worker-0-0", Z)),
}


@pytest.mark.parametrize("endpoint", sorted(ACTIONS))
@pytest.mark.parametrize(("status", "failures"), [(503, 2), (500, 2), (429, 2), (503, None)])
def test_server_errors_are_retried_then_exhausted(
    emu: GceEmulator, gce: GceProvider, endpoint: str, status: int, failures: int | None
) -> None:
    setup, action = ACTIONS[endpoint]
    if setup is not None:
        setup(gce)
    emu.inject_fault(endpoint, status, count=failures)
    emu.reset_calls()
    if failures is None:
        with pytest.raises(TransientError, match="gave up after 5 attempts"):
            action(gce)
        assert emu.snapshot()["calls"][endpoint] == 5
        return
    action(gce)
    per_call = (
        2 if endpoint in ("firewalls.get", "firewalls.insert", "globalOperations.wait") else 1
    )  # 2 rules
    assert emu.snapshot()["calls"][endpoint] == per_call + failures


def test_timeouts_are_retried_and_a_lost_insert_response_never_creates_twice(
    emu: GceEmulator, gce: GceProvider
) -> None:
    provider = GceProvider(
        P,
        api_endpoint=emu.url,
        retry=RetrySettings(
            attempts=3,
            initial_backoff_s=0.005,
            max_backoff_s=0.01,
            request_timeout_s=0.5,
            wait_call_timeout_s=0.5,
        ),
    )
    emu.inject_timeout("instances.insert", 1.5)  # GCE did the insert; the answer got lost
    provider.create(req())
    snap = emu.snapshot()
    assert snap["calls"]["instances.insert"] == 2 and snap["instances_created"] == 1
    emu.inject_timeout("instances.aggregatedList", 1.5)
    assert len(provider.list()) == 1
    emu.inject_timeout("instances.aggregatedList", 1.5, count=None)
    with pytest.raises(TransientError, match="Timeout"):
        provider.list()
    emu.clear_faults()


def test_preemption_is_visible_as_stopping_then_terminated(emu: GceEmulator) -> None:
    # termination_action STOP: the preempted VM stays TERMINATED (its disk billed) until deleted.
    gce = GceProvider(P, api_endpoint=emu.url, retry=QUICK_RETRY, network_tag="orch-c1", termination_action="STOP")
    gce.create(req())
    gce.create(req(index=1, spot=False))
    emu.configure(preempt_delay_s=30.0)
    emu.preempt("job-worker-0-0")
    states = {o.name: o for o in gce.list(["job"])}
    assert states["job-worker-0-0"].state == ObservedState.STOPPING and states["job-worker-0-0"].preempted
    assert states["job-worker-1-0"].state == ObservedState.RUNNING and not states["job-worker-1-0"].preempted
    emu.advance(30)
    until(lambda: {o.name: o.state for o in gce.list()}["job-worker-0-0"] == ObservedState.TERMINATED)
    terminated = next(o for o in gce.list() if o.name == "job-worker-0-0")
    assert terminated.preempted and terminated.host == "127.0.0.1"  # no external IP when stopped
    gce.delete("job-worker-0-0", Z)
    assert [o.name for o in gce.list()] == ["job-worker-1-0"]
    gce.close()


def test_preempted_spot_vm_is_deleted_by_default(emu: GceEmulator, gce: GceProvider) -> None:
    gce.create(req())
    emu.preempt("job-worker-0-0")
    until(lambda: gce.list(["job"]) == [])  # DELETE: nothing of it is left billing


def test_unreachable_zone_fails_the_list_instead_of_hiding_instances(
    emu: GceEmulator, gce: GceProvider
) -> None:
    gce.create(req())
    emu.configure(unreachable_zones=[Z2])
    with pytest.raises(TransientError):
        gce.list()


def test_cluster_firewall_rules(emu: GceEmulator, gce: GceProvider) -> None:
    gce.ensure_cluster_firewall("orch-c1", "2222-2230,8470")
    internal = found(emu.firewall("orch-c1-internal", P))
    assert internal["sourceTags"] == ["orch-c1"] and internal["targetTags"] == ["orch-c1"]
    assert "sourceRanges" not in internal and internal["direction"] == "INGRESS"
    assert internal["allowed"] == [{"IPProtocol": "tcp", "ports": ["2222-2230", "8470"]}]
    ssh = found(emu.firewall("orch-c1-ssh", P))
    assert (
        ssh["sourceRanges"] == ["0.0.0.0/0"] and ssh["targetTags"] == ["orch-c1"] and "sourceTags" not in ssh
    )
    assert ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    emu.reset_calls()
    gce.ensure_cluster_firewall("orch-c1", "2222-2230,8470")
    assert emu.snapshot()["calls"] == {"firewalls.get": 2}  # idempotent: nothing written
    gce.ensure_cluster_firewall("orch-c1", "2222-2231")
    assert found(emu.firewall("orch-c1-internal", P))["allowed"][0]["ports"] == ["2222-2231"]
    with pytest.raises(InvalidRequestError):
        gce.ensure_cluster_firewall("orch-c1", "ssh")


def test_create_image_from_an_instance_and_boot_from_it(emu: GceEmulator, gce: GceProvider) -> None:
    gce.create(req("bake", Role.CHIEF, gpu=None, spot=False))
    gce.create_image("orch-gpu-v1", "bake-chief-0-0", Z, family="orch-gpu")
    image = found(emu.image("orch-gpu-v1", P))
    assert image["status"] == "READY" and image["family"] == "orch-gpu"
    assert image["sourceDisk"].endswith(f"zones/{Z}/disks/bake-chief-0-0")
    assert found(emu.instance("bake-chief-0-0", Z))["status"] == "TERMINATED"
    gce.create_image("orch-gpu-v1", "bake-chief-0-0", Z, family="orch-gpu")  # exists: no-op
    with pytest.raises(InvalidRequestError):
        gce.create_image("x", "no-such-instance", Z)
    baked = GceProvider(P, api_endpoint=emu.url, retry=QUICK_RETRY, image="images/family/orch-gpu")
    baked.create(req("run"))
    missing = GceProvider(P, api_endpoint=emu.url, retry=QUICK_RETRY, image="images/nope")
    with pytest.raises(InvalidRequestError, match="nope"):
        missing.create(req("run2"))


def test_accelerator_optimized_type_brings_its_gpus_and_a_time_limit(emu: GceEmulator, gce: GceProvider) -> None:
    request = req(gpu="h100", count=2, machine="a3-highgpu-2g")
    gce.create(InstanceRequest(**{**request.__dict__, "max_run_s": 3600}))
    body = found(emu.instance("job-worker-0-0"))
    assert "guestAccelerators" not in body  # GCE attaches an A3's GPUs itself
    scheduling = body["scheduling"]
    assert scheduling["provisioningModel"] == "SPOT" and scheduling["instanceTerminationAction"] == "DELETE"
    assert scheduling["maxRunDuration"] == {"seconds": "3600"}
    worker = gce.list(["job"])[0]
    assert worker.spot and worker.zone == Z


def test_time_limit_makes_the_cloud_delete_the_vm_itself(emu: GceEmulator, gce: GceProvider) -> None:
    request = req(gpu="l4", machine="g2-standard-4")
    gce.create(InstanceRequest(**{**request.__dict__, "max_run_s": 120}))
    until(lambda: [o.state for o in gce.list(["job"])] == [ObservedState.RUNNING])
    emu.advance(121)  # no controller acts: GCE's own maxRunDuration ends the VM
    until(lambda: gce.list(["job"]) == [])


def test_flex_start_is_refused_where_google_does_not_offer_it(emu: GceEmulator, gce: GceProvider) -> None:
    flex = req(gpu="a100", machine="a2-highgpu-1g", spot=False)
    gce.create(InstanceRequest(**{**flex.__dict__, "flex_start": True, "max_run_s": 7200}))
    scheduling = found(emu.instance("job-worker-0-0"))["scheduling"]
    assert scheduling["provisioningModel"] == "FLEX_START" and scheduling["instanceTerminationAction"] == "DELETE"
    bad = req(index=1, gpu="rtx-pro-6000", machine="g4-standard-48", spot=False)  # G4: no flex-start
    with pytest.raises(InvalidRequestError, match="FLEX_START"):
        gce.create(InstanceRequest(**{**bad.__dict__, "flex_start": True, "max_run_s": 7200}))


def test_user_caused_cloud_errors_are_user_errors_naming_the_fix(emu: GceEmulator, gce: GceProvider) -> None:
    from orchestrator.model.errors import UserError
    from orchestrator.providers.gce.provider import GceCredentialsError, GcePermissionError, GceProjectError

    emu.inject_fault(endpoint="instances.insert", status=403)
    with pytest.raises(GcePermissionError, match="roles/compute.instanceAdmin.v1") as denied:
        gce.create(req())
    assert isinstance(denied.value, UserError) and "\n" not in str(denied.value)
    emu.inject_fault(endpoint="instances.insert", status=401)
    with pytest.raises(GceCredentialsError, match="gcloud auth application-default login"):
        gce.create(req(index=1))
    with pytest.raises(GceCredentialsError, match="cannot load service-account key file"):
        GceProvider(P, credentials="/nonexistent/key.json")
    emu.inject_fault(endpoint="instances.insert", status=404, reason="notFound",
                     message=f"The resource 'projects/{P}' was not found")
    with pytest.raises(GceProjectError, match="compute.googleapis.com"):
        gce.create(req(index=2))


def test_cloud_deadline_bounds_spend_even_without_a_controller() -> None:
    from orchestrator.providers.gce.requests import DEFAULT_MAX_RUN_S, cloud_max_run_s

    # Deadline 2 h, 30 min gone: the VM may run what is left plus a 10 min teardown grace.
    assert cloud_max_run_s(deadline_s=7200, elapsed_s=1800, budget_usd=None, spent_usd=0,
                           cluster_usd_per_hour=4.0) == 5400 + 600
    # $10 budget, $4 spent, the cluster costs $4/h: every VM stops within 1.5 h, so at most $6 more.
    assert cloud_max_run_s(deadline_s=None, elapsed_s=0, budget_usd=10, spent_usd=4,
                           cluster_usd_per_hour=4.0) == 5400
    assert cloud_max_run_s(deadline_s=None, elapsed_s=0, budget_usd=None, spent_usd=0,
                           cluster_usd_per_hour=4.0) == DEFAULT_MAX_RUN_S
    assert cloud_max_run_s(deadline_s=60, elapsed_s=10_000, budget_usd=1, spent_usd=5,
                           cluster_usd_per_hour=4.0) == 60  # never below GCE's minimum
