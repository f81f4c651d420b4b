"""GCE's capacity advice (regions.advice.capacity) as the deadline policy's "can spot be had now", and as its count of
the spot VMs that can be had (elastic shrink with on-demand top-up), through the real google-cloud-compute client
against the Compute API emulator."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from google.api_core.client_options import ClientOptions
from google.api_core.exceptions import BadRequest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, compute_v1beta
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.control.deadline import spot_available, spot_count
from orchestrator.control.driver import run_pass
from orchestrator.control.launcher import create_job
from orchestrator.costmodel.slots import Slot
from orchestrator.decide.actions import RecordSpotAvailability
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import DeadlineInputs, InstanceView, JobView, Observation
from orchestrator.model.instances import ObservedInstance, ObservedState, Role
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import JobSpec, OnRevocation, TrainingMode, validate_spec
from orchestrator.model.status import LIVE_INSTANCE, EndReason, InstanceStatus, JobStatus
from orchestrator.providers import registry as backends
from orchestrator.providers.gce.dry_run import gce_dry_run
from orchestrator.providers.gce.provider import GceProvider
from orchestrator.providers.registry import backend_for
from orchestrator.store.db import open_session
from orchestrator.store.models import Event, Instance
from orchestrator_testing.gce_emulator import GceEmulator
from tests.test_gce_provider import FAST, QUICK_RETRY

P, A, B = "proj", "us-central1-a", "us-central1-b"
H100, T4 = "nvidia-h100-80gb", "nvidia-tesla-t4"


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[GceEmulator]:
    with GceEmulator({**FAST, "ssh_port": 2222, "workdir_root": str(tmp_path)}) as emulator:
        yield emulator


@pytest.fixture
def gce(emu: GceEmulator) -> Iterator[GceProvider]:
    provider = GceProvider(P, api_endpoint=emu.url, retry=QUICK_RETRY)
    provider.advice.max_age_s = 0.0  # every call asks again (the daemon: once a deadline tick)
    yield provider
    provider.close()


def slot(index: int = 0, gpu: str = "h100", machine: str = "a3-highgpu-1g", zones: tuple[str, ...] = (A,),
         spot: bool = True) -> Slot:
    return Slot(Role.WORKER, index, gpu, machine, zones[0], spot, 1.0, zones=zones)


def answer(gce: GceProvider, slots: list[Slot], timeout_s: float = 5.0) -> bool | None:
    """The newest answer: ask, wait for the background refresh that asking queued, ask again."""
    gce.spot_capacity("job", slots)
    end = time.monotonic() + timeout_s
    while gce.advice._asking and time.monotonic() < end:
        time.sleep(0.01)
    return gce.advice._scores and gce.spot_capacity("job", slots)


def test_spot_is_there_unless_every_zone_of_the_shape_is_stocked_out(emu: GceEmulator, gce: GceProvider) -> None:
    wanted = [slot(0, zones=(A, B)), slot(1, zones=(A, B))]
    gce.advice.first_wait_s = 0.0
    assert gce.spot_capacity("job", wanted) is None  # unanswered: unknown, and the pass goes on
    gce.advice.first_wait_s = 2.0
    assert answer(gce, wanted) is True
    assert emu.snapshot()["calls"].get("advice.capacity", 0) >= 1
    emu.set_stockout(A, gpu=H100, provisioning="spot")
    assert answer(gce, wanted) is True  # zone B still has it: ANY distribution
    emu.set_stockout(B, gpu=H100, provisioning="spot")
    assert answer(gce, wanted) is False
    assert answer(gce, [slot(0, spot=False)]) is None  # no spot slot: nothing to ask
    emu.set_stockout(B, gpu=H100, provisioning="spot", enabled=False)
    assert answer(gce, wanted) is True


def test_an_attached_gpu_is_asked_for_as_a_guest_accelerator(emu: GceEmulator, gce: GceProvider) -> None:
    n1 = [slot(gpu="t4", machine="n1-standard-8")]
    assert answer(gce, n1) is True
    emu.set_stockout(A, gpu=T4, provisioning="spot")
    assert answer(gce, n1) is False
    assert answer(gce, [slot()]) is True  # the H100 shape is another question
    emu.set_stockout(A, gpu=T4, provisioning="standard")  # on-demand stockouts do not count against spot
    emu.set_stockout(A, gpu=T4, provisioning="spot", enabled=False)
    assert answer(gce, n1) is True


def test_a_refused_advice_call_is_unknown_and_the_pass_goes_on(emu: GceEmulator, gce: GceProvider) -> None:
    emu.inject_fault("advice.capacity", status=403, count=None, reason="forbidden",
                     message="Required 'compute.advice.capacity' permission")
    assert answer(gce, [slot()]) is None  # the daemon then reads spot from creates and preemptions
    emu.clear_faults()
    assert answer(gce, [slot()]) is True
    assert spot_available(gce, "job", [slot(), slot(1, spot=False)]) is True  # the control layer's question


def _deadline_t4_job(emulator: GceEmulator, tmp_path: Path, zones: tuple[str, ...] = (A, B), workers: int = 1,
                     training: str = '{job: command, command: "sleep 600", mode: sync, train_steps: 1000}') -> JobSpec:
    """A gce deadline job (spot T4 workers that may run in ``zones``) on the emulator, its provider asking the advisor
    at every pass."""
    spec = validate_spec(yaml.safe_load(f"""
name: advised
provider: {{kind: gce, project: advice-project, zones: [{", ".join(zones)}], api_endpoint: "{emulator.url}"}}
storage: {tmp_path / "runs"}
training: {training}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: t4, count: {workers}, spot: true}}]
pricing: {{book: 2026-11}}
policy: {{on_revocation: deadline, deadline: 48h}}
"""))
    provider = backend_for(spec).provider
    assert isinstance(provider, GceProvider)
    provider.retry, provider.advice.max_age_s = QUICK_RETRY, 0.0
    return spec


def test_the_daemon_reads_spot_from_the_advisor_before_any_create(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """A gce job with ``on_revocation: deadline``: while the advisor scores its spot T4 at 0, the daemon records
    `spot-down` and its first create is on-demand (the policy's choice in an outage with no progress yet), with no
    spot create refused first; once the advisor scores spot again, `spot-up`."""
    monkeypatch.setattr(backends, "_cache", {})
    user_dir()
    with GceEmulator({"boot_delay_s": 600.0, "delete_delay_s": 0.05, "operation_wait_max_s": 2.0}) as emulator:
        spec = _deadline_t4_job(emulator, tmp_path)
        for zone in (A, B):
            emulator.set_stockout(zone, gpu=T4, provisioning="spot")
        with open_session() as session:
            job_id = create_job(session, spec).id
            passes(session, job_id, lambda: bool(emulator.snapshot()["instances"]))
            assert notes(session, job_id) == ["spot-down"]
            assert [i["spot"] for i in emulator.snapshot()["instances"]] == [False]
            calls = emulator.snapshot()["calls"]
            assert calls["instances.insert"] == 1 and calls["advice.capacity"] >= 1  # no spot create refused first
            for zone in (A, B):
                emulator.set_stockout(zone, gpu=T4, provisioning="spot", enabled=False)
            passes(session, job_id, lambda: notes(session, job_id)[-1] == "spot-up")


def test_the_daemon_asks_for_spot_in_the_zone_the_advisor_says_has_it(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """A gce deadline job that may run in two zones, spot out in the first: the advisor, asked zone by zone, says
    the second has it, and the daemon's first create is spot there (no create refused in the first), with each
    zone's capacity recorded for the passes after it."""
    monkeypatch.setattr(backends, "_cache", {})
    user_dir()
    with GceEmulator({"boot_delay_s": 600.0, "delete_delay_s": 0.05, "operation_wait_max_s": 2.0}) as emulator:
        spec = _deadline_t4_job(emulator, tmp_path)
        emulator.set_stockout(A, gpu=T4, provisioning="spot")
        with open_session() as session:
            job_id = create_job(session, spec).id
            passes(session, job_id, lambda: bool(emulator.snapshot()["instances"]))
            made = emulator.snapshot()
            assert [(i["spot"], i["zone"].rsplit("/", 1)[-1]) for i in made["instances"]] == [(True, B)]
            assert made["calls"]["instances.insert"] == 1  # none refused in A first
            session.expire_all()
            zones = {e.reason for e in session.scalars(select(Event).where(
                Event.job_id == job_id, Event.entity == "note", Event.to_status.like("zone-spot-%")))}
            assert zones == {f"{A}: spot capacity none", f"{B}: spot capacity there"}


def passes(session: Session, job_id: str, until: Callable[[], bool], timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < end
        run_pass(session, "advice-test", [job_id])
        time.sleep(0.05)


def notes(session: Session, job_id: str) -> list[str]:
    session.expire_all()
    return [e.to_status for e in session.scalars(select(Event).where(
        Event.job_id == job_id, Event.entity == "note", Event.to_status.in_(["spot-up", "spot-down"])
    ).order_by(Event.at, Event.id))]


def test_a_spot_create_refused_just_now_overrules_the_advisors_forecast_but_not_an_exact_probe() -> None:
    """GCE's score is a forecast: right after the job's spot create was refused in every zone the daemon reads spot
    as gone (and does not ask again until CREATE_RETRY_S has passed), while the local provider's replayed trace,
    which refused that create itself, is the truth at every tick."""
    t0 = 1_000_000.0
    worker = Slot(Role.WORKER, 0, "t4", "n1-standard-4", A, True, 0.2, on_demand_price_per_hour=0.6, zones=(A,))
    refused = InstanceView(id=1, name="j-worker-0-0", role=Role.WORKER, index=0, generation=0,
                           status=InstanceStatus.FAILED, spot=True, zone=A, port=None, requested_at=t0 - 5,
                           updated_at=t0 - 1, end_reason=EndReason.CREATE_FAILED.value)
    inputs = DeadlineInputs(work_s=10 * 3600, done_s=0.0, overhead_s=600, tick_s=60, spot_usd_per_h=0.2,
                            on_demand_usd_per_h=0.6, time_scale=1.0, spot_seen=((t0 - 60, True),))
    job = JobView(id="j", status=JobStatus.PROVISIONING, outcome=None, mode=TrainingMode.SYNC, slots=(worker,),
                  instances=(refused,), on_revocation=OnRevocation.DEADLINE, max_replacements=5, budget_usd=None,
                  deadline_s=48 * 3600, started_at=t0 - 60, restarts=0, cost_usd=0.0, notice_s=30.0,
                  deadline_inputs=inputs)

    def seen(forecast: bool) -> list[bool]:
        acts = reconcile(job, Observation(instances={}, procs={}, spot_available=True, spot_forecast=forecast), t0)
        return [a.available for a in acts if isinstance(a, RecordSpotAvailability)]

    assert seen(forecast=True) == [False]
    assert seen(forecast=False) == []  # the trace says spot is there, as the job already recorded


def test_the_dry_run_lists_the_advice_calls_a_deadline_job_makes_and_gce_answers_them(emu: GceEmulator) -> None:
    """`launch --dry-run` shows the read-only advice.capacity calls the daemon makes for a deadline job (one per
    spot shape: an N1 type with its attached T4, a g2 and an a2 that bundle theirs; and where a shape may run in
    several zones, one for each of them alone); the emulator answers them."""
    example = Path(__file__).resolve().parent.parent / "examples" / "gce-mixed-t4-l4-a100.yaml"
    data = yaml.safe_load(example.read_text())
    assert gce_dry_run(validate_spec(data))["advice.capacity"] == []  # on_revocation: replace asks nothing
    data["policy"].update(on_revocation="deadline", deadline=data["policy"].get("deadline") or "24h")
    calls = gce_dry_run(validate_spec(data))["advice.capacity"]
    machines: dict[str, list[tuple[str, ...]]] = {}
    for c in calls:
        zones = tuple(z["zone"] for z in c["body"]["distributionPolicy"]["zones"])
        machines.setdefault(c["body"]["instanceFlexibilityPolicy"]["instanceSelections"]["spot"]["machineTypes"][0],
                            []).append(zones)
    assert len(machines) >= 2 and all(c["every_s"] == 60 for c in calls)
    for asked in machines.values():  # every zone it may use, then each alone where there are several
        assert asked == [asked[0]] + ([(z,) for z in asked[0]] if len(asked[0]) > 1 else [])
    assert any(len(asked) > 1 for asked in machines.values())
    n1 = [c for c in calls if c["body"]["instanceFlexibilityPolicy"]["instanceSelections"]["spot"]["machineTypes"][0]
          .startswith("n1-")]
    assert all(c["body"]["instanceFlexibilityPolicy"]["instanceSelections"]["spot"]["guestAccelerators"] for c in n1)
    assert {c["api_version"] for c in calls} == {"beta"}
    options = {"credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
               "client_options": ClientOptions(api_endpoint=emu.url)}
    client = compute_v1beta.AdviceClient(**options)
    for call in calls:
        project, _, region = call["path"].split("/")[1:4]
        answer = client.capacity(project=project, region=region, capacity_advice_request_resource=(
            compute_v1beta.CapacityAdviceRequest.from_json(json.dumps(call["body"]))))
        assert answer.recommendations[0].scores.obtainability == 1.0
    client.transport.close()  # type: ignore[no-untyped-call]
    v1 = compute_v1.AdviceClient(**options)  # the v1 API refuses SPOT advice, as GCE's (Public Preview: beta only)
    with pytest.raises(BadRequest, match="provisioningModel"):
        v1.capacity(project=project, region=region, capacity_advice_request_resource=(
            compute_v1.CapacityAdviceRequest.from_json(json.dumps(calls[0]["body"]))))
    v1.transport.close()  # type: ignore[no-untyped-call]


# ---------------------------------------------------------------- elastic shrink with on-demand top-up (issue 23)
# The advisor, asked for 1, 2, ... of a job's spot VMs, counts how many more can be had, and the daemon shrinks a
# PyTorch deadline job onto them and tops it up with on-demand (deadline_elastic), the same choice as on the local
# provider's replayed 16-node trace. The emulator's zone holds only so many spot T4s (set_stockout(..., capacity=k)).


def t4_slots(n: int, zones: tuple[str, ...] = (A,)) -> list[Slot]:
    return [Slot(Role.WORKER, i, "t4", "n1-standard-8", zones[0], True, 1.0, zones=zones) for i in range(n)]


def counted(gce: GceProvider, slots: list[Slot]) -> int | None:
    """The newest count: ask until no refresh that asking queued is still running (a count may ask twice)."""
    for _ in range(3):
        gce.spot_capacity_count("job", slots)
        end = time.monotonic() + 5.0
        while gce.advice._asking and time.monotonic() < end:
            time.sleep(0.01)
    return gce.spot_capacity_count("job", slots)


def test_the_advisor_counts_the_spot_vms_the_zone_has_room_for(emu: GceEmulator, gce: GceProvider) -> None:
    slots = t4_slots(3)
    assert counted(gce, slots) == 3
    assert emu.snapshot()["calls"]["advice.capacity"] == 3  # room for all: only "3 of them?" asked, once a call
    for room in (2, 1, 0):
        emu.set_stockout(A, gpu=T4, provisioning="spot", capacity=room)
        assert counted(gce, slots) == room
    emu.set_stockout(A, gpu=T4, provisioning="spot", enabled=False)
    assert counted(gce, slots) == 3
    assert counted(gce, t4_slots(3, zones=(A, "us-central1-b"))) is None  # zones: decide.deadline_zones decides


def test_the_count_adds_the_spot_vms_the_job_holds(emu: GceEmulator, gce: GceProvider) -> None:
    """The advisor answers for new VMs: the daemon asks it of the slots without a live spot VM (two here, room for
    one more) and adds the one the job holds; a preempted or on-demand VM is not held spot."""
    emu.set_stockout(A, gpu=T4, provisioning="spot", capacity=1)

    def vm(index: int, spot: bool = True, preempted: bool = False) -> ObservedInstance:
        return ObservedInstance(f"w{index}", "job", Role.WORKER, index, 0, A, ObservedState.RUNNING,
                                preempted=preempted, gpu="t4", spot=spot)

    slots = t4_slots(3)
    counted(gce, slots[1:])
    assert spot_count(gce, "job", slots, {"w0": vm(0)}) == 2
    counted(gce, slots)
    assert spot_count(gce, "job", slots, {"w0": vm(0, spot=False), "w1": vm(1, preempted=True)}) == 1


def test_the_daemon_shrinks_a_pytorch_job_onto_the_spot_vms_gce_has_and_tops_it_up(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three spot T4 workers, room for one: the daemon records the count and its choice (shrink to two workers, one
    of them on-demand) and creates what the choice says, with no spot create refused first; once there is room for
    three, it goes back to three spot VMs and drops the on-demand one."""
    monkeypatch.setattr(backends, "_cache", {})
    user_dir()
    with GceEmulator({"boot_delay_s": 600.0, "delete_delay_s": 0.05, "operation_wait_max_s": 2.0}) as emulator:
        torch = "{framework: pytorch, hparam_set: resnet_tiny, problem: image_cifar10, train_steps: 600}"
        spec = _deadline_t4_job(emulator, tmp_path, (A,), 3, torch)
        emulator.set_stockout(A, gpu=T4, provisioning="spot", capacity=1)
        with open_session() as session:
            job_id = create_job(session, spec).id

            def notes() -> list[tuple[str, str]]:
                session.expire_all()
                return [(e.to_status, e.reason or "") for e in session.scalars(select(Event).where(
                    Event.job_id == job_id, Event.entity == "note").order_by(Event.at, Event.id))]

            def carried_out() -> bool:  # the live VMs are the newest choice's: "<s> spot + <o> on-demand of ..."
                choices = [why.split() for status, why in notes() if status == "elastic-choice"]
                made = sorted(i.spot for i in session.scalars(select(Instance).where(
                    Instance.job_id == job_id, Instance.status.in_([str(s) for s in LIVE_INSTANCE]))))
                return bool(choices) and made == sorted([True] * int(choices[-1][0]) + [False] * int(choices[-1][3]))

            passes(session, job_id, carried_out)
            assert not session.scalars(select(Instance).where(  # no spot create was refused first
                Instance.job_id == job_id, Instance.end_reason == str(EndReason.CREATE_FAILED))).all()
            assert ("spot-count", "1 spot VMs can be had") in notes()
            assert [why for status, why in notes() if status == "elastic-choice"] == [
                "1 spot + 1 on-demand of 3 workers (1 spot VMs can be had)"]  # shrunk to 2, topped up

            emulator.set_stockout(A, gpu=T4, provisioning="spot", enabled=False)  # room again: back to spot
            passes(session, job_id, lambda: ("spot-count", "3 spot VMs can be had") in notes() and sorted(
                i["spot"] for i in emulator.snapshot()["instances"]) == [False, True, True, True])
            assert [why for status, why in notes() if status == "elastic-choice"][-1] == (
                "3 spot + 0 on-demand of 3 workers (3 spot VMs can be had)")
            # The on-demand VM goes once GCE has finished creating it (a delete waits for the VM's insert): each pass
            # asks for it again, though its slot already has a spot VM.
            caplog.set_level(logging.DEBUG, logger="orchestrator.control.driver")
            on_demand = next(i["name"] for i in emulator.snapshot()["instances"] if not i["spot"])
            passes(session, job_id, lambda: f"DeleteInstance(name='{on_demand}'" in caplog.text)


def test_the_dry_run_says_which_smaller_sizes_an_elastic_job_also_asks_for() -> None:
    spec = validate_spec(yaml.safe_load(f"""
name: elastic-dry
provider: {{kind: gce, project: my-project, zones: [{A}]}}
storage: gs://bucket/runs
training: {{framework: pytorch, hparam_set: resnet_cifar_32, train_steps: 1000}}
cluster:
  workers: [{{gpu: t4, count: 4, spot: true}}]
policy: {{on_revocation: deadline, deadline: 30h}}
pricing: {{book: 2026-11}}
"""))
    calls = gce_dry_run(spec)["advice.capacity"]
    assert [(c["body"]["size"], c["also_sizes_when_below"]) for c in calls] == [(4, [1, 2, 3])]
