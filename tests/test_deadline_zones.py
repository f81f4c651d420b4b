"""The deadline policy holding several zones (issue 23, item 2): where the provider says which zones have spot
(GCE's advice asked zone by zone), the daemon runs spot in ``decide.deadline.choose_zone``'s zone and decides from that
zone's stretches, as the simulator's ``deadline-zones`` does (``sim.multizone``), pass for tick; and a daemon
started later reads each zone's stretches back from the note events."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from orchestrator.costmodel.slots import Slot
from orchestrator.decide import deadline_zones
from orchestrator.decide.actions import (
    CreateInstance,
)
from orchestrator.decide.deadline import Mode
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import DeadlineInputs, InstanceView, JobView, Observation
from orchestrator.model.instances import ObservedInstance, ObservedState, ProcState, ProcStatus, Role
from orchestrator.model.paths import data_dir
from orchestrator.model.spec import OnRevocation, TrainingMode
from orchestrator.model.status import InstanceStatus, JobStatus
from orchestrator.sim.availability import Job, load_trace
from orchestrator.sim.daemon_replay import ReplayedDaemon
from orchestrator.sim.multizone import run_multi

TRACE = data_dir() / "spot-availability" / "aws-10-26-2022_us-west-2b_v100_1.json"
T0 = 1_000_000.0
K = 1.0  # the daemon's seconds per cloud minute (time_scale 60)
ZONES = ("z0", "z1")


class _Daemon(ReplayedDaemon):
    """``decide.reconcile`` one pass per tick over the zones' traces: a spot VM is preempted where its zone's trace
    drops, a create starts at once in its first zone, progress as the simulator counts it, a drained VM
    checkpoints at once and the next pass follows within the tick. The note events the daemon would record are
    kept as the DB keeps them, and read back as ``control.deadline`` does."""

    def __init__(self, job: Job, tick: int) -> None:
        super().__init__()
        self.job, self.tick = job, tick
        self.slot = Slot(Role.WORKER, 0, "v100", "gce", "z0", True, job.spot_usd_per_h,
                         on_demand_price_per_hour=job.on_demand_usd_per_h, zones=ZONES)

    def inputs(self, w: int) -> DeadlineInputs:
        job = self.job
        return DeadlineInputs(work_s=K * job.work_min, done_s=K * w, overhead_s=K * job.overhead_min,
                              tick_s=K * self.tick, spot_usd_per_h=job.spot_usd_per_h,
                              on_demand_usd_per_h=job.on_demand_usd_per_h, time_scale=60.0 / K, **self.seen())

    def pass_(self, now: float, w: int, up: dict[str, bool]) -> bool:
        """One pass; True when it drained a VM (the next pass follows within the tick)."""
        return self.pass_over(self.slot, K * self.job.deadline_min, T0, self.inputs(w), lambda v: not up[v.zone],
                              now, ZONES, spot_available=any(up.values()), spot_by_zone=dict(up), spot_forecast=True)

    def running(self) -> str:
        on = self.training()
        if not on:
            return Mode.IDLE.value
        return f"spot@{ZONES.index(on[0].zone)}" if on[0].spot else Mode.ON_DEMAND.value


def _daemon_timeline(job: Job, avails: tuple[tuple[bool, ...], ...], tick: int) -> list[tuple[float, str]]:
    daemon = _Daemon(job, tick)
    t, w, r, i, shown = 0, 0, 0, 0, Mode.IDLE.value
    timeline: list[tuple[float, str]] = []
    while True:
        up = {z: i < len(a) and a[i] for z, a in zip(ZONES, avails, strict=True)}
        if daemon.pass_(T0 + K * t, w, up):
            daemon.pass_(T0 + K * t + 1.0, w, up)
        label = daemon.running()
        if not timeline or timeline[-1][1] != label:
            timeline.append((t, label))
        r = r if label == shown else (job.overhead_min if label != Mode.IDLE.value else 0)
        shown = label
        if label != Mode.IDLE.value and r + job.work_min - w <= tick:
            timeline.append((t + r + job.work_min - w, "done"))
            return timeline
        if label != Mode.IDLE.value:
            w, r = w + max(0, tick - r), max(0, r - tick)
        t, i = t + tick, i + 1


@pytest.mark.parametrize("start", [300, 1990, 2243])
@pytest.mark.parametrize(("work_h", "deadline_h", "overhead_min"), [(12, 14, 3), (12, 20, 8)])
def test_the_daemon_makes_the_zones_simulators_decisions(start: int, work_h: int, deadline_h: int,
                                                         overhead_min: int) -> None:
    """Two zones: the shipped trace, and the same trace 500 ticks on (its real stretches, at another phase)."""
    trace = load_trace(TRACE)
    a = trace.available()
    avails = (a[start:], a[start + 500:])
    job = Job(work_h * 60, deadline_h * 60, overhead_min, 0.861, 2.144)
    sim = run_multi(job, avails, trace.tick_min)
    assert sim.deadline_met
    daemon = _daemon_timeline(job, avails, trace.tick_min)
    assert daemon == sim.timeline
    assert {label for _, label in daemon} >= {"spot@0", "spot@1"}  # it moved between the zones


def test_a_fresh_start_takes_the_zone_whose_stretch_is_expected_to_last_longest() -> None:
    """40 h into the job both zones have spot again, for the last 30 minutes; z1's stretches have lasted 10 h
    where z0's lasted 1 h: the spot VM is asked for in z1 first (z0 after it, should the create be refused),
    though the spec lists z0 first."""
    slot = Slot(Role.WORKER, 0, "v100", "gce", "z0", True, 0.9, on_demand_price_per_hour=2.5, zones=ZONES)
    hour = 3600.0

    def stretches(up_h: float) -> tuple[tuple[float, bool], ...]:
        """Up ``up_h`` hours, then out for one, over and over, and up again since 30 minutes ago."""
        changes, at = [(T0 - 0.5 * hour, True)], T0 - 0.5 * hour
        while at - 1 * hour - up_h * hour > T0 - 40 * hour:
            at -= 1 * hour
            changes.append((at, False))
            at -= up_h * hour
            changes.append((at, True))
        return tuple(reversed(changes))

    inputs = DeadlineInputs(work_s=48 * hour, done_s=30 * hour, overhead_s=600, tick_s=600, spot_usd_per_h=0.9,
                            on_demand_usd_per_h=2.5, spot_seen=((T0 - 40 * hour, True),),
                            zone_spot_seen=(("z0", stretches(1.0)), ("z1", stretches(10.0))))
    swapped = replace(inputs, zone_spot_seen=(("z0", stretches(10.0)), ("z1", stretches(1.0))))
    view = JobView(id="j", status=JobStatus.PROVISIONING, outcome=None, mode=TrainingMode.SYNC, slots=(slot,),
                   instances=(), on_revocation=OnRevocation.DEADLINE, max_replacements=5, budget_usd=None,
                   deadline_s=80 * hour, started_at=T0 - 40 * hour, restarts=0, cost_usd=0.0,
                   deadline_inputs=inputs, zones=ZONES)
    obs = Observation(instances={}, procs={}, spot_available=True, spot_by_zone={"z0": True, "z1": True},
                      spot_forecast=True)
    creates = [a for a in reconcile(view, obs, T0) if isinstance(a, CreateInstance)]
    assert [(c.spot, c.zones) for c in creates] == [(True, ("z1", "z0"))]
    assert "in z1" in creates[0].reason
    view_swapped = replace(view, deadline_inputs=swapped)  # the stretches decide, not the zones' names
    assert [c.zones for c in reconcile(view_swapped, obs, T0) if isinstance(c, CreateInstance)] == [ZONES]
    # the provider does not say by zone: the spec's order, as before
    plain = Observation(instances={}, procs={}, spot_available=True, spot_forecast=True)
    assert [c.zones for c in reconcile(view, plain, T0) if isinstance(c, CreateInstance)] == [ZONES]


def test_zone_notes_read_back_as_each_zones_changes_through_deadline_inputs() -> None:
    """What a daemon started later reads (real SQLite): the job's zone notes, zone by zone, oldest first, and the
    any-zone notes apart from them, as ``control.deadline`` puts them in the policy's inputs."""
    from test_deadline_history import gce_spec

    from orchestrator.control.deadline import deadline_inputs
    from orchestrator.control.launcher import create_job
    from orchestrator.decide.deadline import SPOT_SEEN_EVENTS, ZONE_SEEN_EVENTS
    from orchestrator.model.paths import user_dir
    from orchestrator.store import queries
    from orchestrator.store.db import open_session

    user_dir()
    spec = gce_spec("zones", ["us-central1-a", "us-central1-b"])
    with open_session() as session:
        job = create_job(session, spec)
        job.started_at = T0
        for at, zone, up in ((1.0, "us-central1-b", True), (1.0, "us-central1-a", False), (2.0, None, True),
                             (3.0, "us-central1-b", False)):
            kind = (SPOT_SEEN_EVENTS if zone is None else ZONE_SEEN_EVENTS)[up]
            reason = "spot capacity there" if zone is None else deadline_zones.zone_reason(zone, up)
            queries.note(session, job.id, kind, reason, now=T0 + at)
        session.commit()
        inputs = deadline_inputs(session, job, spec, T0 + 60)
    assert inputs is not None
    assert inputs.zone_spot_seen == (("us-central1-a", ((T0 + 1, False),)),
                                     ("us-central1-b", ((T0 + 1, True), (T0 + 3, False))))
    assert inputs.spot_seen == ((T0 + 2, True),)


def test_a_zone_that_just_preempted_the_vm_is_not_chosen_whatever_the_forecast_says() -> None:
    """The advisor's score is a forecast: a spot VM preempted in z0 this pass means z0 has no spot now, so the
    replacement is asked for in z1 first although the advisor still scores z0 as there."""
    slot = Slot(Role.WORKER, 0, "v100", "gce", "z0", True, 0.9, on_demand_price_per_hour=2.5, zones=ZONES)
    vm = InstanceView(id=1, name="j-worker-0-0", role=Role.WORKER, index=0, generation=0,
                      status=InstanceStatus.TRAINING, spot=True, zone="z0", port=None, requested_at=T0 - 3600,
                      updated_at=T0 - 3000)
    inputs = DeadlineInputs(work_s=48 * 3600, done_s=3.9 * 3600, overhead_s=600, tick_s=600, spot_usd_per_h=0.9,
                            on_demand_usd_per_h=2.5, spot_seen=((T0 - 4 * 3600, True),),
                            zone_spot_seen=(("z0", ((T0 - 4 * 3600, True),)), ("z1", ((T0 - 4 * 3600, True),))))
    view = JobView(id="j", status=JobStatus.RUNNING, outcome=None, mode=TrainingMode.SYNC, slots=(slot,),
                   instances=(vm,), on_revocation=OnRevocation.DEADLINE, max_replacements=5, budget_usd=None,
                   deadline_s=60 * 3600, started_at=T0 - 4 * 3600, restarts=0, cost_usd=0.0,
                   deadline_inputs=inputs, zones=ZONES)
    obs = Observation(instances={vm.name: ObservedInstance(vm.name, "j", vm.role, 0, 0, "z0",
                                                           ObservedState.TERMINATED, "/w", preempted=True)},
                      procs={vm.name: ProcStatus(ProcState.RUNNING)}, spot_available=True,
                      spot_by_zone={"z0": True, "z1": True}, spot_forecast=True)
    creates = [a for a in reconcile(view, obs, T0) if isinstance(a, CreateInstance)]
    assert [(c.spot, c.zones) for c in creates] == [(True, ("z1", "z0"))]


TRACES = data_dir() / "spot-availability"


@pytest.mark.parametrize(("provider", "problem"), [
    ({"availability_trace": "a.json", "zone_availability_traces": {"x": "a.json", "y": "b.json"}},
     "not both"),
    ({"zone_availability_traces": {"x": "a.json"}}, "names one zone"),
    ({"zone_availability_traces": {"x": "a.json", "y": "missing.json"}}, "provider.zone_availability_traces.y"),
    ({"zone_availability_traces": {"x": "a.json", "y": "slow.json"}}, "one tick length"),
    ({"zone_availability_traces": {"x": "a.json", "y": "b.json"}, "availability_start_tick": 5000},
     "past the end of provider.zone_availability_traces.x"),
    ({"zone_availability_traces": {"x": "a.json", "y": "b.json"}, "revocations": "model"}, "revocations: none"),
    ({"zone_availability_traces": {"X:": "a.json", "y": "b.json"}}, "zone_availability_traces"),
])
def test_zone_traces_are_checked_before_anything_runs(tmp_path: Path, provider: dict[str, object],
                                                     problem: str) -> None:
    import json

    from orchestrator.model.spec import load_spec
    from orchestrator.model.spec.base import SpecError

    for name, src in (("a.json", "aws-10-26-2022_us-west-2b_v100_1.json"),
                      ("b.json", "aws-10-26-2022_us-west-2a_v100_1.json")):
        (tmp_path / name).write_text((TRACES / src).read_text())
    slow = json.loads((TRACES / "aws-10-26-2022_us-west-2a_v100_1.json").read_text())
    slow["metadata"]["gap_seconds"] = 1200
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    spec = {"name": "z", "provider": {"kind": "local", "revocations": "none", **provider},
            "cluster": {"workers": [{"gpu": "v100", "count": 1, "spot": True}]},
            "policy": {"on_revocation": "deadline", "deadline": "10m"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path / "job.yaml")
    assert problem in str(err.value)


def test_zone_traces_give_the_slots_their_zones(tmp_path: Path) -> None:
    from orchestrator.costmodel.slots import expand
    from orchestrator.model.spec import load_spec

    spec = {"name": "z", "provider": {"kind": "local", "revocations": "none", "zone_availability_traces": {
        "zone-a": str(TRACES / "aws-10-26-2022_us-west-2b_v100_1.json"),
        "zone-b": str(TRACES / "aws-10-26-2022_us-west-2a_v100_1.json")}},
        "cluster": {"workers": [{"gpu": "v100", "count": 2, "spot": True}]}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    assert {s.zones for s in expand(load_spec(tmp_path / "job.yaml")) if s.gpu} == {("zone-a", "zone-b")}


def test_plans_zones_row_is_the_one_zone_deadline_row_when_the_zones_are_one_trace() -> None:
    """``plan``'s deadline-zones row (``sim.multizone.zones_outlook``) replays the same start ticks as the other
    rows; with both zones replaying the same trace it is the one-zone deadline row, run for run."""
    from orchestrator.sim.availability import outlook
    from orchestrator.sim.multizone import zones_outlook

    trace = load_trace(TRACE)
    job = Job(12 * 60, 16 * 60, 12, 0.861, 2.144)
    one = {o.policy: o for o in outlook(job, [trace], starts=6)}["deadline"]
    both = zones_outlook(job, [trace, trace], starts=6)
    assert (both.policy, both.runs) == ("deadline-zones", one.runs)
    assert both.mean_cost_usd == pytest.approx(one.mean_cost_usd)
    assert both.p_deadline_met == one.p_deadline_met


def test_plan_shows_the_zones_row_for_a_spec_that_replays_several_zones(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    example = Path(__file__).resolve().parent.parent / "examples" / "local-deadline-zones.yaml"
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "plan", str(example), "--json"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "ORCHESTRATOR_HOME": str(tmp_path / "home"),
                              "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/r.db"})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["policy"]: r for r in json.loads(out.stdout)["deadline_policies"]["policies"]}
    assert set(rows) == {"on-demand", "greedy", "uniform-progress", "deadline", "deadline-zones"}
    assert rows["deadline-zones"]["runs"] * 2 == rows["deadline"]["runs"]  # both zones at once, from each start
    assert rows["deadline-zones"]["p_deadline_met"] == 1.0
