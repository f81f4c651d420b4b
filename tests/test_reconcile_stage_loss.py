"""A pipeline job loses a stage: the reconciler (pure) waits for the replacement or re-partitions over the survivors,
whichever costmodel.stage_loss predicts cheaper, records the choice with both options' figures, and restarts
the survivors on the new partition once the lost instance is gone."""

from __future__ import annotations

from dataclasses import replace

from test_reconcile import inst, observed

from orchestrator.costmodel.slots import Slot
from orchestrator.decide.actions import CreateInstance, RecordStageLoss, RestartTraining, SetJobStatus, StartTask
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import InstanceView, JobView, Observation, StageLossInputs
from orchestrator.model.instances import ProcState, ProcStatus, Role
from orchestrator.model.spec import OnRevocation, TrainingMode
from orchestrator.model.status import EndReason, InstanceStatus, JobStatus

S = InstanceStatus
NOW = 10_000.0
STAGES = (  # the local pipeline example: V100 (hosts the rendezvous), spot P100, K80
    Slot(Role.WORKER, 0, "v100", "local", "z1", False, 2.48, 32, 0, on_demand_price_per_hour=2.48, zones=("z1",)),
    Slot(Role.WORKER, 1, "p100", "local", "z1", True, 0.60, 32, 1, on_demand_price_per_hour=1.60, zones=("z1",)),
    Slot(Role.WORKER, 2, "k80", "local", "z1", False, 0.45, 32, 2, on_demand_price_per_hour=0.45, zones=("z1",)),
)
NAMES = ("worker-0", "worker-1", "worker-2")


def inputs(**kw: object) -> StageLossInputs:
    base: dict[str, object] = dict(
        mode="auto", remaining_steps=200.0, full_step_s=0.85,
        survivor_step_s=(("worker-0", None), ("worker-1", 0.80), ("worker-2", 0.59)),
        replacement_s=44.0, spot_extra_s=0.0, restore_s=9.2)
    base.update(kw)
    return StageLossInputs(**base)  # type: ignore[arg-type]


def pipe_job(instances: list[InstanceView], **kw: object) -> JobView:
    base: dict[str, object] = dict(
        id="j", status=JobStatus.RUNNING, outcome=None, mode=TrainingMode.SYNC, slots=STAGES,
        instances=tuple(instances), on_revocation=OnRevocation.REPLACE, max_replacements=3, budget_usd=None,
        deadline_s=None, started_at=NOW - 1000, restarts=0, cost_usd=0.0, elastic=True, rdzv_slot="worker-0",
        stage_loss=inputs())
    base.update(kw)
    return JobView(**base)  # type: ignore[arg-type]


def obs(instances: list[InstanceView], notices: tuple[str, ...] = ()) -> Observation:
    return Observation(instances={i.name: observed(i) for i in instances},
                       procs={i.name: ProcStatus(ProcState.RUNNING) for i in instances if i.status == S.TRAINING},
                       notices=frozenset(notices))


def noticed(**kw: object) -> list[object]:
    """Every stage trains; the P100's instance gets its preemption notice."""
    insts = [inst(n, S.TRAINING, spot=n == "worker-1") for n in NAMES]
    return list(reconcile(pipe_job(insts, **kw), obs(insts, ("j-worker-1-0",)), NOW))


def test_a_cheaper_repartition_drops_the_lost_stage_and_records_both_options() -> None:
    acts = noticed()
    rec = [a for a in acts if isinstance(a, RecordStageLoss)]
    assert len(rec) == 1 and rec[0].name == "j-worker-1-0" and rec[0].action == "repartition"
    # Both options' predicted time and cost are in the event: wait 44 + 9.2 + 200 x 0.85 s on three stages.
    assert "wait 223 s, $0.2189" in rec[0].reason and "re-partition over worker-0, worker-2: 169 s" in rec[0].reason
    assert not [a for a in acts if isinstance(a, CreateInstance)]  # no replacement
    # Still in its notice window (every stage checkpoints): the survivors are not restarted yet.
    assert not [a for a in acts if isinstance(a, RestartTraining)]


def test_a_dearer_repartition_waits_for_the_replacement() -> None:
    slow = inputs(survivor_step_s=(("worker-0", None), ("worker-1", 3.0), ("worker-2", 3.0)))
    acts = noticed(stage_loss=slow)
    rec = [a for a in acts if isinstance(a, RecordStageLoss)]
    assert [r.action for r in rec] == ["wait"] and "wait for the replacement" in rec[0].reason
    creates = [a for a in acts if isinstance(a, CreateInstance)]
    assert [(c.slot.name, c.generation) for c in creates] == [("worker-1", 1)]


def test_policy_wait_or_no_pipeline_replaces_as_before() -> None:
    acts = noticed(stage_loss=None)
    assert not [a for a in acts if isinstance(a, RecordStageLoss)]
    assert [(c.slot.name, c.generation) for c in acts if isinstance(c, CreateInstance)] == [("worker-1", 1)]


def test_policy_repartition_forces_it_where_a_partition_fits() -> None:
    slow = inputs(mode="repartition", survivor_step_s=(("worker-0", None), ("worker-1", 3.0), ("worker-2", 3.0)))
    acts = noticed(stage_loss=slow)
    assert [a.action for a in acts if isinstance(a, RecordStageLoss)] == ["repartition"]
    assert not [a for a in acts if isinstance(a, CreateInstance)]
    # Nothing fits the survivors' memory: wait, whatever the policy.
    none_fits = inputs(mode="repartition", survivor_step_s=(("worker-0", None), ("worker-1", None)))
    acts = noticed(stage_loss=none_fits)
    assert [a.action for a in acts if isinstance(a, RecordStageLoss)] == ["wait"]
    assert [c.slot.name for c in acts if isinstance(c, CreateInstance)] == ["worker-1"]


def test_the_stage_hosting_the_rendezvous_is_always_replaced() -> None:
    insts = [inst(n, S.TRAINING, spot=True) for n in NAMES]
    acts = reconcile(pipe_job(insts), obs(insts, ("j-worker-0-0",)), NOW)
    assert not [a for a in acts if isinstance(a, RecordStageLoss)]
    assert [c.slot.name for c in acts if isinstance(c, CreateInstance)] == ["worker-0"]


def test_a_deadline_only_the_repartition_meets_wins_over_a_cheaper_wait() -> None:
    # Waiting is cheaper here (the survivors are slow), but only the re-partition ends before the deadline.
    slow = inputs(survivor_step_s=(("worker-0", None), ("worker-1", 1.0), ("worker-2", 1.0)),
                  replacement_s=400.0, remaining_steps=1000.0)
    acts = noticed(stage_loss=slow, deadline_s=2100.0)  # 1100 s left: wait needs 1259 s, re-partition 1009 s
    rec = [a for a in acts if isinstance(a, RecordStageLoss)]
    assert [r.action for r in rec] == ["repartition"] and "within the deadline" in rec[0].reason


def _after_decision(survivors: InstanceStatus, updated_at: float) -> tuple[JobView, Observation]:
    lost = inst("worker-1", S.DELETED, end_reason=EndReason.PREEMPTED.value)
    others = [inst(n, survivors, spot=False, updated_at=updated_at) for n in ("worker-0", "worker-2")]
    view = pipe_job([others[0], lost, others[1]], repartitioned=(("worker-1", NOW - 30),),
                    status=JobStatus.RECOVERING)
    return view, obs(others)


def test_the_survivors_restart_on_the_new_partition_once_the_lost_instance_is_gone() -> None:
    view, o = _after_decision(S.TRAINING, NOW - 50)  # training since before the decision
    acts = reconcile(view, o, NOW)
    assert [a for a in acts if isinstance(a, RestartTraining)] == [
        RestartTraining("the pipeline re-forms without worker-1: re-partitioned over the survivors")]
    assert not [a for a in acts if isinstance(a, CreateInstance)]


def test_the_lost_stage_in_its_notice_window_holds_the_restart() -> None:
    revoked = inst("worker-1", S.REVOKED, end_reason=EndReason.PREEMPTED.value, revoked_at=NOW - 5)
    others = [inst(n, S.TRAINING, spot=False) for n in ("worker-0", "worker-2")]
    view = pipe_job([others[0], revoked, others[1]], repartitioned=(("worker-1", NOW - 5),))
    acts = reconcile(view, obs([*others, revoked]), NOW)
    assert not [a for a in acts if isinstance(a, RestartTraining | CreateInstance)]


def test_restarted_survivors_start_as_a_two_stage_world_and_recover() -> None:
    view, o = _after_decision(S.READY, NOW - 10)
    acts = reconcile(view, o, NOW)
    assert sorted(a.name for a in acts if isinstance(a, StartTask)) == ["j-worker-0-0", "j-worker-2-0"]
    assert not [a for a in acts if isinstance(a, CreateInstance | RestartTraining)]
    view, o = _after_decision(S.TRAINING, NOW - 10)  # started after the decision: nothing to do, and recovered
    acts = reconcile(view, o, NOW)
    assert acts == [SetJobStatus(JobStatus.RUNNING, "recovered")]


def test_the_lost_vm_s_notice_window_delays_only_the_repartition() -> None:
    acts = noticed(stage_loss=inputs(leave_s=15.0))
    rec = [a for a in acts if isinstance(a, RecordStageLoss)]
    assert "wait 223 s" in rec[0].reason and "worker-2: 184 s" in rec[0].reason  # 15 + 9.2 + 200 x 0.8


def test_the_decision_uses_the_replacement_s_spot_price_and_boot() -> None:
    view = pipe_job([inst(n, S.TRAINING, spot=n == "worker-1") for n in NAMES])
    extra = replace(view, stage_loss=inputs(spot_extra_s=15.0))
    acts = reconcile(extra, obs(list(view.instances), ("j-worker-1-0",)), NOW)
    rec = [a for a in acts if isinstance(a, RecordStageLoss)]
    assert "wait 238 s" in rec[0].reason  # 44 + 15 + 9.2 + 170
