"""The reconciler is pure: every revocation, stockout and restart scenario is a plain unit test."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.costmodel.slots import Slot
from orchestrator.decide.actions import (
    CreateInstance,
    DeleteInstance,
    PrepareInstance,
    RestartTraining,
    SetInstanceStatus,
    SetJobStatus,
    StartTask,
)
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import InstanceView, JobView, Observation
from orchestrator.model.instances import ObservedInstance, ObservedState, ProcState, ProcStatus, Role
from orchestrator.model.spec import OnRevocation, TrainingMode
from orchestrator.model.status import EndReason, InstanceStatus, JobStatus

S = InstanceStatus
NOW = 10_000.0
SLOTS = (
    Slot(Role.PS, 0, None, "local", "z1", False, 0.1, on_demand_price_per_hour=0.1, zones=("z1",)),
    Slot(Role.CHIEF, 0, None, "local", "z1", False, 0.1, on_demand_price_per_hour=0.1, zones=("z1",)),
    Slot(Role.WORKER, 0, "k80", "local", "z1", True, 0.25, 32, 0, on_demand_price_per_hour=0.7, zones=("z1", "z2")),
    Slot(Role.WORKER, 1, "v100", "local", "z1", True, 0.86, 32, 1, on_demand_price_per_hour=2.1, zones=("z1", "z2")),
)


def inst(slot: str, status: InstanceStatus, gen: int = 0, spot: bool | None = None, **kw: object) -> InstanceView:
    role, index = slot.split("-")
    base = dict(
        id=hash((slot, gen)) % 10_000,
        name=f"j-{slot}-{gen}",
        role=Role(role),
        index=int(index),
        generation=gen,
        status=status,
        spot=role == "worker" if spot is None else spot,
        zone="z1",
        port=5000 + int(index),
        requested_at=NOW - 100,
        updated_at=NOW - 50,
    )
    base.update(kw)
    return InstanceView(**base)  # type: ignore[arg-type]


def observed(
    i: InstanceView, state: ObservedState = ObservedState.RUNNING, preempted: bool = False
) -> ObservedInstance:
    return ObservedInstance(
        name=i.name,
        job_id="j",
        role=i.role,
        index=i.index,
        generation=i.generation,
        zone=i.zone,
        state=state,
        workdir="/tmp/x",
        preempted=preempted,
    )


def job(instances: list[InstanceView], status: JobStatus = JobStatus.RUNNING, **kw: object) -> JobView:
    base = dict(
        id="j",
        status=status,
        outcome=None,
        mode=TrainingMode.ASYNC,
        slots=SLOTS,
        instances=tuple(instances),
        on_revocation=OnRevocation.REPLACE,
        max_replacements=5,
        budget_usd=None,
        deadline_s=None,
        started_at=NOW - 1000,
        restarts=0,
        cost_usd=0.0,
    )
    base.update(kw)
    return JobView(**base)  # type: ignore[arg-type]


def training_cluster() -> list[InstanceView]:
    return [inst(s, S.TRAINING) for s in ("ps-0", "chief-0", "worker-0", "worker-1")]


def running_obs(instances: list[InstanceView], **kw: object) -> Observation:
    return Observation(
        instances={i.name: observed(i) for i in instances},
        procs={i.name: ProcStatus(ProcState.RUNNING) for i in instances},
        **kw,
    )  # type: ignore[arg-type]


def test_fresh_job_creates_every_slot() -> None:
    acts = reconcile(job([], JobStatus.PENDING), Observation(instances={}, procs={}), NOW)
    assert acts[0] == SetJobStatus(JobStatus.PROVISIONING, "launch")
    creates = [a for a in acts if isinstance(a, CreateInstance)]
    assert [(c.slot.name, c.generation, c.spot) for c in creates] == [
        ("ps-0", 0, False),
        ("chief-0", 0, False),
        ("worker-0", 0, True),
        ("worker-1", 0, True),
    ]
    assert creates[2].zones == ("z1", "z2")  # stockout fallback order


def test_steady_state_asks_for_nothing() -> None:
    cluster = training_cluster()
    assert reconcile(job(cluster), running_obs(cluster), NOW) == []


def test_running_instances_are_prepared_then_servers_start_then_chief() -> None:
    cluster = [inst(s, S.PROVISIONING) for s in ("ps-0", "chief-0", "worker-0", "worker-1")]
    acts = reconcile(job(cluster, JobStatus.PROVISIONING), running_obs(cluster), NOW)
    assert [a for a in acts if isinstance(a, PrepareInstance)] == [PrepareInstance(i.name) for i in cluster]
    ready = [replace(i, status=S.READY) for i in cluster]
    acts = reconcile(job(ready, JobStatus.PROVISIONING), running_obs(ready), NOW)
    started = [a.name for a in acts if isinstance(a, StartTask)]
    assert started == ["j-ps-0-0", "j-worker-0-0", "j-worker-1-0"]  # chief waits for the servers
    servers_up = [replace(i, status=S.TRAINING) if i.role != Role.CHIEF else i for i in ready]
    acts = reconcile(job(servers_up, JobStatus.PROVISIONING), running_obs(servers_up), NOW)
    assert [a.name for a in acts if isinstance(a, StartTask)] == ["j-chief-0-0"]


def test_worker_revocation_replaces_only_that_worker_and_training_continues() -> None:
    cluster = training_cluster()
    obs = running_obs(cluster)
    obs.instances["j-worker-1-0"] = observed(cluster[3], ObservedState.STOPPING, preempted=True)
    acts = reconcile(job(cluster), obs, NOW)
    assert SetInstanceStatus("j-worker-1-0", S.REVOKED, "preempted (stopping)", EndReason.PREEMPTED) in acts
    creates = [a for a in acts if isinstance(a, CreateInstance)]
    assert len(creates) == 1 and creates[0].slot.name == "worker-1" and creates[0].generation == 1
    assert creates[0].port == 5001 and creates[0].spot  # same address, same pricing
    assert not any(isinstance(a, RestartTraining) for a in acts)  # async: the chief keeps going
    assert any(isinstance(a, SetJobStatus) and a.status == JobStatus.RECOVERING for a in acts)


def test_notice_is_detected_before_the_instance_stops() -> None:
    cluster = training_cluster()
    acts = reconcile(job(cluster), replace(running_obs(cluster), notices=frozenset({"j-worker-0-0"})), NOW)
    assert SetInstanceStatus("j-worker-0-0", S.REVOKED, "preemption notice", EndReason.PREEMPTED) in acts


def test_revoked_instance_is_kept_through_the_notice_window_then_deleted() -> None:
    revoked = inst("worker-0", S.REVOKED, revoked_at=NOW - 5, end_reason="preempted")
    others = [inst(s, S.TRAINING) for s in ("ps-0", "chief-0", "worker-1")]
    replacement = inst("worker-0", S.PROVISIONING, gen=1)
    cluster = others + [revoked, replacement]
    obs = running_obs(cluster)
    obs.instances[revoked.name] = observed(revoked, ObservedState.STOPPING, preempted=True)
    obs.instances[replacement.name] = observed(replacement, ObservedState.PENDING)
    acts = reconcile(job(cluster, JobStatus.RECOVERING), obs, NOW)
    assert not any(isinstance(a, DeleteInstance) for a in acts)
    obs.instances[revoked.name] = observed(revoked, ObservedState.TERMINATED, preempted=True)
    acts = reconcile(job(cluster, JobStatus.RECOVERING), obs, NOW)
    assert DeleteInstance(revoked.name, "z1", "clean up revoked instance") in acts


def test_ps_loss_restarts_training_from_checkpoint() -> None:
    cluster = training_cluster()
    obs = running_obs(cluster)
    del obs.instances["j-ps-0-0"]
    acts = reconcile(job(cluster), obs, NOW)
    assert (
        SetInstanceStatus("j-ps-0-0", S.LOST, "instance disappeared without a delete from us", EndReason.LOST) in acts
    )
    assert any(isinstance(a, RestartTraining) for a in acts)
    assert any(isinstance(a, CreateInstance) and a.slot.name == "ps-0" for a in acts)


def test_chief_crash_restarts_training() -> None:
    cluster = training_cluster()
    obs = running_obs(cluster)
    obs.procs["j-chief-0-0"] = ProcStatus(ProcState.EXITED, 3)
    acts = reconcile(job(cluster), obs, NOW)
    assert acts[0] == RestartTraining("chief-0 task exited with code 3")


def test_sync_mode_restarts_everyone_when_a_worker_is_lost() -> None:
    slots = tuple(s for s in SLOTS if s.role == Role.WORKER)
    cluster = [inst("worker-0", S.TRAINING), inst("worker-1", S.TRAINING)]
    obs = running_obs(cluster)
    obs.instances["j-worker-0-0"] = observed(cluster[0], ObservedState.TERMINATED, preempted=True)
    acts = reconcile(job(cluster, mode=TrainingMode.SYNC, slots=slots), obs, NOW)
    assert any(isinstance(a, RestartTraining) for a in acts)
    # once the replacement is ready, every worker starts together
    ready = [inst("worker-0", S.READY, gen=1), inst("worker-1", S.READY)]
    old = inst("worker-0", S.DELETED, end_reason="preempted")
    acts = reconcile(
        job(ready + [old], mode=TrainingMode.SYNC, slots=slots, status=JobStatus.RECOVERING), running_obs(ready), NOW
    )
    assert sorted(a.name for a in acts if isinstance(a, StartTask)) == ["j-worker-0-1", "j-worker-1-0"]


def test_shrink_policy_never_replaces_workers() -> None:
    cluster = training_cluster()[:3] + [inst("worker-1", S.DELETED, end_reason="preempted")]
    acts = reconcile(job(cluster, on_revocation=OnRevocation.SHRINK), running_obs(cluster[:3]), NOW)
    assert not any(isinstance(a, CreateInstance) for a in acts)
    gone = [inst("worker-0", S.DELETED, end_reason="preempted"), inst("worker-1", S.DELETED, end_reason="preempted")]
    acts = reconcile(
        job(training_cluster()[:2] + gone, on_revocation=OnRevocation.SHRINK), running_obs(training_cluster()[:2]), NOW
    )
    assert acts[-1].status == JobStatus.TEARING_DOWN and acts[-1].outcome == JobStatus.FAILED  # type: ignore[union-attr]


def test_fallback_on_demand_replacement_is_not_spot() -> None:
    cluster = training_cluster()[:3] + [inst("worker-1", S.DELETED, end_reason="preempted")]
    acts = reconcile(job(cluster, on_revocation=OnRevocation.FALLBACK_ON_DEMAND), running_obs(cluster[:3]), NOW)
    (create,) = [a for a in acts if isinstance(a, CreateInstance)]
    assert create.spot is False and "on-demand fallback" in create.reason


def test_max_replacements_fails_the_job() -> None:
    cluster = training_cluster()[:3] + [inst("worker-1", S.DELETED, gen=g, end_reason="preempted") for g in range(3)]
    acts = reconcile(job(cluster, max_replacements=2), running_obs(cluster[:3]), NOW)
    assert acts[-1] == SetJobStatus(
        JobStatus.TEARING_DOWN, "policy.max_replacements (2) reached when j-worker-1-2 was lost", JobStatus.FAILED
    )


def test_create_failure_in_every_zone_is_retried_then_fails_the_job() -> None:
    failed = inst("worker-1", S.FAILED, end_reason="create_failed", updated_at=NOW - 30)
    cluster = training_cluster()[:3] + [replace(failed, status=S.DELETED)]
    acts = reconcile(job(cluster), running_obs(cluster[:3]), NOW)
    (create,) = [a for a in acts if isinstance(a, CreateInstance)]
    assert create.generation == 1
    many = training_cluster()[:3] + [replace(failed, status=S.DELETED, generation=g, name=f"f{g}") for g in range(5)]
    acts = reconcile(job(many), running_obs(many[:3]), NOW)
    assert acts[0].outcome == JobStatus.FAILED and "no capacity" in acts[0].reason  # type: ignore[union-attr]


def test_lost_create_intent_is_created_again() -> None:
    # The controller recorded "requested" and died before the call: nothing exists; create again, same name.
    cluster = training_cluster()[:3] + [inst("worker-1", S.REQUESTED, updated_at=NOW - 20)]
    acts = reconcile(job(cluster), running_obs(cluster[:3]), NOW)
    (create,) = [a for a in acts if isinstance(a, CreateInstance)]
    assert create.generation == 0 and create.slot.name == "worker-1"
    fresh = training_cluster()[:3] + [inst("worker-1", S.REQUESTED, updated_at=NOW - 1)]
    assert not any(isinstance(a, CreateInstance) for a in reconcile(job(fresh), running_obs(fresh[:3]), NOW))


def test_result_finishes_and_teardown_deletes_everything_once() -> None:
    cluster = training_cluster()
    acts = reconcile(job(cluster), replace(running_obs(cluster), result={"step": 100, "accuracy": 0.9}), NOW)
    assert acts == [
        SetJobStatus(JobStatus.TEARING_DOWN, "training finished at step 100, accuracy 0.9000", JobStatus.SUCCEEDED)
    ]
    down = job(cluster, JobStatus.TEARING_DOWN, outcome="succeeded")
    acts = reconcile(down, running_obs(cluster), NOW)
    assert sorted(a.name for a in acts if isinstance(a, DeleteInstance)) == sorted(i.name for i in cluster)
    assert all(a.end_reason == EndReason.JOB_FINISHED for a in acts if isinstance(a, DeleteInstance))
    gone = [replace(i, status=S.DELETED) for i in cluster]
    assert reconcile(job(gone, JobStatus.TEARING_DOWN, outcome="succeeded"), Observation({}, {}), NOW) == [
        SetJobStatus(JobStatus.SUCCEEDED, "every instance deleted")
    ]


def test_budget_deadline_and_cancel() -> None:
    cluster = training_cluster()
    over = reconcile(job(cluster, budget_usd=1.0, cost_usd=1.2), running_obs(cluster), NOW)
    assert over[0].outcome == JobStatus.FAILED and "budget" in over[0].reason  # type: ignore[union-attr]
    late = reconcile(job(cluster, deadline_s=100.0), running_obs(cluster), NOW)
    assert "deadline" in late[0].reason  # type: ignore[union-attr]
    cancel = reconcile(job(cluster, cancel_requested=True), running_obs(cluster), NOW)
    assert cancel[0].outcome == JobStatus.CANCELLED  # type: ignore[union-attr]


def test_deleting_confirmed_when_gone_and_retried_when_stuck() -> None:
    d = inst("worker-1", S.DELETING, updated_at=NOW - 1000)
    cluster = training_cluster()[:3] + [d]
    assert SetInstanceStatus(d.name, S.DELETED, "deletion confirmed") in reconcile(
        job(cluster), running_obs(cluster[:3]), NOW
    )
    acts = reconcile(job(cluster), running_obs(cluster), NOW)
    assert DeleteInstance(d.name, "z1", "delete timed out; asking again") in acts


def test_moved_worker_restarts_the_async_chief_on_real_clouds() -> None:
    cluster = training_cluster()[:3] + [
        inst("worker-1", S.DELETED, end_reason="preempted"),
        inst("worker-1", S.READY, gen=1),
    ]
    obs = running_obs([i for i in cluster if i.status != S.DELETED])
    stable = reconcile(job(cluster), obs, NOW)
    assert not any(isinstance(a, RestartTraining) for a in stable)
    assert StartTask("j-worker-1-1", "start server") in stable  # same address: it simply rejoins
    moved = reconcile(job(cluster, stable_addresses=False), obs, NOW)
    assert moved[0] == RestartTraining("worker-1 came back at a new address")
