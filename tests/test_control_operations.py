"""Operations a pass starts and later passes settle, and listings read without waiting (control/operations.py,
providers/operations.py), on the local provider with its listing or its operations held back on purpose:

- a listing older than an instance's last change never makes the instance look gone;
- an operation not done within the provider's timeout is given up and asked again;
- while an instance has an operation under way, its delete, its "deletion confirmed" and the job's end wait;
- a provider whose calls are instant is wrapped behind the same interface and answers at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from test_control_poison import local_spec

from orchestrator.control.context import JobContext
from orchestrator.control.driver import job_spec, run_pass
from orchestrator.control.launcher import create_job
from orchestrator.control.operations import waits
from orchestrator.decide.actions import DeleteInstance, SetInstanceStatus, SetJobStatus
from orchestrator.model import timings
from orchestrator.model.cloud_errors import CapacityError
from orchestrator.model.instances import InstanceRequest, ObservedInstance, Role
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import validate_spec
from orchestrator.model.status import FINAL_JOB, InstanceStatus, JobStatus
from orchestrator.providers import registry as backends
from orchestrator.providers.base import Provider
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.providers.operations import (
    InlineOperations,
    OpKind,
    OpPhase,
    OpRef,
    OpState,
    Snapshot,
    SupportsOperations,
    SupportsSnapshots,
    operations_of,
)
from orchestrator.providers.registry import Backend, backend_for
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Job, Operation

OWNER = "ops-test"


@pytest.fixture(autouse=True)
def _fresh_backends(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(backends, "_cache", {})
    user_dir()
    yield


class HeldListing(LocalProvider, SupportsSnapshots):
    """The local provider, listed in the background as a slow cloud is: ``held`` keeps serving one old
    listing (a refresh that has not come back yet)."""

    def __init__(self, inner: LocalProvider) -> None:
        self.__dict__.update(inner.__dict__)
        self.held: Snapshot | None = None

    def snapshot(self) -> Snapshot | None:
        return self.held or Snapshot(tuple(self.list(None)), time.time())


class NeverDone(LocalProvider, SupportsOperations):
    """The local provider whose inserts are accepted and then never finish (an operation stuck RUNNING)."""

    operation_timeout_s = 0.5

    def __init__(self, inner: LocalProvider) -> None:
        self.__dict__.update(inner.__dict__)
        self.started: list[str] = []

    def start_create(self, request: InstanceRequest, request_id: str) -> None:
        self.started.append(request_id)

    def start_delete(self, name: str, zone: str, request_id: str) -> None:
        self.delete(name, zone)

    def operation(self, ref: OpRef) -> OpState:
        if ref.kind == OpKind.DELETE:
            return OpState(OpPhase.DONE)
        return OpState(OpPhase.RUNNING, f"op-{ref.request_id[:8]}") if ref.request_id in self.started \
            else OpState(OpPhase.UNKNOWN)


def record(tmp_path: Path, command: str = "sleep 600") -> tuple[str, Backend]:
    spec = validate_spec(yaml.safe_load(local_spec("ops", tmp_path / "runs", command)))
    with open_session() as session:
        job_id = create_job(session, spec).id
    return job_id, backend_for(spec)


def statuses(session: Session, job_id: str) -> list[str]:
    session.expire_all()
    job = session.get(Job, job_id)
    assert job is not None
    return [i.status for i in job.instances]


def test_a_listing_older_than_an_instances_last_change_never_makes_it_look_gone(tmp_path: Path) -> None:
    job_id, backend = record(tmp_path)
    assert isinstance(backend.provider, LocalProvider)
    provider = HeldListing(backend.provider)
    backend.provider = provider
    provider.held = Snapshot((), time.time())  # taken before anything was created, and served from now on
    with open_session() as session:
        for _ in range(5):  # pass 1 creates (REQUESTED -> PROVISIONING); the old listing does not show it ...
            run_pass(session, OWNER, [job_id])
            time.sleep(0.05)
        # ... and nothing is decided from that listing: not LOST, not replaced, not created twice.
        assert statuses(session, job_id) == [InstanceStatus.PROVISIONING.value]
        provider.held = None  # a listing made after the change comes back
        deadline = time.monotonic() + 30
        while (job := session.get(Job, job_id)) is not None and job.status != JobStatus.RUNNING.value:
            assert time.monotonic() < deadline, statuses(session, job_id)
            run_pass(session, OWNER, [job_id])
            session.expire_all()
            time.sleep(0.05)
        assert statuses(session, job_id) == [InstanceStatus.TRAINING.value]
        lost = [e for e in queries.events(session, job_id) if e.to_status in ("lost", "failed", "error")]
        assert lost == []
        cancel(session, job_id)


def test_an_insert_not_done_in_time_is_given_up_and_asked_again(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    job_id, backend = record(tmp_path)
    assert isinstance(backend.provider, LocalProvider)
    provider = NeverDone(backend.provider)
    backend.provider = provider
    monkeypatch.setattr(timings, "CREATE_REISSUE_S", 0.0)
    with open_session() as session:
        run_pass(session, OWNER, [job_id])
        first = session.scalars(select(Operation).where(Operation.job_id == job_id)).one()
        assert first.status == queries.OP_PENDING and first.kind == "insert"
        run_pass(session, OWNER, [job_id])  # still running: its id is recorded, nothing else happens
        session.expire_all()
        assert first.name == f"op-{first.request_id[:8]}" and len(provider.started) == 1
        time.sleep(provider.operation_timeout_s + 0.1)
        run_pass(session, OWNER, [job_id])
        session.expire_all()
        ops = session.scalars(select(Operation).where(Operation.job_id == job_id).order_by(Operation.id)).all()
        assert [op.status for op in ops] == ["timed_out", queries.OP_PENDING]  # given up, then asked again
        assert ops[1].request_id != ops[0].request_id and len(provider.started) == 2
        assert statuses(session, job_id) == [InstanceStatus.REQUESTED.value]
        timed_out = [e.reason for e in queries.events(session, job_id) if e.to_status == "provider_error"]
        assert len(timed_out) == 1 and "not done after" in (timed_out[0] or "")
        assert "asked again" in (timed_out[0] or "")


def test_an_operation_under_way_holds_its_instances_delete_and_the_jobs_end(tmp_path: Path) -> None:
    job_id, backend = record(tmp_path)
    with open_session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        spec = job_spec(job.spec_yaml)
        ctx = JobContext(session, job, spec, [], backend, None, {}, lambda gpu, batch: 0.0)  # type: ignore[arg-type]
        name = f"{job_id}-worker-0-0"
        for pending in ({}, {name: Operation(kind="insert")}):
            ctx.pending = pending  # type: ignore[assignment]
            held = bool(pending)
            assert waits(ctx, DeleteInstance(name, "local", "tear down")) == held
            assert waits(ctx, SetInstanceStatus(name, InstanceStatus.DELETED, "deletion confirmed")) == held
            assert waits(ctx, SetJobStatus(JobStatus.CANCELLED, "every instance deleted")) == held
            assert not waits(ctx, SetJobStatus(JobStatus.RUNNING, "every task is training"))
            assert not waits(ctx, DeleteInstance(f"{job_id}-worker-1-0", "local", "another instance"))


class Refuses(Provider):
    """A provider whose create is instant and refused (a stockout)."""

    def create(self, request: InstanceRequest) -> None:
        raise CapacityError(f"no capacity in {request.zone}", zone=request.zone, resource="k80")

    def delete(self, name: str, zone: str) -> None:
        pass

    def list(self, job_ids: object = None) -> list[ObservedInstance]:
        return []


def test_instant_providers_answer_at_once_behind_the_same_interface() -> None:
    provider = Refuses()
    ops = operations_of(provider)
    assert isinstance(ops, InlineOperations) and operations_of(provider) is ops  # one wrapper per provider
    ref = OpRef(OpKind.INSERT, "j-worker-0-0", "z1", "rid-1")
    assert ops.operation(ref).phase == OpPhase.UNKNOWN  # never started here
    ops.start_create(InstanceRequest(name=ref.target, job_id="j", role=Role.WORKER, index=0,
                                     generation=0, zone="z1", machine_type="local", spot=True), ref.request_id)
    state = ops.operation(ref)
    assert state.phase == OpPhase.DONE and isinstance(state.error, CapacityError)  # typed, as from a cloud
    ops.forget(ref)
    assert ops.operation(ref).phase == OpPhase.UNKNOWN
    ops.start_delete(ref.target, "z1", "rid-2")
    assert ops.operation(OpRef(OpKind.DELETE, ref.target, "z1", "rid-2")) == OpState(OpPhase.DONE)


def cancel(session: Session, job_id: str) -> None:
    job = session.get(Job, job_id)
    assert job is not None
    job.cancel_requested = True
    session.commit()
    deadline = time.monotonic() + 30
    while True:
        run_pass(session, OWNER, [job_id])
        session.expire_all()
        job = session.get(Job, job_id)
        assert job is not None
        if job.status in FINAL_JOB:
            return
        assert time.monotonic() < deadline, statuses(session, job_id)
        time.sleep(0.05)
