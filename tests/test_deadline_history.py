"""The daemon's deadline policy learns spot capacity from before the job (issue 23): the stretches that earlier
jobs in the same spot market (cloud project, zones, GPU types) saw in the 24 h before it started, as the
simulator's policy learns from the trace's 24 h of history."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml
from test_control_poison import local_spec

from orchestrator.control import deadline
from orchestrator.control.launcher import create_job
from orchestrator.costmodel.slots import Slot
from orchestrator.decide import deadline as policy
from orchestrator.decide.actions import CreateInstance, DeleteInstance, DrainInstance
from orchestrator.decide.deadline import Mode
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import DeadlineInputs, InstanceView, JobView, Observation
from orchestrator.model.instances import ObservedInstance, ObservedState, ProcState, ProcStatus, Role
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import JobSpec, OnRevocation, TrainingMode, validate_spec
from orchestrator.model.status import InstanceStatus, JobStatus
from orchestrator.store import queries
from orchestrator.store.db import open_session

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gce-l4x4-spot.yaml"
H = 3600.0
T0 = 2_000_000.0


def gce_spec(name: str, zones: list[str]) -> JobSpec:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["name"], raw["provider"]["zones"] = name, zones
    raw["policy"].update(on_revocation="deadline", deadline="24h")
    return validate_spec(raw)


def test_the_stretches_earlier_jobs_saw_in_the_same_market_are_the_history(tmp_path: Path) -> None:
    here, elsewhere = ["us-central1-a", "us-central1-b"], ["us-central1-a", "us-east1-b"]
    user_dir()
    with open_session() as session:
        seen_before = create_job(session, gce_spec("before", list(reversed(here))))  # zone order does not matter
        other_zone = create_job(session, gce_spec("other-zone", elsewhere))
        local = create_job(session, validate_spec(yaml.safe_load(local_spec("loc", tmp_path / "runs", "true").replace(
            "on_revocation: replace, max_replacements: 0", "on_revocation: deadline"))))
        spec = gce_spec("now", here)
        job = create_job(session, spec)
        job.started_at = T0
        for at_h, what in ((-30, "spot-down"), (-25, "spot-up"),  # older than 24 h: not history
                           (-10, "spot-up"), (-9, "spot-down"), (-8.5, "spot-up"), (-6, "spot-down"),
                           (+1, "spot-up")):  # after the start: the job sees it itself
            queries.note(session, seen_before.id, what, "spot capacity", now=T0 + at_h * H)
        for j in (other_zone, local):
            for at_h, what in ((-5, "spot-up"), (-4, "spot-down"), (-1, "spot-up")):
                queries.note(session, j.id, what, "spot capacity", now=T0 + at_h * H)
        session.commit()

        inputs = deadline.deadline_inputs(session, job, spec, T0 + 60)
        assert inputs is not None
        # -10 h is where that job began to look inside the window (its stretch is cut): stretches from -9 h on
        assert inputs.spot_before == ((False, 0.5 * H), (True, 2.5 * H))
    assert deadline.spot_market(spec) == deadline.spot_market(gce_spec("x", list(reversed(here))))
    assert deadline.spot_market(validate_spec(yaml.safe_load(local_spec("l", tmp_path, "true")))) is None


def test_history_before_the_job_is_what_the_simulators_history_gives_the_policy() -> None:
    tick = 600.0
    before = ((True, 3 * H), (False, 0.5 * H), (True, 4 * H))
    changes = ((T0, True),)
    seen, age = policy.seen_during_job(changes, T0, T0 + 2 * tick, tick, H, before)
    log = policy.AvailabilityLog()
    for x in [True] * 18 + [False] * 3 + [True] * 24:  # the same stretches, tick by tick (the last one closed)
        log.add(x)
    log.add(False)
    expected = log.seen(tick / H)
    assert seen.ups[:2] == expected.ups and seen.downs == expected.downs and age == 2 * tick / H
    bare, _ = policy.seen_during_job(changes, T0, T0 + 2 * tick, tick, H)
    assert bare.ups == () and bare.downs == ()


def _on_demand_job(before: tuple[tuple[bool, float], ...]) -> tuple[JobView, Observation]:
    """Half an hour into a 48 h job with 22 h of slack, on on-demand; spot has just come back."""
    name = "j-worker-0-0"
    slot = Slot(Role.WORKER, 0, "v100", "gce", "z1", True, 0.9, on_demand_price_per_hour=2.5, zones=("z1",))
    vm = InstanceView(id=1, name=name, role=Role.WORKER, index=0, generation=0, status=InstanceStatus.TRAINING,
                      spot=False, zone="z1", port=None, requested_at=T0, updated_at=T0)
    inputs = DeadlineInputs(work_s=48 * H, done_s=0.45 * H, overhead_s=600, tick_s=600, spot_usd_per_h=0.9,
                            on_demand_usd_per_h=2.5, spot_seen=((T0, False), (T0 + 0.5 * H, True)),
                            spot_before=before)
    job = JobView(id="j", status=JobStatus.RUNNING, outcome=None, mode=TrainingMode.SYNC, slots=(slot,),
                  instances=(vm,), on_revocation=OnRevocation.DEADLINE, max_replacements=5, budget_usd=None,
                  deadline_s=70 * H, started_at=T0, restarts=0, cost_usd=0.0, notice_s=30.0, deadline_inputs=inputs)
    observed = ObservedInstance(name, "j", Role.WORKER, 0, 0, "z1", ObservedState.RUNNING, "/w", spot=False)
    return job, Observation(instances={name: observed}, procs={name: ProcStatus(ProcState.RUNNING, None)},
                            spot_available=True)


def test_the_daemon_hops_back_to_spot_at_once_when_history_says_its_stretches_are_long() -> None:
    job, obs = _on_demand_job(())
    now = T0 + 0.5 * H + 1
    hops = [a for a in reconcile(job, obs, now) if isinstance(a, DrainInstance | DeleteInstance | CreateInstance)]
    assert hops == []  # nothing seen yet: the job must first get ahead of the line (LINE_HOP)
    long_ups = tuple(x for _ in range(6) for x in ((True, 5 * H), (False, 0.5 * H)))
    job, obs = _on_demand_job(long_ups)
    acts = reconcile(job, obs, now)
    assert any(isinstance(a, DrainInstance) for a in acts)  # the hop to spot, its VM drained first
    di = job.deadline_inputs
    assert di is not None
    p = policy.Progress(elapsed_h=0.5, work_done_h=0.45, work_h=48.0, deadline_h=70.0, overhead_h=1 / 6,
                        mode=Mode.ON_DEMAND, spot_available=True, tick_h=1 / 6, spot_usd_per_h=0.9,
                        on_demand_usd_per_h=2.5)
    seen, _ = policy.seen_during_job(di.spot_seen, T0, now, 600, H, long_ups)
    assert policy.deadline_policy(p, seen) == Mode.SPOT
    assert policy.deadline_policy(replace(p, work_done_h=0.2), policy.seen_during_job(
        di.spot_seen, T0, now, 600, H)[0]) == Mode.ON_DEMAND
