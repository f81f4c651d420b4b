"""The deadline policy moving the spot workers between GPU types (issue 23, items 2 and 3: ``policy.also_gpus``):
the daemon's reconcile makes the simulator's market decisions (``sim.multizone`` with ``Market``s, the bench's
``deadline-markets``) pass for tick; the moved instance is created as that GPU type; the spec and the local
provider's per-GPU traces are checked before anything runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from orchestrator.costmodel.slots import Slot
from orchestrator.decide import deadline_gpus
from orchestrator.decide.actions import (
    CreateInstance,
    RecordSpotAvailability,
)
from orchestrator.decide.deadline import Mode
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import DeadlineInputs, GpuMarket, InstanceView, JobView, Observation
from orchestrator.model.instances import Role
from orchestrator.model.paths import data_dir
from orchestrator.model.spec import OnRevocation, TrainingMode
from orchestrator.model.status import InstanceStatus, JobStatus
from orchestrator.sim.availability import Job, load_trace
from orchestrator.sim.daemon_replay import ReplayedDaemon
from orchestrator.sim.multizone import Market, minutes_for, run_multi, work_in

TRACES = data_dir() / "spot-availability"
OWN_TRACE, OTHER_TRACE = (TRACES / "aws-10-26-2022_us-west-2b_v100_1.json",
                          TRACES / "aws-10-26-2022_us-west-2a_v100_1.json")
T0 = 1_000_000.0
K = 1.0  # the daemon's seconds per cloud minute (time_scale 60)


class _Daemon(ReplayedDaemon):
    """``decide.reconcile`` one pass per tick: the job's own GPU type in one zone (its spot probe) and another GPU
    type (the probe of its slots there). A spot VM is preempted when its market's trace drops; a create starts at
    once; a drained VM checkpoints at once and the next pass follows within the tick. The note events the daemon
    would record are kept as the DB keeps them, and read back as ``control.deadline`` does."""

    def __init__(self, job: Job, tick: int, own: str, other: Market, other_gpu: str) -> None:
        super().__init__()
        self.job, self.tick, self.own, self.other_gpu = job, tick, own, other_gpu
        self.slot = Slot(Role.WORKER, 0, own, "local", "local", True, job.spot_usd_per_h,
                         on_demand_price_per_hour=job.on_demand_usd_per_h, zones=("local",))
        moved = Slot(Role.WORKER, 0, other_gpu, "local", "local", True, other.spot_usd_per_h or 0.0,
                     on_demand_price_per_hour=9.9, zones=("local",))
        self.market = GpuMarket(other_gpu, other.speed, other.spot_usd_per_h or 0.0, (moved,))
    def inputs(self, w: int) -> DeadlineInputs:
        job = self.job
        return DeadlineInputs(work_s=K * job.work_min, done_s=K * w, overhead_s=K * job.overhead_min,
                              tick_s=K * self.tick, spot_usd_per_h=job.spot_usd_per_h,
                              on_demand_usd_per_h=job.on_demand_usd_per_h, time_scale=60.0 / K,
                              markets=(self.market,), **self.seen())

    def pass_(self, now: float, w: int, own_up: bool, other_up: bool) -> bool:
        """One pass; True when it drained a VM (the next pass follows within the tick)."""
        return self.pass_over(self.slot, K * self.job.deadline_min, T0, self.inputs(w),
                              lambda v: not (own_up if v.gpu == self.own else other_up), now,
                              spot_available=own_up, spot_by_gpu={self.other_gpu: other_up})

    def apply(self, act: object, now: float) -> bool:
        if isinstance(act, CreateInstance):
            assert act.spot or act.slot.gpu == self.own, "on-demand runs the job's own GPU type"
        return super().apply(act, now)

    def running(self) -> tuple[str, float]:
        """What runs, labelled as the simulator labels it, and its speed."""
        on = self.training()
        if not on:
            return Mode.IDLE.value, 0.0
        if not on[0].spot:
            return Mode.ON_DEMAND.value, 1.0
        return ("spot@0", 1.0) if on[0].gpu == self.own else ("spot@1", self.market.speed)


def _daemon_timeline(job: Job, avails: tuple[tuple[bool, ...], tuple[bool, ...]], tick: int, own: str,
                     other: Market, other_gpu: str) -> list[tuple[float, str]]:
    daemon = _Daemon(job, tick, own, other, other_gpu)
    t, w, r, i, shown = 0, 0, 0, 0, Mode.IDLE.value
    timeline: list[tuple[float, str]] = []
    while True:
        up = tuple(i < len(a) and a[i] for a in avails)
        if daemon.pass_(T0 + K * t, w, *up):
            daemon.pass_(T0 + K * t + 1.0, w, *up)
        label, speed = daemon.running()
        if not timeline or timeline[-1][1] != label:
            timeline.append((t, label))
        r = r if label == shown else (job.overhead_min if label != Mode.IDLE.value else 0)
        shown = label
        if label != Mode.IDLE.value and r + minutes_for(speed, job.work_min - w) <= tick:
            timeline.append((t + r + minutes_for(speed, job.work_min - w), "done"))
            return timeline
        if label != Mode.IDLE.value:
            w, r = w + work_in(speed, max(0, tick - r)), max(0, r - tick)
        t, i = t + tick, i + 1


@pytest.mark.parametrize("start", [300, 1990, 2243])
@pytest.mark.parametrize(("own", "other_gpu", "other", "work_h", "deadline_h", "overhead_min"), [
    ("k80", "v100", Market(3.3, 0.861), 24, 30, 3),  # a V100 does 3.3x a K80's work (ICAC'19 step times)
    ("v100", "k80", Market(0.3, 0.256), 12, 20, 8),  # a K80 does 0.3x a V100's
])
def test_the_daemon_makes_the_markets_simulators_decisions(start: int, own: str, other_gpu: str, other: Market,
                                                           work_h: int, deadline_h: int, overhead_min: int) -> None:
    """The job's own GPU type replays one measured trace, the other type another (the shipped 2b and 2a traces,
    the other a day on): the daemon's timeline, market by market, is the simulator's."""
    tick = load_trace(OWN_TRACE).tick_min
    a, b = load_trace(OWN_TRACE).available(), load_trace(OTHER_TRACE).available()
    avails = (a[start:], b[start + 144:])
    job = Job(work_h * 60, deadline_h * 60, overhead_min, 0.861 if own == "v100" else 0.256,
              2.144 if own == "v100" else 0.45)
    sim = run_multi(job, avails, tick, markets=(Market(), other), name="deadline-markets")
    assert sim.deadline_met
    daemon = _daemon_timeline(job, avails, tick, own, other, other_gpu)
    assert daemon == sim.timeline
    assert {"spot@0", "spot@1"} <= {label for _, label in daemon}  # it moved between the GPU types


def test_a_job_whose_own_spot_is_out_trains_on_the_other_gpu_types_spot() -> None:
    """A K80 job 2 h in, its spot out for 2 h and V100 spot there (3.3x the work, $0.86/h against $0.26/h): the
    worker is created as a V100 spot VM, with the V100 slot's machine, price and zones; the capacity is noted
    under the V100's market key."""
    hour = 3600.0
    slot = Slot(Role.WORKER, 0, "k80", "n1-standard-4", "z0", True, 0.256, on_demand_price_per_hour=0.45,
                zones=("z0",))
    moved = Slot(Role.WORKER, 0, "v100", "n1-standard-8", "z1", True, 0.861, on_demand_price_per_hour=2.48,
                 zones=("z1", "z2"))
    inputs = DeadlineInputs(work_s=24 * hour, done_s=1.5 * hour, overhead_s=600, tick_s=600, spot_usd_per_h=0.256,
                            on_demand_usd_per_h=0.45, spot_seen=((T0 - 2 * hour, True), (T0 - 0.5 * hour, False)),
                            markets=(GpuMarket("v100", 3.3, 0.861, (moved,)),))
    view = JobView(id="j", status=JobStatus.RUNNING, outcome=None, mode=TrainingMode.SYNC, slots=(slot,),
                   instances=(), on_revocation=OnRevocation.DEADLINE, max_replacements=5, budget_usd=None,
                   deadline_s=27 * hour, started_at=T0 - 2 * hour, restarts=0, cost_usd=0.0, deadline_inputs=inputs)
    obs = Observation(instances={}, procs={}, spot_available=False, spot_by_gpu={"v100": True})
    acts = reconcile(view, obs, T0)
    creates = [a for a in acts if isinstance(a, CreateInstance)]
    assert [(c.slot, c.spot, c.zones) for c in creates] == [(moved, True, ("z1", "z2"))]
    assert "on v100" in creates[0].reason
    assert [(r.zone, r.available) for r in acts if isinstance(r, RecordSpotAvailability) and r.zone] == [
        (deadline_gpus.market_key("v100"), True)]
    # without the provider's answer for the V100 the job waits for its own spot, as before also_gpus
    plain = Observation(instances={}, procs={}, spot_available=False)
    assert not [a for a in reconcile(view, plain, T0) if isinstance(a, CreateInstance) and a.spot]
    # a V100 spot create refused just now (under CREATE_RETRY_S) overrules the forecast: no V100 create this pass
    refused = InstanceView(id=1, name="j-worker-0-0", role=Role.WORKER, index=0, generation=0,
                           status=InstanceStatus.FAILED, spot=True, zone="z1", port=None, requested_at=T0 - 9,
                           updated_at=T0 - 5, end_reason="create_failed", gpu="v100")
    after = reconcile(replace(view, instances=(refused,)), obs, T0)
    assert not [a for a in after if isinstance(a, CreateInstance) and a.slot.gpu == "v100"]
    # the advice itself is recorded as it is (the refusal decides this pass; it is no change of capacity)
    assert [(r.zone, r.available) for r in after if isinstance(r, RecordSpotAvailability) and r.zone] == [
        (deadline_gpus.market_key("v100"), True)]


def test_union_is_spot_in_any_market() -> None:
    a = ((0.0, True), (5.0, False), (9.0, True))
    b = ((1.0, False), (3.0, True), (7.0, False))
    assert deadline_gpus.union([a, b]) == ((0.0, True), (7.0, False), (9.0, True))


def _spec(tmp_path: Path, policy: dict[str, object], provider: dict[str, object] | None = None) -> Path:
    for name, src in (("own.json", OWN_TRACE), ("other.json", OTHER_TRACE)):
        (tmp_path / name).write_text(src.read_text())
    spec = {"name": "g", "provider": {"kind": "local", "revocations": "none", **(provider or {})},
            "cluster": {"workers": [{"gpu": "k80", "count": 1, "spot": True}]},
            "policy": {"on_revocation": "deadline", "deadline": "10m", **policy}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path / "job.yaml"


@pytest.mark.parametrize(("policy", "provider", "problem"), [
    ({"on_revocation": "replace", "deadline": None, "also_gpus": ["v100"]}, {}, "set on_revocation: deadline"),
    ({"also_gpus": ["v1000"]}, {}, "policy.also_gpus[0]"),
    ({"also_gpus": ["K80"]}, {}, "a spot worker group's own GPU type"),
    ({"also_gpus": ["v100"]}, {"gpu_availability_traces": {"v100": "other.json"}},
     "goes with availability_trace"),
    ({"also_gpus": ["v100"]}, {"availability_trace": "own.json", "gpu_availability_traces": {"v100": "gone.json"}},
     "provider.gpu_availability_traces.v100"),
    ({"also_gpus": ["v100"]}, {"availability_trace": "own.json", "gpu_availability_traces": {"v100": "slow.json"}},
     "one tick length"),
])
def test_also_gpus_and_their_traces_are_checked_before_anything_runs(
        tmp_path: Path, policy: dict[str, object], provider: dict[str, object], problem: str) -> None:
    import json

    from orchestrator.model.spec import load_spec
    from orchestrator.model.spec.base import SpecError

    slow = json.loads(OTHER_TRACE.read_text())
    slow["metadata"]["gap_seconds"] = 1200
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    with pytest.raises(SpecError) as err:
        load_spec(_spec(tmp_path, policy, provider))
    assert problem in str(err.value)


def test_the_local_provider_replays_each_gpu_types_own_trace(tmp_path: Path) -> None:
    """A V100 instance of a job replays the V100's trace (refused in its stockout), the K80 its own; the capacity
    probe answers for the slots' GPU type."""
    from orchestrator.model.cloud_errors import CapacityError
    from orchestrator.model.instances import InstanceRequest
    from orchestrator.providers.local.provider import LocalProvider
    from orchestrator.sim.availability import AvailabilityTrace

    def flat(up: bool) -> AvailabilityTrace:
        trace = load_trace(OWN_TRACE)
        return AvailabilityTrace(name=f"flat-{up}", gap_s=trace.gap_s, counts=(1 if up else 0,) * 100)

    provider = LocalProvider(tmp_path, time_scale=60.0, availability=flat(True), gpu_availability={"v100": flat(False)})
    k80 = Slot(Role.WORKER, 0, "k80", "local", "local", True, 0.256)
    v100 = Slot(Role.WORKER, 0, "v100", "local", "local", True, 0.861)
    assert provider.spot_capacity("j", [k80]) is True
    assert provider.spot_capacity("j", [v100]) is False
    request = InstanceRequest(name="j-worker-0-1", job_id="j", role=Role.WORKER, index=0, generation=1,
                              zone="local", machine_type="local", spot=True, gpu="v100", gpu_count=1,
                              price_per_hour=0.861, metadata={})
    with pytest.raises(CapacityError, match="flat-False"):
        provider.create(request)


def test_a_gce_t4_job_with_its_spot_out_creates_an_a100_spot_vm(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    """Through the real google-cloud-compute client and the Compute API emulator: a T4 deadline job that may move
    to A100s (4.4x its work rate as planned, $1.80/h spot: $0.41 per hour of its work, under the T4's $0.54
    on-demand), T4 spot stocked out in both its zones. The advisor, asked for each GPU type's shape, says A100 spot
    can be had, and the daemon's first create is a spot A100 VM (a2-highgpu-1g, the A100's machine type), with no
    T4 create refused first."""
    from sqlalchemy import select
    from test_gce_advice import T4, A, B, passes

    from orchestrator.control.launcher import create_job
    from orchestrator.model.paths import user_dir
    from orchestrator.model.spec import validate_spec
    from orchestrator.providers import registry as backends
    from orchestrator.providers.gce.provider import GceProvider
    from orchestrator.providers.registry import backend_for
    from orchestrator.store.db import open_session
    from orchestrator.store.models import Instance
    from orchestrator_testing.gce_emulator import GceEmulator
    from tests.test_gce_provider import QUICK_RETRY

    monkeypatch.setattr(backends, "_cache", {})
    user_dir()
    with GceEmulator({"boot_delay_s": 600.0, "delete_delay_s": 0.05, "operation_wait_max_s": 2.0}) as emulator:
        spec = validate_spec(yaml.safe_load(f"""
name: moved
provider: {{kind: gce, project: advice-project, zones: [{A}, {B}], api_endpoint: "{emulator.url}"}}
storage: {tmp_path / "runs"}
training: {{job: command, command: "sleep 600", mode: sync, train_steps: 100000}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: t4, count: 1, spot: true}}]
pricing: {{book: 2026-11}}
policy: {{on_revocation: deadline, deadline: 48h, also_gpus: [a100]}}
"""))
        provider = backend_for(spec).provider
        assert isinstance(provider, GceProvider)
        provider.retry, provider.advice.max_age_s = QUICK_RETRY, 0.0
        for zone in (A, B):
            emulator.set_stockout(zone, gpu=T4, provisioning="spot")
        with open_session() as session:
            job_id = create_job(session, spec).id
            passes(session, job_id, lambda: bool(emulator.snapshot()["instances"]))
            made = emulator.snapshot()
            assert [(i["spot"], i["gpu"], i["gpu_count"]) for i in made["instances"]] == [
                (True, "nvidia-tesla-a100", 1)]
            assert made["calls"]["instances.insert"] == 1  # no T4 create refused first
            session.expire_all()
            row = session.scalars(select(Instance).where(Instance.job_id == job_id)).one()
            assert (row.gpu, row.machine_type, row.spot) == ("a100", "a2-highgpu-1g", True)


def test_plan_shows_the_markets_row_for_a_spec_that_may_move_gpu_types(tmp_path: Path) -> None:
    """``plan --json`` of ``examples/local-deadline-gpus.yaml`` (with more time): a ``deadline-markets`` row (both
    GPU types' traces at once from the same start ticks, ``sim.multizone.zones_outlook`` with the planned markets),
    as the daemon runs it; never dearer than on-demand."""
    import json

    from e2e_helpers import cli, example_in

    spec, env = example_in(Path(__file__).resolve().parent.parent / "examples" / "local-deadline-gpus.yaml", tmp_path)
    raw = yaml.safe_load(spec.read_text())
    raw["policy"]["deadline"] = "600s"  # room for a loaded host's slower steps: plan refuses a spec it predicts late
    spec.write_text(yaml.safe_dump(raw))
    out = cli("plan", str(spec), "--json", env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["policy"]: r for r in json.loads(out.stdout)["deadline_policies"]["policies"]}
    assert set(rows) == {"on-demand", "greedy", "uniform-progress", "deadline", "deadline-markets"}
    assert rows["deadline-markets"]["runs"] == rows["deadline"]["runs"]
    assert rows["deadline-markets"]["mean_cost_usd"] <= rows["on-demand"]["mean_cost_usd"] + 1e-9


def test_a_moved_slots_plot_row_names_each_gpu_type_and_colours_each_bar_by_its_own() -> None:
    """``report --plot``: a worker that ran a K80 and then a V100 is one row, "worker-0 (K80, V100)", each bar in
    its GPU type's colour; a slot that ran one type keeps its slot colour."""
    from orchestrator.cli.plots import GPU_COLOURS, Bar, PlotData, _bar_colour, slot_colours, slot_gpus

    def bar(slot: str, gpu: str, start: float) -> Bar:
        return Bar(slot=slot, name=f"{slot}-{start:g}", gpu=gpu, spot=True, start=start, end=start + 50,
                   price_per_hour=1.0, on_demand_per_hour=2.0, revoked=None, notice=False, replacement=start > 0)

    bars = [bar("worker-0", "k80", 0), bar("worker-0", "v100", 50), bar("worker-1", "k80", 0)]
    data = PlotData("j", "succeeded", 0.0, 100.0, bars=bars)
    assert slot_gpus(data) == {"worker-0": ["k80", "v100"], "worker-1": ["k80"]}
    colour = slot_colours(data)
    assert [_bar_colour(b, colour, slot_gpus(data)) for b in bars[:2]] == [GPU_COLOURS["k80"], GPU_COLOURS["v100"]]
    assert _bar_colour(bars[2], colour, slot_gpus(data)) == colour["worker-1"]
