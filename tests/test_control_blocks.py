"""Blocks are persisted with an expiry and used by placement and replacement: a zone stockout, a region
quota and a GPUS_ALL_REGIONS quota seen by one job stop the next job's creates from asking there again,
until the block expires. Real controller path against the Compute API emulator: the errors arrive on the
insert operations, which later passes settle (no pass waits on them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from sqlalchemy import update
from test_reconcile import SLOTS, inst, job

from orchestrator.control.driver import run_pass
from orchestrator.control.launcher import create_job
from orchestrator.decide.actions import CreateInstance
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import Observation
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import JobSpec, validate_spec
from orchestrator.model.status import EndReason, InstanceStatus
from orchestrator.providers import registry as backends
from orchestrator.providers.gce.provider import GceProvider, RetrySettings
from orchestrator.providers.registry import backend_for
from orchestrator.store.db import open_session
from orchestrator.store.models import Block, Job
from orchestrator_testing.gce_emulator import GceEmulator

Z1, Z2 = "us-central1-c", "us-central1-a"
QUICK = RetrySettings(attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02, request_timeout_s=2.0,
                      wait_call_timeout_s=1.0, operation_timeout_s=20.0)


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[GceEmulator]:
    monkeypatch.setattr(backends, "_cache", {})
    user_dir()
    # VMs stay PROVISIONING (booting) through each test: what is checked is where they were created.
    emulator = GceEmulator({"boot_delay_s": 600.0, "delete_delay_s": 0.05, "operation_wait_max_s": 2.0})
    emulator.start()
    yield emulator
    emulator.stop()


def spec(emu: GceEmulator, storage: Path, name: str) -> JobSpec:
    s = validate_spec(yaml.safe_load(f"""
name: {name}
provider: {{kind: gce, project: blocks-project, zones: [{Z1}, {Z2}], api_endpoint: "{emu.url}"}}
storage: {storage}
training: {{job: command, command: "sleep 600", mode: sync, train_steps: 10}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: t4, count: 1, spot: true}}]
pricing: {{book: 2026-11}}
"""))
    provider = backend_for(s).provider
    assert isinstance(provider, GceProvider)
    provider.retry = QUICK
    return s


@dataclass(frozen=True)
class Seen:
    zone: str
    status: str
    status_reason: str
    end_reason: str | None


def one_pass(emu: GceEmulator, storage: Path, name: str) -> tuple[Seen, dict[str, int]]:
    """A new job's passes until its one instance's create is settled (accepted, or failed everywhere)."""
    emu.reset_calls()
    deadline = time.monotonic() + 30
    with open_session() as session:
        job_id = create_job(session, spec(emu, storage, name)).id
        while True:
            run_pass(session, "blocks-test", [job_id])
            session.expire_all()
            j = session.get(Job, job_id)
            assert j is not None and time.monotonic() < deadline
            if len(j.instances) == 1 and j.instances[0].status != InstanceStatus.REQUESTED.value:
                break
            time.sleep(0.05)
        i = j.instances[0]
        return Seen(i.zone, i.status, i.status_reason or "", i.end_reason), dict(emu.snapshot()["calls"])


def blocks() -> list[tuple[str, str, str]]:
    with open_session() as session:
        return [(b.scope, b.location, b.resource) for b in session.query(Block).order_by(Block.id)]


def test_stockout_and_global_quota_blocks_are_remembered_and_expire(emu: GceEmulator, tmp_path: Path) -> None:
    storage = tmp_path / "runs"
    emu.set_stockout(Z1, gpu="nvidia-tesla-t4")
    a, calls = one_pass(emu, storage, "a")
    assert a.zone == Z2 and calls["instances.insert"] == 2  # Z1 refused, then Z2
    assert blocks() == [("zone", Z1, "t4")]

    b, calls = one_pass(emu, storage, "b")  # another job: Z1 is not asked again while the block lasts
    assert b.zone == Z2 and b.status == InstanceStatus.PROVISIONING.value
    assert calls["instances.insert"] == 1

    emu.set_quota("global", "GPUS_ALL_REGIONS", 2)  # a and b hold both
    c, calls = one_pass(emu, storage, "c")
    assert c.status == InstanceStatus.FAILED.value
    assert ("global", "global", "gpu") in blocks()
    d, calls = one_pass(emu, storage, "d")  # no GPU create anywhere while GPUS_ALL_REGIONS is blocked
    assert "instances.insert" not in calls
    assert d.end_reason == EndReason.CREATE_FAILED.value
    assert "global global blocked" in d.status_reason

    emu.set_quota("global", "GPUS_ALL_REGIONS", None)
    emu.set_stockout(Z1, gpu="nvidia-tesla-t4", enabled=False)
    with open_session() as session:
        session.execute(update(Block).values(expires_at=0.0))  # every block has expired
    e, calls = one_pass(emu, storage, "e")
    assert e.zone == Z1 and calls["instances.insert"] == 1  # the first zone is asked again


def test_replacement_prefers_zones_without_a_block() -> None:
    worker = next(s for s in SLOTS if s.name == "worker-0")
    gone = inst("worker-0", InstanceStatus.DELETED, end_reason=EndReason.PREEMPTED, zone="z1")
    view = job([gone], slots=(worker,))
    blocked = Observation(instances={}, procs={}, failed_zones={"worker-0": ("z1",)})
    creates = [a for a in reconcile(view, blocked, 10_000.0) if isinstance(a, CreateInstance)]
    assert creates and creates[0].zones == ("z2", "z1")  # z1 (its last zone, blocked) goes last
    free = Observation(instances={}, procs={})
    creates = [a for a in reconcile(view, free, 10_000.0) if isinstance(a, CreateInstance)]
    assert creates[0].zones == ("z1", "z2")  # unblocked: the replacement stays where its slot was
