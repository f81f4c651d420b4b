"""reconcile(job, observation, now) -> actions. Pure: no I/O, so every scenario is a plain unit test.

One pass moves each instance at most one step along the transition table; the driver runs passes
every second or so, and a pass repeated after a crash asks for nothing twice (creates are idempotent by
name, status switches to the same status are no-ops).
"""

from __future__ import annotations

from collections import defaultdict

from orchestrator.control.actions import (
    Action,
    CreateInstance,
    DeleteInstance,
    PrepareInstance,
    RecordLogTail,
    RestartTraining,
    SetInstanceStatus,
    SetJobStatus,
    StartTask,
)
from orchestrator.control.blocks import prefer_unblocked
from orchestrator.control.exits import EXIT_FATAL, FATAL_RETRIES, Exit, classify
from orchestrator.control.state import InstanceView, JobView, Observation
from orchestrator.providers.base import ObservedState, Role
from orchestrator.slots import Slot
from orchestrator.spec import OnRevocation, TrainingMode
from orchestrator.store.status import (
    FINAL_JOB,
    INSTANCE_TIMEOUT_S,
    LIVE_INSTANCE,
    EndReason,
    InstanceStatus,
    JobStatus,
)
from orchestrator.transport.base import ProcState, ProcStatus

S = InstanceStatus
REVOKED_GRACE_S = 60.0  # keep a revoked instance through its notice window so the chief can checkpoint
CREATE_RETRY_S = 10.0  # after every zone was out of capacity, wait before asking again
CREATE_REISSUE_S = 15.0  # a REQUESTED instance not seen for this long gets its (idempotent) create again
MAX_CREATE_FAILURES = 5  # per slot, then the job fails: no capacity anywhere we may go
EXTRA_RESTARTS = 5  # whole-cluster restarts allowed beyond max_replacements (process crashes)


def reconcile(job: JobView, obs: Observation, now: float) -> list[Action]:
    if job.status in FINAL_JOB:
        return []
    if job.status == JobStatus.TEARING_DOWN:
        return _teardown(job, obs, now)
    end = _decide_end(job, obs, now)
    if end is not None:
        return [end]
    acts: list[Action] = []
    if job.status == JobStatus.PENDING:
        acts.append(SetJobStatus(JobStatus.PROVISIONING, "launch"))
    status = {i.name: i.status for i in job.instances}
    slots = {s.name: s for s in job.slots}
    lost: dict[str, str] = {}  # slot -> why, for instances lost in this pass

    def mark(inst: InstanceView, new: InstanceStatus, reason: str, end_reason: EndReason | None = None) -> None:
        acts.append(SetInstanceStatus(inst.name, new, reason, end_reason))
        status[inst.name] = new

    # 1. Each recorded instance against what the provider reports.
    for inst in job.instances:
        o = obs.instances.get(inst.name)
        st = inst.status
        if st == S.DELETED:
            continue
        if st == S.DELETING:
            if o is None:
                mark(inst, S.DELETED, "deletion confirmed")
            elif now - inst.updated_at > INSTANCE_TIMEOUT_S[S.DELETING]:
                acts.append(DeleteInstance(inst.name, inst.zone, "delete timed out; asking again"))
            continue
        if st in (S.REVOKED, S.LOST, S.FAILED):
            in_window = (st == S.REVOKED and o is not None and o.state != ObservedState.TERMINATED
                         and now - (inst.revoked_at or inst.updated_at) < REVOKED_GRACE_S)
            if not in_window:
                acts.append(DeleteInstance(inst.name, inst.zone, f"clean up {st.value} instance"))
                status[inst.name] = S.DELETING
            continue
        noticed = inst.name in obs.notices
        if o is None:
            if st == S.REQUESTED:
                if now - inst.updated_at > INSTANCE_TIMEOUT_S[S.REQUESTED]:
                    mark(inst, S.FAILED, "never appeared after the create request", EndReason.CREATE_FAILED)
                elif now - inst.updated_at > CREATE_REISSUE_S and inst.slot in slots:
                    # Intent recorded but nothing exists: the controller may have died before the call.
                    # Creating again is safe: the name is deterministic and the create idempotent.
                    acts.append(CreateInstance(slots[inst.slot], inst.generation, inst.spot, (inst.zone,), inst.port,
                                               "create again: intent recorded, no instance seen"))
                continue
            if inst.spot and noticed:
                mark(inst, S.REVOKED, "preempted: notice, then the instance was gone", EndReason.PREEMPTED)
            else:
                mark(inst, S.LOST, "instance disappeared without a delete from us", EndReason.LOST)
            lost[inst.slot] = f"{inst.name} {status[inst.name].value}"
            continue
        if noticed or o.state in (ObservedState.STOPPING, ObservedState.TERMINATED):
            if inst.spot or o.preempted:
                why = "preemption notice" if noticed and o.state == ObservedState.RUNNING else f"preempted ({o.state})"
                mark(inst, S.REVOKED, why, EndReason.PREEMPTED)
            else:
                mark(inst, S.LOST, f"instance {o.state.value} without a stop request", EndReason.LOST)
            lost[inst.slot] = f"{inst.name} {status[inst.name].value}"
            continue
        if o.state == ObservedState.PENDING:
            if st == S.REQUESTED:
                mark(inst, S.PROVISIONING, "create accepted")
            elif st == S.PROVISIONING and now - inst.updated_at > INSTANCE_TIMEOUT_S[S.PROVISIONING]:
                mark(inst, S.LOST, "stuck provisioning", EndReason.LOST)
                lost[inst.slot] = f"{inst.name} stuck provisioning"
            continue
        if st in (S.REQUESTED, S.PROVISIONING):
            acts.append(PrepareInstance(inst.name))
            status[inst.name] = S.READY

    # 2. Every slot needs one live instance: create, replace per the policy, or shrink.
    by_slot: dict[str, list[InstanceView]] = defaultdict(list)
    for inst in job.instances:
        by_slot[inst.slot].append(inst)
    replacements = sum(1 for i in job.instances if i.generation > 0 and i.end_reason != EndReason.CREATE_FAILED)
    shrunk: set[str] = set()
    for slot in job.slots:

        def avoid(zones: tuple[str, ...], slot: Slot = slot) -> tuple[str, ...]:
            return prefer_unblocked(zones, obs.failed_zones.get(slot.name, ()))  # persisted blocks last

        insts = sorted(by_slot.get(slot.name, []), key=lambda i: i.generation)
        if any(status[i.name] in LIVE_INSTANCE for i in insts):
            continue
        if not insts:
            acts.append(CreateInstance(slot, 0, slot.spot, avoid(slot.zones), None, "initial"))
            continue
        last = insts[-1]
        failures = sum(1 for i in insts if i.end_reason == EndReason.CREATE_FAILED)
        if last.end_reason == EndReason.CREATE_FAILED:
            if failures >= MAX_CREATE_FAILURES:
                return [SetJobStatus(JobStatus.TEARING_DOWN, f"{slot.name}: no capacity or quota in any allowed "
                                     f"zone after {failures} tries ({last.zone})", JobStatus.FAILED)]
            if now - last.updated_at < CREATE_RETRY_S:
                continue
            acts.append(CreateInstance(slot, last.generation + 1, last.spot, avoid(slot.zones), last.port,
                                       f"retry after create failure of {last.name}"))
            continue
        was_preempted = last.end_reason == EndReason.PREEMPTED
        if slot.role == Role.WORKER and job.on_revocation == OnRevocation.SHRINK and was_preempted:
            shrunk.add(slot.name)
            continue
        if replacements >= job.max_replacements:
            return acts + [SetJobStatus(JobStatus.TEARING_DOWN, f"policy.max_replacements ({job.max_replacements}) "
                                        f"reached when {last.name} was lost", JobStatus.FAILED)]
        spot = last.spot and not (was_preempted and job.on_revocation == OnRevocation.FALLBACK_ON_DEMAND)
        zones = (last.zone,) + tuple(z for z in slot.zones if z != last.zone)
        why = f"replaces {last.name} ({last.end_reason or status[last.name].value})"
        if spot != last.spot:
            why += ", on-demand fallback"
        acts.append(CreateInstance(slot, last.generation + 1, spot, avoid(zones), last.port, why))
        replacements += 1
    worker_slots = [s for s in job.slots if s.role == Role.WORKER]
    if worker_slots and all(s.name in shrunk for s in worker_slots):
        return acts + [SetJobStatus(JobStatus.TEARING_DOWN, "every worker was revoked and policy is shrink",
                                    JobStatus.FAILED)]

    # 3. Training tasks (an exit code may end the job).
    acts += _tasks(job, obs, status, lost, shrunk)
    if any(isinstance(a, SetJobStatus) and a.status == JobStatus.TEARING_DOWN for a in acts):
        return acts

    # 4. The job's own status.
    training = _training_now(job, status, shrunk, acts)
    if job.status in (JobStatus.PENDING, JobStatus.PROVISIONING) and training:
        acts.append(SetJobStatus(JobStatus.RUNNING, "every task is training"))
    elif job.status == JobStatus.RUNNING and (lost or any(isinstance(a, RestartTraining) for a in acts)):
        acts.append(SetJobStatus(JobStatus.RECOVERING, "; ".join(sorted(lost.values())) or "restarting training"))
    elif job.status == JobStatus.RECOVERING and training and not lost:
        acts.append(SetJobStatus(JobStatus.RUNNING, "recovered"))
    return acts


def _decide_end(job: JobView, obs: Observation, now: float) -> SetJobStatus | None:
    if job.cancel_requested:
        return SetJobStatus(JobStatus.TEARING_DOWN, "cancelled by the user", JobStatus.CANCELLED)
    if obs.payload_error is not None:
        return SetJobStatus(JobStatus.TEARING_DOWN, f"the payload's output is unusable: {obs.payload_error}",
                            JobStatus.FAILED)
    if obs.result is not None:
        acc = obs.result.get("accuracy")
        tail = f", accuracy {acc:.4f}" if isinstance(acc, int | float) else ""
        return SetJobStatus(JobStatus.TEARING_DOWN, f"training finished at step {obs.result.get('step')}{tail}",
                            JobStatus.SUCCEEDED)
    if job.budget_usd is not None and job.cost_usd >= job.budget_usd:
        return SetJobStatus(JobStatus.TEARING_DOWN, f"policy.budget_usd exceeded: spent ${job.cost_usd:.4f} of "
                            f"${job.budget_usd:.2f}", JobStatus.FAILED)
    if job.deadline_s is not None and job.started_at is not None and now - job.started_at > job.deadline_s:
        return SetJobStatus(JobStatus.TEARING_DOWN, f"policy.deadline of {job.deadline_s:.0f}s passed",
                            JobStatus.FAILED)
    if job.restarts > job.max_replacements + EXTRA_RESTARTS:
        return SetJobStatus(JobStatus.TEARING_DOWN, f"training restarted {job.restarts} times; giving up",
                            JobStatus.FAILED)
    return None


def _live(job: JobView, status: dict[str, InstanceStatus], role: Role | None = None) -> list[InstanceView]:
    return [i for i in job.instances if status[i.name] in LIVE_INSTANCE and (role is None or i.role == role)]


def _tasks(job: JobView, obs: Observation, status: dict[str, InstanceStatus], lost: dict[str, str],
           shrunk: set[str]) -> list[Action]:
    if job.status not in (JobStatus.PENDING, JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.RECOVERING):
        return []
    training = [i for i in _live(job, status) if status[i.name] == S.TRAINING]
    proc = {i.name: obs.procs.get(i.name) for i in training}
    ended = {n: p for n, p in proc.items() if p is not None and p.state == ProcState.EXITED}
    by_name = {i.name: i for i in training}
    verdict = _exit_verdict(job, by_name, ended)
    if verdict is not None:
        return verdict
    # A task that exited 0 is done: it is never started again (only the writer's exit ends the job).
    exited = {n: p for n, p in ended.items() if classify(p.exit_code) != Exit.DONE}
    restart_reason: str | None = None
    if job.mode == TrainingMode.ASYNC:
        critical_lost = [why for slot, why in lost.items() if not slot.startswith("worker-")]
        if critical_lost:
            restart_reason = "lost " + ", ".join(critical_lost)
        for name, p in exited.items():
            if by_name[name].role in (Role.PS, Role.CHIEF) and restart_reason is None:
                restart_reason = f"{by_name[name].slot} task exited with code {p.exit_code}"
        chief_training = any(i.role == Role.CHIEF for i in training)
        if not job.stable_addresses and chief_training and restart_reason is None:
            moved = [i.slot for i in _live(job, status, Role.WORKER) if status[i.name] == S.READY and i.generation > 0]
            if moved:
                # The chief's cluster spec names each worker's address; a new VM has a new one.
                restart_reason = f"{', '.join(moved)} came back at a new address"
    else:
        if lost and (not job.elastic or job.rdzv_slot in lost):  # elastic: torchrun shrinks the world
            restart_reason = "lost " + ", ".join(sorted(lost.values()))
        for name, p in exited.items():
            if restart_reason is None:
                restart_reason = f"{by_name[name].slot} task exited with code {p.exit_code}"
    if restart_reason is not None:
        if training or any(p.state == ProcState.RUNNING for p in obs.procs.values()):
            return [RestartTraining(restart_reason)]
        return []
    acts: list[Action] = []
    ready = [i for i in _live(job, status) if status[i.name] == S.READY]
    if job.mode == TrainingMode.ASYNC:
        for inst in ready:
            if inst.role in (Role.PS, Role.WORKER):
                acts.append(StartTask(inst.name, "start server"))
        for name, p in exited.items():  # a worker's server died but its instance lives: start it again
            if by_name[name].role == Role.WORKER:
                acts.append(StartTask(name, f"worker task exited with code {p.exit_code}; restarting it"))
        servers_up = all(
            any(i.role == s.role and i.index == s.index and status[i.name] == S.TRAINING for i in job.instances)
            for s in job.slots if s.role in (Role.PS, Role.WORKER) and s.name not in shrunk
        )
        chief_ready = [i for i in ready if i.role == Role.CHIEF]
        if chief_ready and servers_up:
            acts.append(StartTask(chief_ready[0].name, "every server is up; start the chief"))
    else:
        wanted = [s for s in job.slots if s.role == Role.WORKER and s.name not in shrunk]
        live_workers = [i for i in _live(job, status, Role.WORKER)]
        if job.elastic and any(status[i.name] == S.TRAINING for i in live_workers):
            acts += [StartTask(i.name, "joins the elastic world at the next rendezvous") for i in live_workers
                     if status[i.name] == S.READY]
        elif len(live_workers) == len(wanted) and all(status[i.name] == S.READY for i in live_workers):
            acts += [StartTask(i.name, "every worker is ready; start synchronous training") for i in live_workers]
    return acts


def _is_writer(job: JobView, inst: InstanceView) -> bool:
    """The task whose end is the job's end: the async chief, or sync worker 0."""
    if job.mode == TrainingMode.ASYNC:
        return inst.role == Role.CHIEF
    return inst.role == Role.WORKER and inst.index == 0


def _exit_verdict(job: JobView, by_name: dict[str, InstanceView], ended: dict[str, ProcStatus]) -> list[Action] | None:
    """Exit codes that decide: the writer's 0 ends the job; the fatal code gets one retry, then fails it."""
    for name, p in ended.items():
        inst = by_name[name]
        if classify(p.exit_code) == Exit.DONE and _is_writer(job, inst):
            return [SetJobStatus(JobStatus.TEARING_DOWN, f"the {inst.slot} task exited 0: training finished",
                                 JobStatus.SUCCEEDED)]
    fatal = [by_name[n] for n, p in ended.items() if classify(p.exit_code) == Exit.FATAL]
    if not fatal:
        return None
    why = f"the {fatal[0].slot} task exited with code {EXIT_FATAL} (fatal: bad input)"
    if job.fatal_exits >= FATAL_RETRIES:
        return [RecordLogTail(fatal[0].name, why),
                SetJobStatus(JobStatus.TEARING_DOWN, f"{why}, again after {job.fatal_exits} retry; "
                             "see the log_tail event", JobStatus.FAILED)]
    return [RestartTraining(f"{why}; retrying once", fatal=True)]


def _training_now(job: JobView, status: dict[str, InstanceStatus], shrunk: set[str], acts: list[Action]) -> bool:
    """True when the job is fully training as of the start of this pass (nothing restarting)."""
    if any(isinstance(a, RestartTraining | CreateInstance) for a in acts):
        return False
    needed = [s for s in job.slots if s.name not in shrunk]
    return all(
        any(i.slot == s.name and status[i.name] == S.TRAINING for i in job.instances) for s in needed
    )


def _teardown(job: JobView, obs: Observation, now: float) -> list[Action]:
    acts: list[Action] = []
    end_reason = {JobStatus.SUCCEEDED.value: EndReason.JOB_FINISHED, JobStatus.CANCELLED.value: EndReason.JOB_CANCELLED
                  }.get(job.outcome or "", EndReason.JOB_FAILED)
    remaining = 0
    for inst in job.instances:
        st = inst.status
        if st == S.DELETED:
            continue
        if st == S.DELETING:
            if inst.name not in obs.instances:
                acts.append(SetInstanceStatus(inst.name, S.DELETED, "deletion confirmed"))
                continue
            if now - inst.updated_at > INSTANCE_TIMEOUT_S[S.DELETING]:
                acts.append(DeleteInstance(inst.name, inst.zone, "delete timed out; asking again"))
        else:
            acts.append(DeleteInstance(inst.name, inst.zone, f"job {job.outcome}: tear down",
                                       end_reason if st in LIVE_INSTANCE else None))
        remaining += 1
    if remaining == 0:
        outcome = JobStatus(job.outcome or JobStatus.FAILED.value)
        acts.append(SetJobStatus(outcome, "every instance deleted"))
    return acts
