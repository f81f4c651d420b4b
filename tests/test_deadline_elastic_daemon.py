"""The daemon's elastic shrink with on-demand top-up (issue 23, items 2 and 3): ``decide.reconcile`` over a multi-worker
PyTorch job, fed a real 16-node availability trace pass by pass, makes the simulator's decisions
(``sim.elastic.replay`` with ``decide.elastic.elastic_policy``) tick for tick; and the slot mapping
(``decide.deadline_elastic.assign``) keeps the rendezvous slot filled."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.costmodel.slots import Slot
from orchestrator.decide.deadline_elastic import assign
from orchestrator.decide.elastic import IDLE, Members, elastic_policy
from orchestrator.decide.state import DeadlineInputs, InstanceView
from orchestrator.model.instances import Role
from orchestrator.model.paths import data_dir
from orchestrator.model.status import InstanceStatus
from orchestrator.sim.availability import Job, load_trace
from orchestrator.sim.daemon_replay import ReplayedDaemon
from orchestrator.sim.elastic import replay

TRACE = data_dir() / "spot-availability" / "16-node" / "aws-08-27-2023_us-west-2c_v100_1.json"
T0 = 1_000_000.0
K = 1.0  # the daemon's seconds per cloud minute (time_scale 60)
SPOT, OD = 0.861, 2.144  # V100 per VM, GCE 2019-02


def _slots(n: int) -> tuple[Slot, ...]:
    return tuple(Slot(Role.WORKER, j, "v100", "gce", "z0", True, SPOT, on_demand_price_per_hour=OD, zones=("z0",))
                 for j in range(n))


class _Daemon(ReplayedDaemon):
    """One pass per tick: the trace's count is the provider's answer; when it falls below the spot VMs that run,
    the newest of them are preempted (the local provider revokes the highest ranks); a create trains at once."""

    def __init__(self, job: Job, tick: int, n: int) -> None:
        super().__init__()
        self.job, self.tick, self.slots = job, tick, _slots(n)

    def inputs(self, w: float) -> DeadlineInputs:
        job, n = self.job, len(self.slots)
        return DeadlineInputs(work_s=K * job.work_min, done_s=K * w, overhead_s=K * job.overhead_min,
                              tick_s=K * self.tick, spot_usd_per_h=n * job.spot_usd_per_h,
                              on_demand_usd_per_h=n * job.on_demand_usd_per_h, time_scale=60.0 / K, **self.seen())

    def pass_(self, now: float, w: float, count: int, preempt: bool) -> bool:
        spot = sorted((v for v in self.training() if v.spot), key=lambda v: (v.requested_at, v.index))
        gone = {v.name for v in spot[count:]} if preempt else set()
        return self.pass_over(self.slots, K * self.job.deadline_min, T0, self.inputs(w), lambda v: v.name in gone,
                              now, spot_available=count >= 1, spot_count=count)

    def running(self) -> Members:
        on = self.training()
        return Members(sum(v.spot for v in on), sum(not v.spot for v in on))


def _label(m: Members) -> str:
    return "idle" if m == IDLE else f"{m.spot}s+{m.on_demand}od"


def _daemon_timeline(job: Job, n: int, counts: tuple[int, ...], tick: int) -> list[tuple[float, str]]:
    """The daemon's memberships, with progress counted as ``sim.elastic.replay`` counts it."""
    daemon = _Daemon(job, tick, n)
    t, w, r, i, shown = 0, 0.0, 0, 0, IDLE
    timeline: list[tuple[float, str]] = []
    while t < job.deadline_min:
        k = counts[i] if i < len(counts) else 0
        due = shown.spot > k
        if daemon.pass_(T0 + K * t, w, k, preempt=True):
            daemon.pass_(T0 + K * t + 1.0, w, k, preempt=False)
        c = daemon.running()
        if not timeline or timeline[-1][1] != _label(c):
            timeline.append((t, _label(c)))
        r = 0 if c == IDLE else job.overhead_min if c != shown or due else r
        shown = c
        if c.workers:
            need = r + (job.work_min - w) * n / c.workers
            if need <= tick + 1e-9:
                timeline.append((t + need, "done"))
                return timeline
            w, r = w + max(0, tick - r) * c.workers / n, max(0, r - tick)
        t, i = t + tick, i + 1
    timeline.append((t, "deadline passed"))
    return timeline


@pytest.mark.parametrize("start", [0, 2350, 2500, 3600])
@pytest.mark.parametrize(("workers", "work_h", "deadline_h", "overhead_min"), [(4, 8, 12, 10), (3, 6, 7, 5)])
def test_the_daemon_makes_the_elastic_simulators_decisions(start: int, workers: int, work_h: int, deadline_h: int,
                                                           overhead_min: int) -> None:
    trace = load_trace(TRACE)
    counts = trace.counts[start:]
    job = Job(work_h * 60, deadline_h * 60, overhead_min, SPOT, OD)
    sim = replay(job, workers, counts, trace.tick_min, elastic_policy, "elastic")
    assert sim.deadline_met
    daemon = _daemon_timeline(job, workers, counts, trace.tick_min)
    assert daemon == [(float(t), label) for t, label in sim.timeline]
    assert any("s+" in label and not label.startswith(("0s", f"{workers}s+0")) for _, label in daemon), \
        "the replay never ran a shrunk or topped-up cluster"


@pytest.mark.parametrize("forecast", [True, False])
def test_a_preemption_overrules_a_forecast_count_in_its_pass(forecast: bool) -> None:
    """GCE's count is the advisor's forecast: in the pass where a spot VM is preempted the daemon counts no more spot
    VMs than run on, and takes no spot VM in their place then, as an all-or-nothing job reads no spot in that pass
    (``reconcile._spot_available``); an exact count (a replayed trace) stands."""
    job = Job(6 * 60, 7 * 60, 5, SPOT, OD)
    daemon = _Daemon(job, 5, 3)
    daemon.pass_(T0, 0.0, 3, preempt=False)
    assert daemon.running() == Members(3, 0)
    victim = max((v for v in daemon.training()), key=lambda v: v.index)
    daemon.pass_over(daemon.slots, K * job.deadline_min, T0, daemon.inputs(10.0), lambda v: v.name == victim.name,
                     T0 + K * 10, spot_available=True, spot_count=3, spot_forecast=forecast)
    spot_now = daemon.running().spot
    if forecast:
        assert daemon.spot_counts[-1][1] == 2 and spot_now == 2
    else:
        assert daemon.spot_counts[-1][1] == 3 and spot_now == 3  # a new spot VM in the preempted slot


def _inst(slot: int, spot: bool, status: InstanceStatus = InstanceStatus.TRAINING) -> InstanceView:
    return InstanceView(id=slot, name=f"j-worker-{slot}-0", role=Role.WORKER, index=slot, generation=0,
                        status=status, spot=spot, zone="z0", port=None, requested_at=0.0, updated_at=0.0, gpu="v100")


def test_assign_keeps_what_runs_and_fills_the_rendezvous_slot_first() -> None:
    slots = _slots(4)
    live = {"worker-0": _inst(0, True), "worker-2": _inst(2, True)}
    drop, create, empty = assign(slots, live, [], Members(1, 2), "worker-0")
    assert [i.slot for i in drop] == ["worker-2"]  # the rendezvous host's spot VM stays
    assert [(c.slot.name, c.spot, c.after) for c in create] == [("worker-1", False, None), ("worker-3", False, None)]
    assert empty == ("worker-2",)  # its VM drains and goes
    drop, create, empty = assign(slots, live, [], Members(2, 0), "worker-0")
    assert (drop, create, empty) == ((), (), ("worker-1", "worker-3"))  # shrunk: the world re-forms without them


def test_assign_moves_a_worker_onto_an_empty_rendezvous_slot() -> None:
    slots = _slots(3)
    live = {"worker-1": _inst(1, True), "worker-2": _inst(2, True)}
    drop, create, empty = assign(slots, live, [], Members(2, 0), "worker-0")
    assert [i.slot for i in drop] == ["worker-2"]
    assert [(c.slot.name, c.spot, c.after) for c in create] == [("worker-0", True, None)]
    assert empty == ("worker-2",)  # its VM drains and goes: the world re-forms without it


def test_assign_creates_in_the_rendezvous_slot_once_its_vm_is_gone() -> None:
    slots = _slots(3)
    live = {"worker-0": _inst(0, True), "worker-1": _inst(1, True)}
    drop, create, empty = assign(slots, live, [], Members(0, 2), "worker-0")
    assert sorted(i.slot for i in drop) == ["worker-0", "worker-1"]
    assert [(c.slot.name, c.after) for c in create] == [("worker-0", "j-worker-0-0"), ("worker-2", None)]


def test_the_local_provider_counts_spot_vms_and_revokes_the_highest_ranks(tmp_path: Path) -> None:
    """A 16-node trace replayed: the job's spot VMs take ranks 1, 2, ...; a create beyond the count is refused, and a
    drop of the count revokes the VMs ranked above it (at that tick), the lower ones ride on."""
    from orchestrator.model.availability import AvailabilityTrace
    from orchestrator.model.cloud_errors import CapacityError
    from orchestrator.model.instances import InstanceRequest
    from orchestrator.providers.local.provider import LocalProvider

    trace = AvailabilityTrace(name="counts", gap_s=600.0, counts=(2, 2, 1, 1, 0) + (3,) * 20)
    provider = LocalProvider(tmp_path, time_scale=60.0, availability=trace)
    slots = _slots(3)
    assert provider.spot_capacity_count("j", slots) == 2

    def create(index: int) -> dict[str, object]:
        provider.create(InstanceRequest(name=f"j-worker-{index}-0", job_id="j", role=Role.WORKER, index=index,
                                        generation=0, zone="local", machine_type="local", spot=True, gpu="v100",
                                        gpu_count=1, price_per_hour=SPOT, metadata={}))
        record = provider.history(f"j-worker-{index}-0")
        assert record is not None
        return record

    try:
        first, second = create(0), create(1)
        with pytest.raises(CapacityError, match="2 spot VMs, 2 held by the job"):
            create(2)
        origin = float(first["created_at"])  # type: ignore[arg-type]
        assert (first["spot_rank"], second["spot_rank"]) == (1, 2)
        assert float(second["revoke_at"]) == pytest.approx(origin + 2 * 10.0, abs=0.5)  # type: ignore[arg-type]
        assert float(first["revoke_at"]) == pytest.approx(origin + 4 * 10.0, abs=0.5)  # type: ignore[arg-type]
    finally:
        for index in (0, 1):
            provider.delete(f"j-worker-{index}-0", "local")


def test_report_shows_a_multi_worker_jobs_memberships() -> None:
    from orchestrator.cli.deadline_report import MIXED, memberships, segments
    from orchestrator.cli.plots import Bar

    def bar(slot: int, spot: bool, start: float, end: float, revoked: float | None = None) -> Bar:
        return Bar(f"worker-{slot}", f"j-worker-{slot}", "v100", spot, start, end, SPOT, OD, revoked, False, False)

    bars = [bar(0, True, 0.2, 60.0), bar(1, True, 0.3, 30.0, revoked=25.0), bar(1, False, 25.5, 60.0),
            bar(2, True, 0.3, 40.0, revoked=40.0)]
    assert memberships(bars, 100.0) == [(0.0, 25.5, 3, 0), (25.5, 40.0, 2, 1), (40.0, 60.0, 1, 1),
                                        (60.0, 100.0, 0, 0)]
    assert [m for _, _, m in segments(bars, 100.0)] == ["spot", MIXED, MIXED, "waiting"]
