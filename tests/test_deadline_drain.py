"""A deliberate deadline hop drains the VM first (issue 23): the daemon writes the VM's notice, the job
checkpoints as on a preemption notice, and only then is the VM deleted, so a hop loses no steps."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import yaml
from test_control_poison import local_spec

from orchestrator.control import deadline
from orchestrator.control.context import JobContext
from orchestrator.control.driver import job_storage
from orchestrator.control.execute import execute
from orchestrator.control.launcher import create_job
from orchestrator.costmodel.slots import Slot
from orchestrator.decide import deadline as policy
from orchestrator.decide.actions import Action, CreateInstance, DeleteInstance, DrainInstance, SetInstanceStatus
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import DeadlineInputs, InstanceView, JobView, Observation
from orchestrator.model.instances import ObservedInstance, ObservedState, ProcState, ProcStatus, Role
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import OnRevocation, TrainingMode, validate_spec
from orchestrator.model.status import InstanceStatus, JobStatus
from orchestrator.providers.registry import backend_for
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Instance, Metric

T0 = 1_000_000.0
NAME = "j-worker-0-0"
NOTICE_S = 30.0


def _job(status: InstanceStatus = InstanceStatus.TRAINING, drained_at: float | None = None,
         checkpoint_at: float | None = None, slack_s: float = 60.0) -> JobView:
    """A spot VM training with no slack left: the policy's safety net takes on-demand (a hop); with ``slack_s``
    of an hour or more and spot there, the policy keeps it."""
    slot = Slot(Role.WORKER, 0, "v100", "gce", "z1", True, 0.9, on_demand_price_per_hour=2.5, zones=("z1",))
    vm = InstanceView(id=1, name=NAME, role=Role.WORKER, index=0, generation=0, status=status, spot=True,
                      zone="z1", port=None, requested_at=T0 - 3600, updated_at=T0 - 3000)
    inputs = DeadlineInputs(work_s=48 * 3600, done_s=4 * 3600 - 60, overhead_s=600, tick_s=600,
                            spot_usd_per_h=0.9, on_demand_usd_per_h=2.5, time_scale=1.0,
                            spot_seen=((T0 - 4 * 3600, True),),
                            drains=() if drained_at is None else ((NAME, drained_at),), checkpoint_at=checkpoint_at)
    return JobView(id="j", status=JobStatus.RUNNING, outcome=None, mode=TrainingMode.SYNC, slots=(slot,),
                   instances=(vm,), on_revocation=OnRevocation.DEADLINE, max_replacements=5, budget_usd=None,
                   deadline_s=48 * 3600 + slack_s, started_at=T0 - 4 * 3600, restarts=0, cost_usd=0.0,
                   notice_s=NOTICE_S, deadline_inputs=inputs)


def _obs(noticed: bool = False, proc: ProcState = ProcState.RUNNING) -> Observation:
    vm = ObservedInstance(NAME, "j", Role.WORKER, 0, 0, "z1", ObservedState.RUNNING, "/w", spot=True)
    return Observation(instances={NAME: vm}, procs={NAME: ProcStatus(proc, 1 if proc == ProcState.EXITED else None)},
                       notices=frozenset({NAME}) if noticed else frozenset(), spot_available=True)


def _kinds(acts: list[Action]) -> list[type]:
    return [type(a) for a in acts if isinstance(a, DrainInstance | DeleteInstance | CreateInstance)]


def test_a_hop_from_a_training_vm_drains_it_first_and_deletes_nothing_yet() -> None:
    acts = reconcile(_job(), _obs(), T0)
    drains = [a for a in acts if isinstance(a, DrainInstance)]
    assert _kinds(acts) == [DrainInstance]
    assert drains[0].name == NAME and "on-demand" in drains[0].reason


def test_the_daemons_own_notice_is_not_a_preemption_and_the_vm_trains_until_its_checkpoint() -> None:
    acts = reconcile(_job(drained_at=T0 - 2), _obs(noticed=True), T0)
    assert not any(isinstance(a, SetInstanceStatus) and a.status == InstanceStatus.REVOKED for a in acts)
    assert _kinds(acts) == []  # no second drain, no delete: the checkpoint has not come


def test_the_checkpoint_after_the_notice_lets_the_hop_go_on() -> None:
    acts = reconcile(_job(drained_at=T0 - 2, checkpoint_at=T0 - 1), _obs(noticed=True), T0)
    assert _kinds(acts) == [DeleteInstance, CreateInstance]
    create = next(a for a in acts if isinstance(a, CreateInstance))
    assert not create.spot and create.generation == 1


def test_a_checkpoint_from_before_the_notice_does_not_count() -> None:
    acts = reconcile(_job(drained_at=T0 - 2, checkpoint_at=T0 - 5), _obs(noticed=True), T0)
    assert _kinds(acts) == []


def test_without_a_checkpoint_the_hop_goes_on_after_the_notice_window_and_its_upload() -> None:
    assert _kinds(reconcile(_job(drained_at=T0 - 2 * NOTICE_S + 1), _obs(noticed=True), T0)) == []
    late = reconcile(_job(drained_at=T0 - 2 * NOTICE_S - 1), _obs(noticed=True), T0)
    assert _kinds(late) == [DeleteInstance, CreateInstance]


def test_a_vm_not_training_yet_has_nothing_to_lose_and_goes_at_once() -> None:
    acts = reconcile(_job(status=InstanceStatus.READY), _obs(), T0)
    assert _kinds(acts) == [DeleteInstance, CreateInstance]


def test_a_drained_task_that_leaves_the_world_is_not_a_failed_task() -> None:
    """PyTorch: the drained node's rank leaves after its checkpoint; within the window that exit says nothing."""
    acts = reconcile(_job(drained_at=T0 - 2), _obs(noticed=True, proc=ProcState.EXITED), T0)
    assert not any("exited" in getattr(a, "reason", "") for a in acts)


def test_a_real_preemption_of_a_drained_vm_is_still_a_preemption() -> None:
    job = _job(drained_at=T0 - 2)
    vm = ObservedInstance(NAME, "j", Role.WORKER, 0, 0, "z1", ObservedState.TERMINATED, "/w", preempted=True,
                          spot=True)
    obs = replace(_obs(noticed=True), instances={NAME: vm})
    acts = reconcile(job, obs, T0)
    assert any(isinstance(a, SetInstanceStatus) and a.status == InstanceStatus.REVOKED for a in acts)


def test_a_drain_is_never_called_off_when_the_policy_changes_its_mind() -> None:
    """The hop's drain began; by the next pass the policy would keep the VM after all (slack back, spot there). The
    job has already checkpointed on the notice (a PyTorch rank has left), and a VM kept with that old drain would
    be deleted at some later hop on the drain's checkpoint, losing the steps since: the hop completes instead,
    onto a fresh VM of the pricing the policy now wants, once the drain's checkpoint is in."""
    assert _kinds(reconcile(_job(slack_s=6 * 3600), _obs(), T0)) == []  # no drain: the policy keeps its spot VM
    waiting = reconcile(_job(drained_at=T0 - 2, slack_s=6 * 3600), _obs(noticed=True), T0)
    assert _kinds(waiting) == []  # the checkpoint has not come: the VM trains on
    acts = reconcile(_job(drained_at=T0 - 2, checkpoint_at=T0 - 1, slack_s=6 * 3600), _obs(noticed=True), T0)
    assert _kinds(acts) == [DeleteInstance, CreateInstance]
    create = next(a for a in acts if isinstance(a, CreateInstance))
    assert create.spot and create.generation == 1 and "drained for earlier" in create.reason


# ---------------------------------------------------------------- the daemon's side: record, notice, read back


def test_a_drain_is_recorded_then_noticed_and_read_back_with_the_newest_checkpoint(tmp_path: Path) -> None:
    """``DrainInstance`` as the daemon carries it out: a ``drain`` note event on the instance, then the VM's
    notice in the job's storage (what the payload checkpoints on); the next pass's deadline inputs hold the drain
    and the newest checkpoint the job reported."""
    spec_yaml = local_spec("drain", tmp_path / "runs", "sleep 600").replace(
        "spot: false", "spot: true").replace("on_revocation: replace, max_replacements: 0", "on_revocation: deadline")
    spec = validate_spec(yaml.safe_load(spec_yaml))
    user_dir()
    with open_session() as session:
        job = create_job(session, spec)
        now = time.time()
        name = f"{job.id}-worker-0-0"
        session.add(Instance(job_id=job.id, name=name, role="worker", slot_index=0, generation=0, gpu="k80",
                             machine_type="local", zone="local", spot=True, price_per_hour=0.1,
                             status=InstanceStatus.TRAINING.value, requested_at=now - 60, updated_at=now - 30))
        session.commit()
        storage = job_storage(job.storage_uri, job.id)
        ctx = JobContext(session, job, spec, [], backend_for(spec), storage, {}, lambda gpu, batch: 0.0)
        execute(ctx, [DrainInstance(name, "deadline policy: on-demand: checkpoint before the hop")])

        notice = json.loads(storage.read_text(f"notices/{name}") or "{}")
        assert notice["drain"] is True and "on-demand" in notice["reason"]
        inputs = deadline.deadline_inputs(session, job, spec, time.time())
        assert inputs is not None and inputs.drains == ((name, notice["at"]),) and inputs.checkpoint_at is None
        drained = [e for e in queries.events(session, job.id) if e.to_status == policy.DRAIN_EVENT]
        assert len(drained) == 1 and drained[0].instance_id is not None

        session.add(Metric(job_id=job.id, kind="checkpoint", worker=-1, step=7, at=notice["at"] + 0.5))
        session.commit()
        inputs = deadline.deadline_inputs(session, job, spec, time.time())
        assert inputs is not None and inputs.checkpoint_at == notice["at"] + 0.5
