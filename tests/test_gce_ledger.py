"""GCE bills close at the provider's own time, whatever the controller was doing: a deletion's operation
endTime, a preemption's operation time (the VM deleted by GCE itself), or the instance record's
lastStopTimestamp (a preempted VM that GCE stops). Each test takes the controller down at the worst moment
(after it started the delete, or before the cloud revoked the VM) for DOWN_S seconds, then starts a new one
with nothing in memory: the bill is the same as if no controller had ever been down."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.control.driver import run_pass
from orchestrator.control.launcher import create_job
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import JobSpec, validate_spec
from orchestrator.model.status import FINAL_JOB, InstanceStatus, JobStatus
from orchestrator.providers import registry as backends
from orchestrator.providers.gce.background import epoch
from orchestrator.providers.gce.provider import GceProvider, RetrySettings
from orchestrator.providers.registry import backend_for
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Job, LedgerEntry, Operation
from orchestrator_testing.cloud import EmulatedCloud, provider_yaml
from orchestrator_testing.gce_emulator import GceEmulator

PROJECT = "ledger-project"
ZONE = "us-central1-c"
DOWN_S = 3.0
QUICK = RetrySettings(attempts=3, initial_backoff_s=0.005, max_backoff_s=0.02, request_timeout_s=2.0,
                      wait_call_timeout_s=1.0, operation_timeout_s=30.0)


@pytest.fixture(autouse=True)
def _fresh_backends(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(backends, "_cache", {})
    yield
    for backend in backends._cache.values():  # their background calls end with the test's cloud
        backend.provider.close()


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[EmulatedCloud]:
    user_dir()
    config = {"boot_delay_s": 0.3, "delete_delay_s": 1.0, "preempt_delay_s": 0.5, "operation_wait_max_s": 2.0}
    with EmulatedCloud(tmp_path / "cloud", config=config) as c:
        yield c


def compute(cloud: EmulatedCloud) -> GceEmulator:
    assert cloud.compute is not None
    return cloud.compute


def make_spec(cloud: EmulatedCloud, storage: Path, termination: str = "DELETE") -> JobSpec:
    return validate_spec(yaml.safe_load(f"""
name: ledger
provider: {{kind: gce, project: {PROJECT}, zones: [{ZONE}], termination_action: {termination},
            {provider_yaml(cloud.url)}}}
storage: {storage}
training: {{job: command, command: "sleep 600", mode: sync, train_steps: 100}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: t4, count: 1, spot: true, zone: {ZONE}}}]
policy: {{on_revocation: replace, max_replacements: 0}}
pricing: {{book: 2026-11}}
"""))


def new_controller(spec: JobSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller process starting: no backend, no operation or listing in memory (the previous one's
    background calls die with it)."""
    for backend in backends._cache.values():
        backend.provider.close()
    monkeypatch.setattr(backends, "_cache", {})
    provider = backend_for(spec).provider
    assert isinstance(provider, GceProvider)
    provider.retry = QUICK


def passes_until(session: Session, job_id: str, done: Callable[[Job], bool], timeout: float = 60.0) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        run_pass(session, "ledger-test", [job_id])
        session.expire_all()
        job = session.get(Job, job_id)
        assert job is not None
        if done(job):
            return job
        assert time.monotonic() < deadline, {i.name: i.status for i in job.instances}
        time.sleep(0.05)


def training(job: Job) -> bool:
    return bool(job.instances) and job.instances[0].status == InstanceStatus.TRAINING.value


def entry(session: Session, job: Job) -> LedgerEntry:
    return session.scalars(select(LedgerEntry).where(LedgerEntry.instance_id == job.instances[0].id)).one()


def test_a_delete_finished_while_the_controller_was_down_is_billed_to_its_end_time(
    cloud: EmulatedCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = compute(cloud)
    spec = make_spec(cloud, tmp_path / "runs")
    new_controller(spec, monkeypatch)
    with open_session() as session:
        job_id = create_job(session, spec).id
        job = passes_until(session, job_id, training)
        job.cancel_requested = True
        session.commit()

        def delete_started(j: Job) -> bool:  # DELETING, and the delete's operation id recorded
            ops = session.scalars(select(Operation).where(Operation.job_id == j.id, Operation.kind == "delete")).all()
            return len(ops) == 1 and ops[0].name is not None and ops[0].status == queries.OP_PENDING

        job = passes_until(session, job_id, delete_started)
        op = session.scalars(select(Operation).where(Operation.job_id == job_id, Operation.kind == "delete")).one()
        assert job.instances[0].status == InstanceStatus.DELETING.value
        # The controller dies here. GCE finishes the delete (1 s later) while no controller runs.
        time.sleep(DOWN_S)
        cloud_op = emu.state.get_operation(PROJECT, f"zones/{ZONE}", op.name or "")
        assert cloud_op["status"] == "DONE"
        deleted_by_gce = epoch(cloud_op["endTime"])
        assert deleted_by_gce is not None

        new_controller(spec, monkeypatch)
        job = passes_until(session, job_id, lambda j: j.status in FINAL_JOB)
        assert job.status == JobStatus.CANCELLED.value
        billed = entry(session, job)
        assert billed.end_at == pytest.approx(deleted_by_gce, abs=1e-3)  # the operation's endTime (ms)
        assert job.instances[0].deleted_at == pytest.approx(deleted_by_gce, abs=1e-3)
        late = (job.ended_at or 0.0) - deleted_by_gce
        assert late >= DOWN_S - 1.0  # what a bill closed when the controller noticed would have added
        assert not emu.snapshot()["instances"]


@pytest.mark.parametrize("termination", ["DELETE", "STOP"])
def test_a_preemption_while_the_controller_was_down_is_billed_to_the_clouds_time(
    cloud: EmulatedCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, termination: str
) -> None:
    emu = compute(cloud)
    spec = make_spec(cloud, tmp_path / "runs", termination)
    new_controller(spec, monkeypatch)
    with open_session() as session:
        job_id = create_job(session, spec).id
        job = passes_until(session, job_id, training)
        name = job.instances[0].name
        # The controller is down: GCE preempts the VM and then deletes it (DELETE) or stops it (STOP).
        preempt_op = emu.state.get_operation(PROJECT, f"zones/{ZONE}", emu.preempt(name))
        time.sleep(DOWN_S)
        if termination == "DELETE":
            assert emu.instance(name) is None
            ended_by_gce = epoch(preempt_op["endTime"])  # the preemption operation's time
        else:
            record = emu.instance(name)
            assert record is not None and record["status"] == "TERMINATED"
            ended_by_gce = epoch(record["lastStopTimestamp"])  # the instance record's stop time
        assert ended_by_gce is not None

        new_controller(spec, monkeypatch)
        job = passes_until(session, job_id, lambda j: j.status in FINAL_JOB)
        # With a notice (GCS storage: the shutdown script reports it) the reconciler says preempted; here the
        # VM is simply gone, so it may say lost. Either way the bill ends at the cloud's time.
        assert job.instances[0].end_reason in ("preempted", "lost")
        billed = entry(session, job)
        assert billed.end_at == pytest.approx(ended_by_gce, abs=1e-3)
        assert (job.ended_at or 0.0) - ended_by_gce >= DOWN_S - 1.0  # noticed that much later, not billed
        assert not emu.snapshot()["instances"]
