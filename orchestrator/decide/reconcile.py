"""reconcile(job, observation, now) -> actions. Pure: no I/O, so every scenario is a plain unit test.

One pass moves each instance at most one step along the transition table; the driver runs passes
every second or so, and a pass repeated after a crash asks for nothing twice (creates are idempotent by
name, status switches to the same status are no-ops). Whether and how a lost instance is replaced, and
every timing, come from ``decide.deadline`` (shared with the simulator).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from orchestrator.costmodel.slots import Slot
from orchestrator.decide import deadline as policy
from orchestrator.decide import (
    deadline_elastic,
    deadline_gpus,
    deadline_markets,
    deadline_zones,
    job_end,
    stage_loss_step,
)
from orchestrator.decide import replacement as replacing
from orchestrator.decide.actions import (
    Action,
    CreateInstance,
    DeleteInstance,
    DrainInstance,
    PrepareInstance,
    RecordLogTail,
    RecordSpotAvailability,
    RecordStageLoss,
    RestartTraining,
    SetInstanceStatus,
    SetJobStatus,
    StartTask,
)
from orchestrator.decide.deadline_markets import MarketSet
from orchestrator.decide.state import InstanceView, JobView, Observation
from orchestrator.model import timings
from orchestrator.model.blocks import prefer_unblocked
from orchestrator.model.exits import EXIT_FATAL, FATAL_RETRIES, Exit, classify
from orchestrator.model.instances import ObservedInstance, ObservedState, ProcState, ProcStatus, Role
from orchestrator.model.spec import OnRevocation, TrainingMode
from orchestrator.model.status import (
    FINAL_JOB,
    INSTANCE_TIMEOUT_S,
    LIVE_INSTANCE,
    EndReason,
    InstanceStatus,
    JobStatus,
)

S = InstanceStatus
_ENDED = (S.DELETED, S.DELETING, S.REVOKED, S.LOST, S.FAILED)


@dataclass
class _Pass:
    """One pass's working state: the actions asked for so far and each instance's status as they set it."""

    job: JobView
    obs: Observation
    now: float
    acts: list[Action] = field(default_factory=list)
    status: dict[str, InstanceStatus] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)  # slot -> why, for instances lost in this pass
    lost_role: dict[str, Role] = field(default_factory=dict)
    shrunk: set[str] = field(default_factory=set)
    replacements: int = 0
    ended: dict[str, EndReason] = field(default_factory=dict)  # end reasons set in this pass, by instance name

    def mark(self, inst: InstanceView, new: InstanceStatus, reason: str, end_reason: EndReason | None = None) -> None:
        self.acts.append(SetInstanceStatus(inst.name, new, reason, end_reason))
        self.status[inst.name] = new
        if end_reason is not None:
            self.ended[inst.name] = end_reason

    @property
    def drains(self) -> dict[str, float]:
        """Instances drained before a deadline hop, and when: their notice is the daemon's, not the cloud's."""
        di = self.job.deadline_inputs
        return dict(di.drains) if di is not None else {}

    def end_reason(self, inst: InstanceView) -> str | None:
        """Why the instance ended, also when this very pass saw it go (the replacement is asked for now)."""
        return self.ended.get(inst.name, inst.end_reason)

    def lose(self, inst: InstanceView, new: InstanceStatus, reason: str, end_reason: EndReason,
             why: str | None = None) -> None:
        self.mark(inst, new, reason, end_reason)
        self.lost[inst.slot] = why or f"{inst.name} {new.value}"
        self.lost_role[inst.slot] = inst.role

    def create(self, slot: Slot, generation: int, spot: bool, zones: tuple[str, ...], port: int | None,
               reason: str) -> None:
        blocked = self.obs.failed_zones.get(slot.name, ())  # persisted blocks go last
        self.acts.append(CreateInstance(slot, generation, spot, prefer_unblocked(zones, blocked), port, reason))


def reconcile(job: JobView, obs: Observation, now: float) -> list[Action]:
    if job.status in FINAL_JOB:
        return []
    if job.status == JobStatus.TEARING_DOWN:
        return job_end.teardown(job, obs, now)
    end = job_end.decide_end(job, obs, now)
    if end is not None:
        return [end]
    p = _Pass(job, obs, now, status={i.name: i.status for i in job.instances})
    if job.status == JobStatus.PENDING:
        p.acts.append(SetJobStatus(JobStatus.PROVISIONING, "launch"))
    for inst in job.instances:  # 1. each recorded instance against what the provider reports
        _step_instance(p, inst)
    final = _fill_slots(p)  # 2. every slot needs one live instance: create, replace per the policy, or shrink
    if final is not None:
        return final
    p.acts += _tasks(p)  # 3. training tasks (an exit code may end the job)
    if any(isinstance(a, SetJobStatus) and a.status == JobStatus.TEARING_DOWN for a in p.acts):
        return p.acts
    return p.acts + _job_status(p)  # 4. the job's own status


# ---------------------------------------------------------------- 1. instances


def _step_instance(p: _Pass, inst: InstanceView) -> None:
    o = p.obs.instances.get(inst.name)
    st = inst.status
    if st in _ENDED:
        _step_ended(p, inst, o)
    elif o is None:
        _step_missing(p, inst)
    elif (inst.name in p.obs.notices and inst.name not in p.drains) \
            or o.state in (ObservedState.STOPPING, ObservedState.TERMINATED):
        noticed = inst.name in p.obs.notices
        if inst.spot or o.preempted:
            why = "preemption notice" if noticed and o.state == ObservedState.RUNNING else f"preempted ({o.state})"
            p.lose(inst, S.REVOKED, why, EndReason.PREEMPTED)
        elif noticed and o.state == ObservedState.RUNNING:
            # Only GCE's host-maintenance notice (jobs/storage_sync.py) puts a notice on an on-demand VM: it is kept
            # through the notice window for the checkpoint, as a revoked one, then replaced like any lost VM.
            p.lose(inst, S.REVOKED, "host maintenance notice: GCE stops GPU VMs for host maintenance an hour "
                   "after it; replaced after its checkpoint", EndReason.LOST)
        else:
            p.lose(inst, S.LOST, f"instance {o.state.value} without a stop request", EndReason.LOST)
    elif o.state == ObservedState.PENDING:
        if st == S.REQUESTED:
            p.mark(inst, S.PROVISIONING, "create accepted")
        elif st == S.PROVISIONING and p.now - inst.updated_at > INSTANCE_TIMEOUT_S[S.PROVISIONING]:
            p.lose(inst, S.LOST, "stuck provisioning", EndReason.LOST, f"{inst.name} stuck provisioning")
    elif st in (S.REQUESTED, S.PROVISIONING):
        p.acts.append(PrepareInstance(inst.name))
        p.status[inst.name] = S.READY


def _step_ended(p: _Pass, inst: InstanceView, o: ObservedInstance | None) -> None:
    """Deleted, being deleted, or lost: confirm the delete, ask again, or clean up."""
    st = inst.status
    if st == S.DELETED:
        return
    if st == S.DELETING:
        if o is None:
            p.mark(inst, S.DELETED, "deletion confirmed")
        elif p.now - inst.updated_at > INSTANCE_TIMEOUT_S[S.DELETING]:
            p.acts.append(DeleteInstance(inst.name, inst.zone, "delete timed out; asking again"))
        return
    in_window = (st == S.REVOKED and o is not None and o.state != ObservedState.TERMINATED
                 and replacing.in_notice_grace(inst.revoked_at or inst.updated_at, p.now, p.job.notice_s))
    if not in_window:
        p.acts.append(DeleteInstance(inst.name, inst.zone, f"clean up {st.value} instance"))
        p.status[inst.name] = S.DELETING


def _step_missing(p: _Pass, inst: InstanceView) -> None:
    """The provider does not report an instance we recorded."""
    if inst.status == S.REQUESTED:
        age = p.now - inst.updated_at
        slot = next((s for s in p.job.slots if s.name == inst.slot), None)
        if age > INSTANCE_TIMEOUT_S[S.REQUESTED]:
            p.mark(inst, S.FAILED, "never appeared after the create request", EndReason.CREATE_FAILED)
        elif age > timings.CREATE_REISSUE_S and slot is not None:
            # Intent recorded but nothing exists: the controller may have died before the call.
            # Creating again is safe: the name is deterministic and the create idempotent.
            p.acts.append(CreateInstance(slot, inst.generation, inst.spot, (inst.zone,), inst.port,
                                         "create again: intent recorded, no instance seen"))
    elif inst.spot and inst.name in p.obs.notices:
        p.lose(inst, S.REVOKED, "preempted: notice, then the instance was gone", EndReason.PREEMPTED)
    else:
        p.lose(inst, S.LOST, "instance disappeared without a delete from us", EndReason.LOST)


# ---------------------------------------------------------------- 2. slots


def _fill_slots(p: _Pass) -> list[Action] | None:
    """Create, replace or shrink each slot without a live instance; the final actions when the job ends."""
    job = p.job
    by_slot: dict[str, list[InstanceView]] = defaultdict(list)
    for inst in job.instances:
        by_slot[inst.slot].append(inst)
    p.replacements = sum(1 for i in job.instances if i.generation > 0 and i.end_reason != EndReason.CREATE_FAILED)
    governed = _deadline_slots(job)
    if governed and deadline_elastic.applies(job, p.obs, governed):
        _elastic_fill(p, governed, by_slot)
    elif governed:
        _deadline_fill(p, governed, by_slot)
    dropped = {name for name, _ in job.repartitioned}  # a pipeline re-formed without them: never replaced
    p.shrunk |= dropped
    for slot in job.slots:
        if slot in governed or slot.name in dropped:
            continue
        insts = sorted(by_slot.get(slot.name, []), key=lambda i: i.generation)
        if any(p.status[i.name] in LIVE_INSTANCE for i in insts):
            continue
        if not insts:
            p.create(slot, 0, slot.spot, slot.zones, None, "initial")
            continue
        final = _retry_create(p, slot, insts) if insts[-1].end_reason == EndReason.CREATE_FAILED \
            else _replace(p, slot, insts[-1])
        if final is not None:
            return final
    worker_slots = [s for s in job.slots if s.role == Role.WORKER]
    if worker_slots and all(s.name in p.shrunk for s in worker_slots):
        return p.acts + [SetJobStatus(JobStatus.TEARING_DOWN, "every worker was revoked and policy is shrink",
                                      JobStatus.FAILED)]
    return None


def _retry_create(p: _Pass, slot: Slot, insts: list[InstanceView]) -> list[Action] | None:
    last = insts[-1]
    failures = sum(1 for i in insts if i.end_reason == EndReason.CREATE_FAILED)
    if failures >= timings.MAX_CREATE_FAILURES:
        return [SetJobStatus(JobStatus.TEARING_DOWN, f"{slot.name}: no capacity or quota in any allowed "
                             f"zone after {failures} tries ({last.zone})", JobStatus.FAILED)]
    if p.now - last.updated_at >= timings.CREATE_RETRY_S:
        p.create(slot, last.generation + 1, last.spot, slot.zones, last.port,
                 f"retry after create failure of {last.name}")
    return None


def _replace(p: _Pass, slot: Slot, last: InstanceView) -> list[Action] | None:
    """The slot's last instance was lost: the policy says replace (how, where), shrink, or give up."""
    job = p.job
    end_reason = p.end_reason(last)
    decision = replacing.decide_replacement(
        slot.role, preempted=end_reason == EndReason.PREEMPTED, spot=last.spot,
        on_revocation=job.on_revocation, replacements=p.replacements, max_replacements=job.max_replacements,
        hosts_chief=slot.hosts_chief)
    if decision.verdict == replacing.Verdict.SHRINK:
        p.shrunk.add(slot.name)
        return None
    if decision.verdict == replacing.Verdict.EXHAUSTED:
        return p.acts + [SetJobStatus(JobStatus.TEARING_DOWN, f"policy.max_replacements ({job.max_replacements}) "
                                      f"reached when {last.name} was lost", JobStatus.FAILED)]
    if decision.verdict == replacing.Verdict.REPLACE and _repartitions(p, slot, last, decision.spot):
        return None
    why = f"replaces {last.name} ({end_reason or p.status[last.name].value})"
    if decision.spot != last.spot:
        why += ", on-demand fallback"
    zones = replacing.replacement_zones(last.zone, slot.zones)
    p.create(slot, last.generation + 1, decision.spot, zones, last.port, why)
    p.replacements += 1
    return None


def _repartitions(p: _Pass, slot: Slot, last: InstanceView, spot: bool) -> bool:
    """A pipeline's lost stage: record whether waiting for its replacement or re-partitioning over the survivors is
    predicted cheaper (``decide.stage_loss_step``); True: re-partition, the slot stays empty."""
    d = stage_loss_step.decide(p.job, slot, spot, p.status, p.now)
    if d is None:
        return False
    why = stage_loss_step.describe(slot, d, stage_loss_step.survivors(p.job, slot.name))
    p.acts.append(RecordStageLoss(last.name, d.action, why))
    if d.action != stage_loss_step.REPARTITION:
        return False
    p.shrunk.add(slot.name)
    return True


def _deadline_slots(job: JobView) -> tuple[Slot, ...]:
    """The slots ``on_revocation: deadline`` drives: those planned on spot."""
    if job.on_revocation != OnRevocation.DEADLINE or job.deadline_inputs is None or job.deadline_s is None:
        return ()
    return tuple(s for s in job.slots if s.spot)


def _deadline_fill(p: _Pass, slots: tuple[Slot, ...], by_slot: dict[str, list[InstanceView]]) -> None:
    """``on_revocation: deadline``: the spot-planned slots run on what ``decide.deadline.deadline_policy`` picks
    this pass (spot, on-demand, or nothing while waiting for spot), the simulator's very decision
    (``sim.availability``); a change of pricing replaces the VM and training restarts from its checkpoint.
    The deadline bounds the run, so ``max_replacements`` does not apply to these hops."""
    progress, seen, zone = _deadline_progress(p, slots, by_slot)
    gpus = _deadline_gpus(p, slots, by_slot, progress, seen)
    # one market is a market set of one (the simulator and the tests decide it as ``policy.deadline_policy``)
    choice = deadline_markets.decide_set(MarketSet.of_one(progress, seen))[0] if gpus is None else gpus.mode
    on_other = {s.name: s for s in gpus.market.slots} if gpus is not None and gpus.market is not None else {}
    for slot in slots:
        insts = sorted(by_slot.get(slot.name, []), key=lambda i: i.generation)
        cur = next((i for i in reversed(insts) if p.status[i.name] in LIVE_INSTANCE), None)
        target = on_other.get(slot.name, slot)
        keep = cur is not None and choice != policy.Mode.IDLE and cur.spot == (choice == policy.Mode.SPOT)
        keep = keep and (gpus is None or cur is None or cur.gpu == target.gpu)
        if keep and (cur is None or cur.name not in p.drains):
            continue
        why = f"deadline policy: {choice.value}" + (f" on {target.gpu}" if target is not slot else "")
        if keep:
            # A drain is never called off: its notice has made the job checkpoint (a PyTorch rank has left), and a
            # VM kept with an old drain would later be deleted on that drain's checkpoint, losing the steps since.
            why += " (the hop drained for earlier completes: a fresh VM of the same pricing)"
        if cur is not None and not _drained(p, cur, why):
            continue  # it checkpoints first; a later pass deletes it
        if cur is not None:
            p.acts.append(DeleteInstance(cur.name, cur.zone, why, EndReason.REPLACED))
            p.status[cur.name] = S.DELETING
            p.lost[slot.name], p.lost_role[slot.name] = f"{cur.name} {why}", cur.role
        if choice == policy.Mode.IDLE:
            continue
        last = insts[-1] if insts else None
        if target is not slot:  # another GPU type's spot (policy.also_gpus): in its own zones
            p.create(target, 0 if last is None else last.generation + 1, True, target.zones,
                     None if last is None else last.port, why)
            continue
        chosen = zone.zone if zone is not None and choice == policy.Mode.SPOT else None
        why += f" in {chosen}, where spot is expected to last longest" if chosen is not None else ""
        if last is None:
            p.create(slot, 0, choice == policy.Mode.SPOT, deadline_zones.zones_from(chosen, slot.zones), None, why)
            continue
        # spot again after a preemption: the other zones first (move rather than wait where the spot went)
        moved = choice == policy.Mode.SPOT and p.end_reason(last) == EndReason.PREEMPTED and len(slot.zones) > 1
        zones = deadline_zones.zones_from(chosen, replacing.replacement_zones(last.zone, slot.zones, rotate=moved))
        p.create(slot, last.generation + 1, choice == policy.Mode.SPOT, zones, last.port,
                 why + (f", moved from {last.zone} where spot was preempted" if moved else ""))


def _elastic_fill(p: _Pass, slots: tuple[Slot, ...], by_slot: dict[str, list[InstanceView]]) -> None:
    """``on_revocation: deadline`` with elastic shrink and on-demand top-up (``decide.deadline_elastic``): the
    simulator's ``decide.elastic`` decision, mapped onto the slots; the slots left empty are shrunk."""
    insts = [i for s in slots for i in by_slot.get(s.name, [])]
    live = [i for i in insts if p.status[i.name] in LIVE_INSTANCE]
    plan = deadline_elastic.plan(p.job, p.obs, p.now, slots, insts, live, p.ended)
    p.acts += plan.records
    p.shrunk |= set(plan.empty)
    for inst in plan.drop:
        if _drained(p, inst, plan.why):  # else it checkpoints first; a later pass deletes it
            p.acts.append(DeleteInstance(inst.name, inst.zone, plan.why, EndReason.REPLACED))
            p.status[inst.name] = S.DELETING
            if inst.name not in plan.superseded:  # a superseded VM's slot trains on the newer one
                p.lost[inst.slot], p.lost_role[inst.slot] = f"{inst.name} {plan.why}", inst.role
    for c in plan.create:
        if c.after is not None and p.status[c.after] in LIVE_INSTANCE:
            continue  # created once the slot's dropped instance is gone
        last = max(by_slot.get(c.slot.name, []), key=lambda i: i.generation, default=None)
        p.create(c.slot, 0 if last is None else last.generation + 1, c.spot, c.slot.zones,
                 None if last is None else last.port, plan.why)


def _deadline_gpus(p: _Pass, slots: tuple[Slot, ...], by_slot: dict[str, list[InstanceView]],
                   progress: policy.Progress, seen: policy.Availability) -> deadline_gpus.GpuChoice | None:
    """Where the spot workers run when they may move to other GPU types (``decide.deadline_gpus``); a type that refused
    a spot create lately, or preempted one this pass, has no spot whatever the advisor's forecast says."""
    spot = [i for s in slots for i in by_slot.get(s.name, []) if i.spot]
    gone = {i.gpu for i in spot if p.ended.get(i.name) == EndReason.PREEMPTED or (
        i.end_reason == EndReason.CREATE_FAILED and p.now - i.updated_at < timings.CREATE_RETRY_S)}
    live = [i for i in spot if p.status[i.name] in LIVE_INSTANCE]
    gpus = deadline_gpus.choose(progress, seen, p.job, p.obs.spot_by_gpu, live, p.now, gone)
    p.acts += gpus.records if gpus is not None else ()
    return gpus


def _drained(p: _Pass, inst: InstanceView, why: str) -> bool:
    """Whether a deliberate hop may delete ``inst`` now. One that trains is drained first: its notice makes the
    job checkpoint (as on a preemption notice), and it goes once a checkpoint newer than the notice is reported
    or the notice window and its upload have passed (a payload that ignores notices loses its steps since the last
    checkpoint, as before drains). One that does not train yet has nothing to lose."""
    if p.status[inst.name] != S.TRAINING:
        return True
    at = p.drains.get(inst.name)
    if at is None:
        p.acts.append(DrainInstance(inst.name, f"{why}: checkpoint before the hop"))
        return False
    di = p.job.deadline_inputs
    if di is not None and di.checkpoint_at is not None and di.checkpoint_at >= at:
        return True
    return not replacing.in_notice_grace(at, p.now, p.job.notice_s)


def _deadline_progress(p: _Pass, slots: tuple[Slot, ...], by_slot: dict[str, list[InstanceView]]
                       ) -> tuple[policy.Progress, policy.Availability, deadline_zones.ZoneChoice | None]:
    """Where the job stands, and the spot stretches seen during it (a change of capacity is recorded for the
    next passes: they learn as the simulator's replay does, tick by tick); where the provider says which of the
    job's zones have spot, the zone spot runs in next and that zone's stretches (``decide.deadline_zones``)."""
    job, di = p.job, p.job.deadline_inputs
    assert di is not None and job.deadline_s is not None
    insts = [i for s in slots for i in by_slot.get(s.name, [])]
    live = [i for i in insts if p.status[i.name] in LIVE_INSTANCE]
    mode = policy.Mode.IDLE if not live else policy.Mode.SPOT if any(i.spot for i in live) else policy.Mode.ON_DEMAND
    started = job.started_at if job.started_at is not None else p.now
    available = _spot_available(p, slots, insts)
    ended_spot = [p.now if i.status in LIVE_INSTANCE else i.revoked_at or i.updated_at  # lost in this pass: now
                  for i in insts if i.spot and p.status[i.name] not in LIVE_INSTANCE]
    outage_since = max([started, *ended_spot])
    booting = [i for i in live if p.status[i.name] != S.TRAINING]
    left_s = max((max(0.0, di.overhead_s - (p.now - i.requested_at)) for i in booting), default=0.0)
    h = 3600.0 / di.time_scale  # hours of cloud time, the clock of the availability the policy has in mind
    # A zone that refused a create lately, or preempted a spot VM of the job in this pass, has no spot whatever
    # the advisor's forecast says.
    blocked = {z for s in slots for z in p.obs.failed_zones.get(s.name, ())}
    blocked |= {i.zone for i in insts if i.spot and p.ended.get(i.name) == EndReason.PREEMPTED}
    current = next((i.zone for i in live if i.spot), None)
    zone = deadline_zones.choose(slots, p.obs.spot_by_zone, blocked, current, di, started, p.now, h)
    if zone is not None:  # spot can be had where the job may run it, in the zone chosen
        p.acts += zone.records
        available = available and zone.zone is not None
    changes = di.spot_seen
    if not changes or changes[-1][1] != available:
        p.acts.append(RecordSpotAvailability(available, "spot capacity " + ("there" if available else "none")))
        changes = (*changes, (p.now, available))
    seen, up_h = policy.seen_during_job(changes, started, p.now, di.tick_s, h, di.spot_before)
    if zone is not None:
        seen, up_h = zone.view(seen), zone.up_age_h
    return policy.Progress(
        elapsed_h=(p.now - started) / h, work_done_h=di.done_s / h, work_h=di.work_s / h,
        deadline_h=job.deadline_s / h, overhead_h=di.overhead_s / h, mode=mode, spot_available=available,
        tick_h=di.tick_s / h, overhead_left_h=left_s / h, outage_h=0.0 if available else (p.now - outage_since) / h,
        spot_up_h=up_h, spot_usd_per_h=di.spot_usd_per_h, on_demand_usd_per_h=di.on_demand_usd_per_h), seen, zone


def _spot_available(p: _Pass, slots: tuple[Slot, ...], insts: list[InstanceView]) -> bool:
    """The provider's capacity probe when it has one (a forecast, GCE's capacity advice, only while what the job's
    own VMs met agrees); else no spot while a spot VM was just preempted and its slot has no other unblocked zone
    to move to, its last create was refused less than ``CREATE_RETRY_S`` ago (a create falls through every zone),
    or every allowed zone is blocked."""
    probe = p.obs.spot_available
    if probe is not None and not (probe and p.obs.spot_forecast):
        return probe
    for slot in (s for s in slots if s.name in p.lost):
        gone = {i.zone for i in insts if i.slot == slot.name and i.name in p.ended}
        blocked = set(p.obs.failed_zones.get(slot.name, ()))
        if not set(slot.zones) - gone - blocked:
            return False
    refused = [i for i in insts if i.spot and i.end_reason == EndReason.CREATE_FAILED]
    if refused and p.now - max(i.updated_at for i in refused) < timings.CREATE_RETRY_S:
        return False
    return not all(s.zones and set(s.zones) <= set(p.obs.failed_zones.get(s.name, ())) for s in slots)


# ---------------------------------------------------------------- 3. tasks, 4. job status


def _job_status(p: _Pass) -> list[Action]:
    job = p.job
    training = _training_now(job, p.status, p.shrunk, p.acts)
    if job.status in (JobStatus.PENDING, JobStatus.PROVISIONING) and training:
        return [SetJobStatus(JobStatus.RUNNING, "every task is training")]
    if job.status == JobStatus.RUNNING and (p.lost or any(isinstance(a, RestartTraining) for a in p.acts)):
        return [SetJobStatus(JobStatus.RECOVERING, "; ".join(sorted(p.lost.values())) or "restarting training")]
    if job.status == JobStatus.RECOVERING and training and not p.lost:
        return [SetJobStatus(JobStatus.RUNNING, "recovered")]
    return []


def _live(job: JobView, status: dict[str, InstanceStatus], role: Role | None = None) -> list[InstanceView]:
    return [i for i in job.instances if status[i.name] in LIVE_INSTANCE and (role is None or i.role == role)]


def _tasks(p: _Pass) -> list[Action]:
    job, status = p.job, p.status
    if job.status not in (JobStatus.PENDING, JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.RECOVERING):
        return []
    training = [i for i in _live(job, status) if status[i.name] == S.TRAINING]
    by_name = {i.name: i for i in training}
    # A task drained for a hop may leave the world after its checkpoint (PyTorch): its instance goes, so that exit
    # says nothing (past the window, with its VM not deleted, the exit counts).
    ended = {n: pr for n in by_name if (pr := p.obs.procs.get(n)) is not None and pr.state == ProcState.EXITED
             and not (n in p.drains and replacing.in_notice_grace(p.drains[n], p.now, job.notice_s))}
    verdict = _exit_verdict(job, by_name, ended)
    if verdict is not None:
        return verdict
    # A task that exited 0 is done: it is never started again (only the writer's exit ends the job).
    exited = {n: pr for n, pr in ended.items() if classify(pr.exit_code) != Exit.DONE}
    if job.mode == TrainingMode.ASYNC:
        restart_reason = _async_restart_reason(p, by_name, exited)
    else:
        restart_reason = _sync_restart_reason(p, by_name, exited)
    if restart_reason is not None:
        if training or any(pr.state == ProcState.RUNNING for pr in p.obs.procs.values()):
            return [RestartTraining(restart_reason)]
        return []
    if job.mode == TrainingMode.ASYNC:
        return _start_async(p, by_name, exited)
    return _start_sync(p)


def _async_restart_reason(p: _Pass, by_name: dict[str, InstanceView], exited: dict[str, ProcStatus]) -> str | None:
    hosts = _chief_hosts(p.job)
    critical_lost = [why for slot, why in p.lost.items() if replacing.is_critical(p.lost_role[slot], slot in hosts)]
    if critical_lost:
        return "lost " + ", ".join(critical_lost)
    for name, pr in exited.items():
        if replacing.is_critical(by_name[name].role, by_name[name].slot in hosts):
            return f"{by_name[name].slot} task exited with code {pr.exit_code}"
    chief_training = bool(hosts) or any(i.role == Role.CHIEF for i in by_name.values())
    if not p.job.stable_addresses and chief_training:
        moved = [i.slot for i in _live(p.job, p.status, Role.WORKER)
                 if p.status[i.name] == S.READY and i.generation > 0]
        if moved:
            # The chief's cluster spec names each worker's address; a new VM has a new one.
            return f"{', '.join(moved)} came back at a new address"
    return None


def _sync_restart_reason(p: _Pass, by_name: dict[str, InstanceView], exited: dict[str, ProcStatus]) -> str | None:
    if p.lost and (not p.job.elastic or p.job.rdzv_slot in p.lost):  # elastic: torchrun shrinks the world
        return "lost " + ", ".join(sorted(p.lost.values()))
    repartitioned = stage_loss_step.restart_reason(p.job, p.status)
    if repartitioned is not None:
        return repartitioned
    name = next(iter(exited), None)
    return None if name is None else f"{by_name[name].slot} task exited with code {exited[name].exit_code}"


def _start_async(p: _Pass, by_name: dict[str, InstanceView], exited: dict[str, ProcStatus]) -> list[Action]:
    job, status = p.job, p.status
    ready = [i for i in _live(job, status) if status[i.name] == S.READY]
    acts: list[Action] = [StartTask(i.name, "start server") for i in ready if i.role in (Role.PS, Role.WORKER)]
    for name, pr in exited.items():  # a worker's server died but its instance lives: start it again
        if by_name[name].role == Role.WORKER:
            acts.append(StartTask(name, f"worker task exited with code {pr.exit_code}; restarting it"))
    servers_up = all(
        any(i.role == s.role and i.index == s.index and status[i.name] == S.TRAINING for i in job.instances)
        for s in job.slots if s.role in (Role.PS, Role.WORKER) and s.name not in p.shrunk
    )
    chief_ready = [i for i in ready if i.role == Role.CHIEF]
    if chief_ready and servers_up:
        acts.append(StartTask(chief_ready[0].name, "every server is up; start the chief"))
    return acts


def _start_sync(p: _Pass) -> list[Action]:
    job, status = p.job, p.status
    wanted = [s for s in job.slots if s.role == Role.WORKER and s.name not in p.shrunk]
    live_workers = _live(job, status, Role.WORKER)
    if job.elastic and any(status[i.name] == S.TRAINING for i in live_workers):
        return [StartTask(i.name, "joins the elastic world at the next rendezvous") for i in live_workers
                if status[i.name] == S.READY]
    if len(live_workers) == len(wanted) and all(status[i.name] == S.READY for i in live_workers):
        return [StartTask(i.name, "every worker is ready; start synchronous training") for i in live_workers]
    return []


def _is_writer(job: JobView, inst: InstanceView) -> bool:
    """The task whose end is the job's end: the async chief (or the worker that runs it), or sync worker 0."""
    if job.mode == TrainingMode.ASYNC:
        return inst.role == Role.CHIEF or inst.slot in _chief_hosts(job)
    return inst.role == Role.WORKER and inst.index == 0


def _chief_hosts(job: JobView) -> set[str]:
    """The slot whose task also runs the async chief (cluster.chief.on_worker0), if any."""
    return {s.name for s in job.slots if s.hosts_chief}


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
