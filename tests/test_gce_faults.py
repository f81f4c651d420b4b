"""Cloud faults through the controller's real code path: run_pass -> GceProvider -> the Compute API emulator.

The payload is a plain command (``sleep``), so no TensorFlow: instances are created, prepared over SSH to
the emulated cloud's sshd, their tasks started, and torn down. What is checked is the cloud side: every
slot gets its instance, no name ever has two VMs, retries stay bounded, a controller that died between
the insert and recording its answer adopts the VM it created, gc finds what no active job owns, cancel
deletes all. Passes never wait on the cloud (operations are started, then settled by later passes), so
each step runs passes until what it waits for is recorded.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from e2e_helpers import processes_under, wait_until
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.cli.gc_cmd import gc_command
from orchestrator.control import driver
from orchestrator.control.driver import release, run_pass
from orchestrator.control.execute import JobContext, execute
from orchestrator.control.gc import find_orphans
from orchestrator.control.launcher import cancel_job, create_job
from orchestrator.decide.actions import Action
from orchestrator.model import timings
from orchestrator.model.instances import InstanceRequest, Role, instance_name
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import JobSpec, validate_spec
from orchestrator.model.status import InstanceStatus, JobStatus
from orchestrator.providers import registry as backends
from orchestrator.providers.gce.provider import GceProvider, RetrySettings
from orchestrator.providers.registry import Backend, backend_for
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Job, LedgerEntry, Operation
from orchestrator_testing.cloud import EmulatedCloud, provider_yaml
from orchestrator_testing.gce_emulator import GceEmulator

PROJECT = "test-project"
Z1, Z2 = "us-central1-c", "us-central1-a"
OWNER = "test-driver"
ATTEMPTS = 5
QUICK = RetrySettings(attempts=ATTEMPTS, initial_backoff_s=0.005, max_backoff_s=0.02, request_timeout_s=0.5,
                      wait_call_timeout_s=1.0, operation_timeout_s=20.0)
LOST_ANSWER_S = 1.2  # an injected timeout: served, but answered after the client gave up (request_timeout_s)
# What the provider calls for a job's passes: no operations.wait on a zone (a pass never waits); the job's
# firewall rules are made by a background call, which may wait on its global operation.
ENDPOINTS = ("instances.insert", "instances.delete", "instances.aggregatedList", "zoneOperations.get",
             "firewalls.get", "firewalls.insert", "globalOperations.wait")


class ControllerKilled(Exception):
    """The controller process dies here: the pass aborts, the DB keeps what was committed."""


@pytest.fixture(autouse=True)
def _fresh_backends(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Backends are cached by endpoint URL; a later test's emulator may reuse a port.
    monkeypatch.setattr(backends, "_cache", {})
    yield
    for backend in backends._cache.values():  # their background calls end with the test's cloud
        backend.provider.close()


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


def passes_until(session: Session, job_id: str, done: Callable[[Job], bool], timeout: float = 30.0) -> Job:
    """Passes (each returns at once) until ``done(job)``; fails with the instances' statuses after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        run_pass(session, OWNER, [job_id])
        session.expire_all()
        job = session.get(Job, job_id)
        assert job is not None
        if done(job):
            return job
        assert time.monotonic() < deadline, f"{job.status}: {statuses(job)}"
        time.sleep(0.05)


def passes_for(session: Session, job_id: str, seconds: float) -> Job:
    """Passes for a while (several background listings): what a controller does when nothing changes."""
    until = time.monotonic() + seconds
    return passes_until(session, job_id, lambda j: time.monotonic() > until)


def all_in(*wanted: InstanceStatus, count: int = 2) -> Callable[[Job], bool]:
    return lambda job: len(job.instances) == count and {i.status for i in job.instances} <= {w.value for w in wanted}


ACCEPTED = (InstanceStatus.PROVISIONING, InstanceStatus.READY, InstanceStatus.TRAINING)  # the create went through


def statuses(job: Job) -> dict[str, str]:
    return {i.name: i.status for i in job.instances}


def pending_ops(session: Session, job_id: str) -> list[Operation]:
    return list(session.scalars(select(Operation).where(Operation.job_id == job_id,
                                                        Operation.status == queries.OP_PENDING)))


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
        # Each call that met the faults got through on its 4th attempt, in the background.
        job = passes_until(session, job_id, all_in(*ACCEPTED))
        job = passes_until(session, job_id, lambda j: not pending_ops(session, job_id))  # every insert settled
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
        assert calls["instances.aggregatedList"] >= 1 + 3  # refreshed in the background, pass or no pass
        assert calls["firewalls.get"] == calls["firewalls.insert"] == 2 + 3
        assert calls["zoneOperations.get"] >= 3 and "zoneOperations.wait" not in calls  # polled, never waited
        assert 3 <= calls["globalOperations.wait"] <= 2 + 3  # the job's firewall rules, made in the background
        assert snap["firewalls"] == [f"orch-{job_id}-internal", f"orch-{job_id}-ssh"]  # the job's own rules
        errors = [e for e in queries.events(session, job_id) if e.to_status == "provider_error"]
        assert errors == []  # absorbed by the provider's own bounded retries

        # Past the retry budget: the listing gives up, the job records why, and a later pass recovers.
        emu.inject_fault("instances.aggregatedList", 503, count=None)
        passes_until(session, job_id, lambda j: any(e.to_status == "provider_error" for e in queries.events(
            session, job_id)))
        failed = [e.reason or "" for e in queries.events(session, job_id) if e.to_status == "provider_error"]
        assert any(f"gave up after {ATTEMPTS} attempts" in r for r in failed), failed
        emu.clear_faults()
        job = passes_until(session, job_id, all_in(InstanceStatus.TRAINING))  # prepared over SSH, tasks started

        for endpoint in ("instances.delete", "zoneOperations.get", "instances.aggregatedList"):
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
    backend = quick_backend(spec)
    assert isinstance(backend.provider, GceProvider)
    backend.provider.background_threads = 1  # one insert at a time: which one meets the faults is known
    emu.inject_fault("instances.insert", 503, count=None)
    with open_session() as session:
        job_id = create_job(session, spec).id
        passes_until(session, job_id, lambda j: sum(e.to_status == "provider_error"
                                                    for e in queries.events(session, job_id)) == 2)
        job = passes_until(session, job_id, lambda j: True)
        assert set(statuses(job).values()) == {InstanceStatus.REQUESTED.value}
        assert emu.snapshot()["calls"]["instances.insert"] == 2 * ATTEMPTS and not vms(cloud)  # bounded
        emu.clear_faults()
        emu.reset_calls()
        job = passes_for(session, job_id, 2.0)  # intent recorded, nothing seen: not asked again at once
        assert set(statuses(job).values()) == {InstanceStatus.REQUESTED.value}
        assert "instances.insert" not in emu.snapshot()["calls"]

        # The reissue delay has passed: both are asked again. The first insert's answers are all lost, though
        # GCE does the work: the provider gives up on it; the second gets through.
        emu.inject_timeout("instances.insert", LOST_ANSWER_S, count=ATTEMPTS)
        reissue = timings.CREATE_REISSUE_S
        monkeypatch.setattr(timings, "CREATE_REISSUE_S", 0.0)
        passes_until(session, job_id, lambda j: len(pending_ops(session, job_id)) == 2)
        monkeypatch.setattr(timings, "CREATE_REISSUE_S", reissue)
        first, second = (instance_name(job_id, Role.WORKER, i, 0) for i in (0, 1))
        passes_until(session, job_id, lambda j: not pending_ops(session, job_id))
        gave_up = [e.reason or "" for e in queries.events(session, job_id) if e.to_status == "provider_error"]
        assert len(gave_up) == 3 and f"create {first}" in gave_up[-1] and "gave up" in gave_up[-1], gave_up
        assert emu.snapshot()["calls"]["instances.insert"] == ATTEMPTS + 1
        assert emu.snapshot()["instances_created"] == 2  # every retry reused its requestId
        assert vms(cloud) == Counter([first, second])
        emu.clear_faults()
        emu.reset_calls()
        job = passes_until(session, job_id, all_in(InstanceStatus.TRAINING))  # seen: adopted, not created again
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
            execute(replace(ctx, session=other, job=job, pending={}), actions)

    monkeypatch.setattr(driver, "execute", repeated)
    with open_session() as session:
        job_id = create_job(session, spec).id
        job = passes_until(session, job_id, lambda j: len(j.instances) == 2)
        monkeypatch.setattr(driver, "execute", execute)
        job = passes_until(session, job_id, lambda j: all_in(*ACCEPTED)(j) and not pending_ops(session, job_id))
        assert emu.snapshot()["calls"]["instances.insert"] == 4  # each instance asked twice ...
        assert len(session.scalars(select(Operation).where(Operation.job_id == job_id)).all()) == 4
        # And the same request sent straight to the provider once more.
        inst = job.instances[0]
        backend.provider.create(InstanceRequest(name=inst.name, job_id=job_id, role=Role.WORKER, index=0,
                                                generation=0, zone=inst.zone, machine_type=inst.machine_type,
                                                spot=True, gpu="t4", gpu_count=1))
        assert vms(cloud) == Counter(statuses(job).keys())
        assert emu.snapshot()["instances_created"] == 2  # ... and each has one VM
        cancel_and_check(session, cloud, job_id)


@pytest.mark.parametrize("stockout", [False, True], ids=["same-zone", "after-zone-fallback"])
def test_a_vm_created_by_a_controller_killed_before_recording_it_is_adopted(
    cloud: EmulatedCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stockout: bool
) -> None:
    emu = compute(cloud)
    spec = make_spec(cloud, tmp_path / "runs")
    backend = quick_backend(spec)
    assert isinstance(backend.provider, GceProvider)
    if stockout:  # the first allowed zone is out of T4s: the dying controller had moved on to the next
        emu.set_stockout(Z1, gpu="nvidia-tesla-t4")
    emu.configure(boot_delay_s=60.0)  # its VM is still booting (its insert RUNNING) at the next controller
    first = ""
    dies_in = Z2 if stockout else Z1
    dying = backend.provider

    def start_then_die(request: InstanceRequest, request_id: str) -> None:
        if request.index != 0 or request.zone != dies_in:
            GceProvider.start_create(dying, request, request_id)
            return
        # The insert reaches GCE (same request id as recorded), and the controller dies before its answer.
        dying._send_insert(request, request_id)
        raise ControllerKilled(f"killed after inserting {request.name}")

    monkeypatch.setattr(dying, "start_create", start_then_die)
    with open_session() as session:
        job_id = create_job(session, spec).id
        first = instance_name(job_id, Role.WORKER, 0, 0)
        job = passes_until(session, job_id, lambda j: bool(vms(cloud)[first]))  # the pass died there
        assert statuses(job)[first] == InstanceStatus.REQUESTED.value
        assert job.instances[0].zone == dies_in  # what the DB knows: the zone it was asking
        recorded = [op for op in pending_ops(session, job_id) if op.instance_id == job.instances[0].id]
        assert len(recorded) == 1 and recorded[0].name is None  # its request id, but not the answer
        assert vms(cloud)[first] == 1 and emu.instance(first, dies_in) is not None

        dying.close()  # the controller is gone, its background calls with it
        monkeypatch.setattr(backends, "_cache", {})  # a new controller starts: nothing in memory
        backend = quick_backend(spec)
        def asked_again() -> bool:  # the recorded request id sent again: its operation's id is known now
            op = session.get(Operation, recorded[0].id)
            return op is not None and op.name is not None

        # ... and the other worker's insert, sent in the background (after its own zone fallback), has landed:
        # under load it can trail its REQUESTED row by a pass.
        job = passes_until(session, job_id, lambda j: statuses(j).get(first) == InstanceStatus.PROVISIONING.value
                           and len(j.instances) == 2 and asked_again()
                           and set(vms(cloud)) == set(statuses(j)))
        adopted = next(e for e in queries.events(session, job_id) if e.to_status == "provisioning"
                       and e.instance_id == job.instances[0].id)
        assert adopted.from_status == InstanceStatus.REQUESTED.value and adopted.reason == "create accepted"
        assert job.instances[0].zone == dies_in  # where the VM really is
        # Asked again with the recorded request id: GCE answered with the first insert's operation.
        assert emu.snapshot()["calls"]["instances.insert"] >= 2 + (1 if stockout else 0)
        assert vms(cloud) == Counter(statuses(job).keys())
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
        job = passes_until(session, active, lambda j: bool(vms(cloud)) and len(vms(cloud)) == 2)
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
        job = passes_until(session, job_id, lambda j: j.status == JobStatus.RUNNING.value)
        assert len(job.instances) == 2
        assert processes_under(cloud.root / "vms")  # the tasks run on the emulated VMs
        cancel_and_check(session, cloud, job_id)
        wait_until(lambda: processes_under(cloud.root / "vms") == [], timeout=10, interval=0.1)
        job = passes_until(session, job_id, lambda j: True)  # a final job is not driven again
        assert job.status == JobStatus.CANCELLED.value
        usd = sum(e.usd for e in session.query(LedgerEntry).filter(LedgerEntry.job_id == job_id))
        assert usd > 0 and usd == pytest.approx(queries.job_cost(session, job_id)["total"])


def test_a_job_object_kept_between_passes_never_records_an_instance_twice(
    cloud: EmulatedCloud, tmp_path: Path
) -> None:
    """The CI failure: a Job kept alive in the session (a reference cycle the GC had not collected yet) kept
    the instance list it had before the pass's creates, so the next pass saw no instances, created them
    again and the INSERT of the same name broke the unique constraint: the job stayed 'provisioning'."""
    spec = make_spec(cloud, tmp_path / "runs")
    quick_backend(spec)
    with open_session() as session:
        job_id = create_job(session, spec).id
        kept = session.get(Job, job_id)
        assert kept is not None and kept.instances == []  # loaded (empty) and held across the passes
        deadline = time.monotonic() + 30
        while True:  # passes in one session, nothing expired in between (as a daemon's or launch's loop)
            run_pass(session, OWNER, [job_id])
            with open_session() as other:
                if other.get(Job, job_id).status == JobStatus.RUNNING.value:  # type: ignore[union-attr]
                    break
            assert time.monotonic() < deadline, statuses(kept)
            time.sleep(0.05)
        assert [e.reason for e in queries.events(session, job_id) if e.to_status in ("error", "provider_error")] == []
        assert len(kept.instances) == 2
        cancel_and_check(session, cloud, job_id)
