"""Cloud faults through the controller's real code path: run_pass -> GceProvider -> the Compute API emulator.

The payload is a plain command (``sleep``), so no TensorFlow: instances are created, prepared over SSH to
the emulated cloud's sshd, their tasks started, and torn down. What is checked is the cloud side: every
slot gets its instance, no name ever has two VMs, retries stay bounded, a controller that died between
the insert and the DB write adopts the VM it created, gc finds what no active job owns, cancel deletes all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from e2e_helpers import processes_under, wait_until
from sqlalchemy.orm import Session

from orchestrator.cli.gc_cmd import gc_command
from orchestrator.control import driver
from orchestrator.control.driver import release, run_pass
from orchestrator.control.execute import JobContext, execute
from orchestrator.control.gc import find_orphans
from orchestrator.control.launcher import cancel_job, create_job
from orchestrator.core import policy
from orchestrator.core.actions import Action
from orchestrator.core.cloud_errors import TransientError
from orchestrator.core.instances import InstanceRequest, Role, instance_name
from orchestrator.core.paths import user_dir
from orchestrator.core.spec import JobSpec, validate_spec
from orchestrator.core.status import InstanceStatus, JobStatus
from orchestrator.providers import registry as backends
from orchestrator.providers.gce.provider import GceProvider, RetrySettings
from orchestrator.providers.registry import Backend, backend_for
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Job, LedgerEntry
from orchestrator_testing.cloud import EmulatedCloud, provider_yaml
from orchestrator_testing.gce_emulator import GceEmulator

PROJECT = "test-project"
Z1, Z2 = "us-central1-c", "us-central1-a"
OWNER = "test-driver"
ATTEMPTS = 5
QUICK = RetrySettings(attempts=ATTEMPTS, initial_backoff_s=0.005, max_backoff_s=0.02, request_timeout_s=0.5,
                      wait_call_timeout_s=1.0, operation_timeout_s=20.0)
LOST_ANSWER_S = 1.2  # an injected timeout: served, but answered after the client gave up (request_timeout_s)
ENDPOINTS = ("instances.insert", "instances.delete", "instances.aggregatedList", "zoneOperations.wait",
             "firewalls.get", "firewalls.insert", "globalOperations.wait")


class ControllerKilled(Exception):
    """The controller process dies here: the pass aborts, the DB keeps what was committed."""


@pytest.fixture(autouse=True)
def _fresh_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    # Backends are cached by endpoint URL; a later test's emulator may reuse a port.
    monkeypatch.setattr(backends, "_cache", {})


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[EmulatedCloud]:
    user_dir()  # ORCHESTRATOR_HOME, where the DB file goes
    config = {"boot_delay_s": 0.3, "delete_delay_s": 0.05, "operation_wait_max_s": 2.0}
    with EmulatedCloud(tmp_path / "cloud", config=config) as c:
        yield c


def compute(cloud: EmulatedCloud) -> GceEmulator:
    assert cloud.compute is not None
    return cloud.compute


def make_spec(cloud: EmulatedCloud, storage: Path, name: str = "faults") -> JobSpec:
    return validate_spec(yaml.safe_load(f"""
name: {name}
provider: {{kind: gce, project: {PROJECT}, zones: [{Z1}, {Z2}], {provider_yaml(cloud.url)}}}
storage: {storage}
training: {{job: command, command: "sleep 600", mode: sync, train_steps: 100}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: t4, count: 2, spot: true, zone: {Z1}}}]
policy: {{on_revocation: replace, max_replacements: 4}}
pricing: {{book: 2026-11}}
"""))


def quick_backend(spec: JobSpec) -> Backend:
    backend = backend_for(spec)
    assert isinstance(backend.provider, GceProvider)
    backend.provider.retry = QUICK
    return backend


def passes(session: Session, job_id: str, n: int) -> Job:
    for _ in range(n):
        run_pass(session, OWNER, [job_id])
    session.expire_all()
    job = session.get(Job, job_id)
    assert job is not None
    return job


def statuses(job: Job) -> dict[str, str]:
    return {i.name: i.status for i in job.instances}


def vms(cloud: EmulatedCloud) -> Counter[str]:
    """VMs by name, over every zone: a count above 1 is a duplicate."""
    return Counter(i["name"] for i in compute(cloud).snapshot()["instances"])


def cancel_and_check(session: Session, cloud: EmulatedCloud, job_id: str) -> None:
    """Cancel through `orchestrator cancel`'s code path; nothing may be left in the cloud or unbilled."""
    release(session, OWNER, [job_id])
    cancel_job(job_id, wait_s=30)
    session.expire_all()
    job = session.get(Job, job_id)
    assert job is not None and job.status == JobStatus.CANCELLED.value, statuses(job) if job else None
    assert all(i.status == InstanceStatus.DELETED.value for i in job.instances), statuses(job)
    ledger = session.query(LedgerEntry).filter(LedgerEntry.job_id == job_id).count()
    assert ledger == len(job.instances)
    assert not [n for n in vms(cloud) if n.startswith(job_id)], compute(cloud).snapshot()["instances"]


def test_5xx_and_timeouts_on_every_endpoint_the_provider_calls(cloud: EmulatedCloud, tmp_path: Path) -> None:
    emu = compute(cloud)
    spec = make_spec(cloud, tmp_path / "runs")
    quick_backend(spec)
    for endpoint in ENDPOINTS:  # each call of each endpoint: 503, 500, then a lost answer, then served
        emu.inject_fault(endpoint, 503, count=1)
        emu.inject_fault(endpoint, 500, count=1)
        emu.inject_timeout(endpoint, LOST_ANSWER_S, count=1)
    with open_session() as session:
        job_id = create_job(session, spec).id
        job = passes(session, job_id, 1)
        # Each call that met the faults got through on its 4th attempt, inside one pass.
        assert set(statuses(job).values()) == {InstanceStatus.PROVISIONING.value}, statuses(job)
        assert vms(cloud) == Counter(statuses(job).keys())
        snap = emu.snapshot()
        assert snap["instances_created"] == 2
        for name in statuses(job):  # what the controller's creates carry: SPOT, DELETE, a cloud-side limit
            scheduling = (emu.instance(name) or {})["scheduling"]
            assert scheduling["provisioningModel"] == "SPOT" and scheduling["instanceTerminationAction"] == "DELETE"
            assert scheduling["maxRunDuration"] == {"seconds": str(7 * 86400)}  # no deadline/budget: 7 days
        calls = snap["calls"]
        # Retries are bounded and nothing is asked twice beyond them: the injected 3 failures per endpoint.
        assert calls["instances.insert"] == 2 + 3  # the lost answer's retry reuses the requestId: no 2nd VM
        assert calls["instances.aggregatedList"] == 1 + 3
        assert calls["firewalls.get"] == calls["firewalls.insert"] == 2 + 3
        # At most one wait per operation beyond the faults (none when a retried call's operation was done).
        assert 3 <= calls["zoneOperations.wait"] <= 2 + 3 and 3 <= calls["globalOperations.wait"] <= 2 + 3
        assert snap["firewalls"] == [f"orch-{job_id}-internal", f"orch-{job_id}-ssh"]  # the job's own rules
        errors = [e for e in queries.events(session, job_id) if e.to_status == "provider_error"]
        assert errors == []  # absorbed by the provider's own bounded retries

        # Past the retry budget: the pass gives up on the call, records why, and the next pass recovers.
        emu.inject_fault("instances.aggregatedList", 503, count=None)
        emu.reset_calls()
        job = passes(session, job_id, 1)
        assert emu.snapshot()["calls"] == {"instances.aggregatedList": ATTEMPTS}
        assert [e.reason for e in queries.events(session, job_id) if e.to_status == "provider_error"]
        emu.clear_faults()
        job = passes(session, job_id, 2)  # prepared over SSH, then the tasks start
        assert set(statuses(job).values()) == {InstanceStatus.TRAINING.value}, statuses(job)

        for endpoint in ("instances.delete", "zoneOperations.wait", "instances.aggregatedList"):
            emu.inject_fault(endpoint, 503, count=1)
            emu.inject_timeout(endpoint, LOST_ANSWER_S, count=1)
        emu.reset_calls()
        cancel_and_check(session, cloud, job_id)
        calls = emu.snapshot()["calls"]
        assert calls["instances.delete"] == 2 + 2  # a lost delete answer retried with its requestId: 2 VMs
        assert emu.snapshot()["instances_created"] == 2


def test_a_create_that_gave_up_is_asked_again_by_a_later_pass_and_makes_one_vm(
    cloud: EmulatedCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = compute(cloud)
    spec = make_spec(cloud, tmp_path / "runs")
    quick_backend(spec)
    emu.inject_fault("instances.insert", 503, count=None)
    with open_session() as session:
        job_id = create_job(session, spec).id
        job = passes(session, job_id, 1)
        assert set(statuses(job).values()) == {InstanceStatus.REQUESTED.value}
        assert emu.snapshot()["calls"]["instances.insert"] == 2 * ATTEMPTS and not vms(cloud)  # bounded
        assert sum(e.to_status == "provider_error" for e in queries.events(session, job_id)) == 2
        emu.clear_faults()
        emu.reset_calls()
        job = passes(session, job_id, 1)  # intent recorded, nothing seen: not asked again at once
        assert set(statuses(job).values()) == {InstanceStatus.REQUESTED.value}
        assert "instances.insert" not in emu.snapshot()["calls"]

        monkeypatch.setattr(policy, "CREATE_REISSUE_S", 0.0)  # the reissue delay has passed
        # Now the first create's answers are all lost, though GCE does the work: the provider gives up again.
        emu.inject_timeout("instances.insert", LOST_ANSWER_S, count=ATTEMPTS)
        job = passes(session, job_id, 1)
        first, second = (instance_name(job_id, Role.WORKER, i, 0) for i in (0, 1))
        assert statuses(job) == {first: InstanceStatus.REQUESTED.value,
                                 second: InstanceStatus.PROVISIONING.value}
        assert emu.snapshot()["calls"]["instances.insert"] == ATTEMPTS + 1
        assert emu.snapshot()["instances_created"] == 2  # every retry reused its requestId
        emu.clear_faults()
        emu.reset_calls()
        job = passes(session, job_id, 1)  # the VMs are seen: adopted (prepared, tasks started), not created
        assert set(statuses(job).values()) == {InstanceStatus.TRAINING.value}, statuses(job)
        assert "instances.insert" not in emu.snapshot()["calls"]
        assert vms(cloud) == Counter(statuses(job).keys()) and emu.snapshot()["instances_created"] == 2
        cancel_and_check(session, cloud, job_id)


def test_a_duplicated_insert_makes_one_vm(
    cloud: EmulatedCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = compute(cloud)
    spec = make_spec(cloud, tmp_path / "runs")
    backend = quick_backend(spec)

    def repeated(ctx: JobContext, actions: list[Action]) -> None:
        execute(ctx, actions)
        # A pass repeated after a crash: another controller carries out the same actions, computed from the
        # same view (before the first one's outcomes were recorded), with its own session.
        with open_session() as other:
            job = other.get(Job, ctx.job.id)
            assert job is not None
            execute(replace(ctx, session=other, job=job), actions)

    monkeypatch.setattr(driver, "execute", repeated)
    with open_session() as session:
        job_id = create_job(session, spec).id
        job = passes(session, job_id, 1)
        assert set(statuses(job).values()) == {InstanceStatus.PROVISIONING.value}
        assert emu.snapshot()["calls"]["instances.insert"] == 4
        # And the same request sent straight to the provider once more.
        inst = job.instances[0]
        backend.provider.create(InstanceRequest(name=inst.name, job_id=job_id, role=Role.WORKER, index=0,
                                                generation=0, zone=inst.zone, machine_type=inst.machine_type,
                                                spot=True, gpu="t4", gpu_count=1))
        assert vms(cloud) == Counter(statuses(job).keys())
        assert emu.snapshot()["instances_created"] == 2
        monkeypatch.setattr(driver, "execute", execute)
        cancel_and_check(session, cloud, job_id)


@pytest.mark.parametrize("stockout", [False, True], ids=["same-zone", "after-zone-fallback"])
def test_a_vm_created_by_a_controller_killed_before_recording_it_is_adopted(
    cloud: EmulatedCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stockout: bool
) -> None:
    emu = compute(cloud)
    spec = make_spec(cloud, tmp_path / "runs")
    backend = quick_backend(spec)
    if stockout:  # the first allowed zone is out of T4s: the dying controller had moved on to the next
        emu.set_stockout(Z1, gpu="nvidia-tesla-t4")
    # The dying controller sends the insert and is killed while it waits for the operation.
    dying = GceProvider(PROJECT, api_endpoint=cloud.url, retry=replace(QUICK, operation_timeout_s=0.3))
    emu.configure(boot_delay_s=60.0, operation_wait_max_s=0.1)  # its VM is still booting at the next pass

    def create_then_die(request: InstanceRequest) -> None:
        try:
            dying.create(request)  # a stockout raises CapacityError (the executor tries the next zone)
        except TransientError:
            raise ControllerKilled(f"killed after inserting {request.name}") from None
        raise AssertionError("the insert's operation should still be running")

    real_create = backend.provider.create
    monkeypatch.setattr(backend.provider, "create", create_then_die)
    with open_session() as session:
        job_id = create_job(session, spec).id
        job = passes(session, job_id, 1)  # the pass dies inside the first create
        first = instance_name(job_id, Role.WORKER, 0, 0)
        assert statuses(job) == {first: InstanceStatus.REQUESTED.value}
        assert job.instances[0].zone == Z1  # what the DB knows: the intent, in the slot's first zone
        assert vms(cloud) == Counter([first])
        assert emu.instance(first, Z2 if stockout else Z1) is not None
        dying.close()

        monkeypatch.setattr(backend.provider, "create", real_create)  # a new controller starts
        emu.configure(boot_delay_s=0.3, operation_wait_max_s=2.0)
        job = passes(session, job_id, 1)
        assert statuses(job)[first] == InstanceStatus.PROVISIONING.value  # adopted: REQUESTED -> PROVISIONING
        adopted = next(e for e in queries.events(session, job_id) if e.to_status == "provisioning"
                       and e.instance_id == job.instances[0].id)
        assert adopted.from_status == InstanceStatus.REQUESTED.value and adopted.reason == "create accepted"
        assert job.instances[0].zone == (Z2 if stockout else Z1)  # where the VM really is
        assert vms(cloud) == Counter(statuses(job).keys()) and len(job.instances) == 2
        assert emu.snapshot()["instances_created"] == 2
        emu.advance(60.0)  # the adopted VM finishes booting
        cancel_and_check(session, cloud, job_id)  # deletes it in its real zone


def test_gc_lists_and_deletes_vms_of_finished_or_unknown_jobs(
    cloud: EmulatedCloud, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emu = compute(cloud)
    spec = make_spec(cloud, tmp_path / "runs")
    backend = quick_backend(spec)

    def create_vm(job_id: str, index: int) -> str:
        name = instance_name(job_id, Role.WORKER, index, 0)
        backend.provider.create(InstanceRequest(name=name, job_id=job_id, role=Role.WORKER, index=index,
                                                generation=0, zone=Z2, machine_type="n1-standard-4",
                                                spot=True))
        return name

    with open_session() as session:
        finished = create_job(session, spec).id
        cancel_job(finished, wait_s=10)  # nothing created yet: cancelled at once
        active = create_job(session, spec).id
        job = passes(session, active, 1)
        active_vms = set(statuses(job))
        orphans = {create_vm(finished, 5), create_vm("ghost-1a2b3c", 0), create_vm("ghost-1a2b3c", 1)}

        assert {o.name for _, o in find_orphans()} == orphans
        capsys.readouterr()
        gc_command(delete=False)
        listing = capsys.readouterr().out
        assert "3 instance(s) whose job is finished or unknown" in listing and "gc --yes" in listing
        assert set(vms(cloud)) == orphans | active_vms  # listing deletes nothing

        gc_command(delete=True)
        assert find_orphans() == []
        assert set(vms(cloud)) == active_vms  # the active job's VMs are not touched
        emu.reset_calls()
        gc_command(delete=True)  # nothing left to do
        assert "instances.delete" not in emu.snapshot()["calls"]
        cancel_and_check(session, cloud, active)


def test_cancel_tears_down_every_instance_and_closes_the_ledger(cloud: EmulatedCloud, tmp_path: Path) -> None:
    spec = make_spec(cloud, tmp_path / "runs")
    quick_backend(spec)
    with open_session() as session:
        job_id = create_job(session, spec).id
        job = passes(session, job_id, 3)
        assert job.status == JobStatus.RUNNING.value and len(job.instances) == 2
        assert processes_under(cloud.root / "vms")  # the tasks run on the emulated VMs
        cancel_and_check(session, cloud, job_id)
        wait_until(lambda: processes_under(cloud.root / "vms") == [], timeout=10, interval=0.1)
        job = passes(session, job_id, 1)  # a final job is not driven again
        assert job.status == JobStatus.CANCELLED.value
        usd = sum(e.usd for e in session.query(LedgerEntry).filter(LedgerEntry.job_id == job_id))
        assert usd > 0 and usd == pytest.approx(queries.job_cost(session, job_id)["total"])
