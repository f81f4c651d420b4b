"""``on_revocation: deadline`` for a multi-worker PyTorch job where the provider counts the spot VMs that can be had
(a replayed 16-node trace): elastic shrink with on-demand top-up (issue 23, items 2 and 3).

Each pass builds the simulator's ``decide.elastic.ElasticState`` from the job's instances and the counts recorded so
far, asks ``decide.elastic.elastic_policy`` (the function ``sim.elastic`` replays) how many spot and on-demand workers
to run, and maps that onto the job's spot-planned slots: keep what runs up to that many of each pricing, drain and
delete the rest, create in empty slots, and leave the others empty (the world shrinks; torchrun re-forms it). The
slot that hosts the rendezvous is kept or refilled first: a world without it cannot re-form. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.costmodel.slots import Slot
from orchestrator.decide import deadline as policy
from orchestrator.decide.actions import RecordElasticChoice, RecordSpotCount
from orchestrator.decide.elastic import ElasticState, Members, elastic_policy
from orchestrator.decide.state import DeadlineInputs, InstanceView, JobView, Observation
from orchestrator.model import timings
from orchestrator.model.spec import JobSpec
from orchestrator.model.status import EndReason, InstanceStatus
from orchestrator.model.torch_spec import is_pytorch


@dataclass(frozen=True)
class Create:
    """A VM to create in ``slot``; ``after``: the slot's instance that is dropped, deleted first (a later pass
    creates while it drains)."""

    slot: Slot
    spot: bool
    after: str | None = None


@dataclass(frozen=True)
class ElasticPlan:
    """What this pass does to the spot-planned slots."""

    drop: tuple[InstanceView, ...]  # live instances to drain, then delete
    create: tuple[Create, ...]
    empty: tuple[str, ...]  # slots left without a VM while others train: the world shrinks without them
    superseded: frozenset[str]  # older live VMs of slots that train on a newer one: dropped, not a loss of the world
    records: tuple[RecordSpotCount | RecordElasticChoice, ...]
    why: str


def elastic_spot_workers(spec: JobSpec) -> int:
    """The spot workers the daemon shrinks and tops up: a PyTorch job's, two or more, where the provider counts the
    spot VMs that can be had and there is no other zone or GPU type: the local provider replaying one trace, or gce
    in one zone with every spot worker of one GPU type (its capacity advice asked for 1, 2, ... of them); 0 where
    it runs all-or-nothing. The daemon asks the provider for a count only then, and ``plan`` shows the elastic row
    only then (``applies`` is the same rule read off each pass's observation)."""
    local, gce = spec.provider.as_local(), spec.provider.as_gce()
    spot = [w for w in spec.cluster.workers if w.spot] if spec.cluster is not None else []
    counted = (local is not None and local.availability_trace is not None and not local.gpu_availability_traces) or (
        gce is not None and len({z for w in spot for z in ([w.zone] if w.zone else gce.zones)}) == 1
        and len({(w.gpu, w.machine_type) for w in spot}) == 1)
    n = sum(w.count for w in spot)
    return n if counted and is_pytorch(spec) and n >= 2 and not spec.policy.also_gpus else 0


def applies(job: JobView, obs: Observation, slots: Sequence[Slot]) -> bool:
    """Elastic shrink drives the job: an elastic world (PyTorch), two or more spot-planned workers, a provider that
    counts the spot VMs, and no other zone or GPU type to move to (``decide.deadline_zones``, ``decide.deadline_gpus``
    decide those all-or-nothing)."""
    di = job.deadline_inputs
    return (job.elastic and obs.spot_count is not None and len(slots) >= 2 and di is not None and not di.markets
            and obs.spot_by_zone is None)


def _at_least(counts: Sequence[tuple[float, int]], level: int) -> tuple[tuple[float, bool], ...]:
    """The changes of "at least ``level`` spot VMs" in the recorded counts."""
    out: list[tuple[float, bool]] = []
    for at, count in counts:
        if not out or out[-1][1] != (count >= level):
            out.append((at, count >= level))
    return tuple(out)


def elastic_state(job: JobView, di: DeadlineInputs, now: float, count: int, counts: Sequence[tuple[float, int]],
                  live: Sequence[InstanceView], insts: Sequence[InstanceView], preempted_now: bool, workers: int,
                  drained: Mapping[str, float]) -> ElasticState:
    """Where the job stands, as ``sim.elastic.replay`` gives it to the policy: hours of cloud time, work in
    full-cluster hours, prices per VM, the spot stretches seen at the level of VMs that can be had now and at
    the job's full size. ``live``: the instances that run on (not drained); ``insts``: every one of the slots';
    ``drained``: when each drained instance's notice was written."""
    assert job.deadline_s is not None
    h = 3600.0 / di.time_scale
    started = job.started_at if job.started_at is not None else now
    level = min(count, workers)
    seen, age_h = policy.seen_during_job(_at_least(counts, level), started, now, di.tick_s, h)
    full, _ = policy.seen_during_job(_at_least(counts, workers), started, now, di.tick_s, h)
    # Any change of membership restarts the world (as the simulator counts it): from the newest request, preemption
    # or drain; a preemption in this very pass restarts whatever runs next, from now.
    marks = [i.requested_at for i in live] + [i.revoked_at for i in insts if i.revoked_at is not None]
    marks += [drained[i.name] for i in insts if i.name in drained]
    left_s = 0.0 if preempted_now or not live else max(0.0, di.overhead_s - (now - max(marks)))
    return ElasticState(
        workers=workers, elapsed_h=(now - started) / h, work_done_h=di.done_s / h, work_h=di.work_s / h,
        deadline_h=job.deadline_s / h, overhead_h=di.overhead_s / h, tick_h=di.tick_s / h,
        running=Members(sum(i.spot for i in live), sum(not i.spot for i in live)), spot_can=count,
        restart_due=preempted_now, overhead_left_h=left_s / h, spot_age_h=age_h,
        spot_left_h=seen.up_left(age_h) if level else 0.0, spot_usd_per_h=di.spot_usd_per_h / workers,
        on_demand_usd_per_h=di.on_demand_usd_per_h / workers, seen_full=full,
        change_h=None if di.change_s is None else di.change_s / h)


def assign(slots: Sequence[Slot], live: Mapping[str, InstanceView], draining: Sequence[InstanceView],
           want: Members, rdzv: str | None) -> tuple[tuple[InstanceView, ...], tuple[Create, ...], tuple[str, ...]]:
    """``want`` on the slots: (instances to drop, creates, slots left empty). ``live``: each slot's running
    instance that is not drained; ``draining``: the drained ones, dropped whatever ``want`` is. Of each pricing the
    training instances are kept first, the rendezvous slot's before the others. Creates go to the rendezvous slot
    first, then to empty slots, then to slots whose instance is dropped (once it is deleted: ``Create.after``)."""
    order = sorted(slots, key=lambda s: (s.name != rdzv, s.index))
    rank = {s.name: j for j, s in enumerate(order)}

    def first(i: InstanceView) -> tuple[bool, int]:
        return i.status != InstanceStatus.TRAINING, rank[i.slot]

    spot = sorted((i for i in live.values() if i.spot), key=first)
    od = sorted((i for i in live.values() if not i.spot), key=first)
    kept = spot[:want.spot] + od[:want.on_demand]
    drop = [*spot[want.spot:], *od[want.on_demand:], *draining]
    need = [True] * (want.spot - min(want.spot, len(spot))) + [False] * (want.on_demand - min(want.on_demand, len(od)))
    if want.workers and rdzv is not None and not need and kept and rdzv not in {i.slot for i in kept}:
        moved = max(kept, key=lambda i: rank[i.slot])  # the rendezvous slot lost its VM: move one there
        kept.remove(moved)
        drop.append(moved)
        need = [moved.spot]
    kept_slots = {i.slot for i in kept}
    leaving = {i.slot: i.name for i in drop}
    free = sorted((s for s in order if s.name not in kept_slots),
                  key=lambda s: (s.name != rdzv, s.name in leaving, rank[s.name]))
    create = tuple(Create(s, spot, leaving.get(s.name)) for s, spot in zip(free, need, strict=False))
    filled = kept_slots | {c.slot.name for c in create}
    empty = tuple(s.name for s in order if s.name not in filled) if want.workers else ()
    return tuple(drop), create, empty


def plan(job: JobView, obs: Observation, now: float, slots: Sequence[Slot], insts: Sequence[InstanceView],
         live: Sequence[InstanceView], ended: Mapping[str, EndReason]) -> ElasticPlan:
    """This pass's decision and its actions on the slots. ``insts``: every instance of ``slots``; ``live``: those
    that live after this pass's steps; ``ended``: the end reasons set in this pass. The policy decides once a tick
    (of the job's clock, as the simulator), and again at once on a preemption or a new count; in between, passes
    carry out the choice held (a drain's second pass must not decide anew from a half-made change)."""
    di = job.deadline_inputs
    assert di is not None and obs.spot_count is not None
    drained = dict(di.drains)
    # An older VM of a slot that has a newer one: dropped before, its delete not started yet (on GCE it waits for
    # the VM's own create to finish); it is dropped again until it goes, and its going is no loss of the world.
    top = {i.slot: i.generation for i in sorted(live, key=lambda i: i.generation)}
    superseded = [i for i in live if i.generation < top[i.slot]]
    newest = {i.slot: i for i in live if i.generation == top[i.slot] and i.name not in drained}
    on = list(newest.values())
    preempted = any(ended.get(i.name) == EndReason.PREEMPTED for i in insts)
    said = obs.spot_count
    if obs.spot_forecast and preempted:  # a forecast (GCE's advice): a preemption now overrules it, as all or nothing
        said = min(said, sum(i.spot for i in on))
    count, counts = said, di.spot_counts
    records: list[RecordSpotCount | RecordElasticChoice] = []
    if not counts or counts[-1][1] != count:
        records.append(RecordSpotCount(count, f"{count} spot VMs can be had"))
        counts = (*counts, (now, count))
    # A spot create refused lately (the count changed under it): no more spot than runs, until CREATE_RETRY_S.
    refused = [i for i in insts if i.spot and i.end_reason == EndReason.CREATE_FAILED]
    if refused and now - max(i.updated_at for i in refused) < timings.CREATE_RETRY_S:
        count = min(count, sum(i.spot for i in on))
    held, started = di.elastic_choice, job.started_at if job.started_at is not None else now
    fresh = not preempted and not records and count == said  # nothing new since the choice held
    if held is not None and fresh and _tick(held[0], started, di) == _tick(now, started, di):
        want = Members(held[1], held[2])
    else:
        want = elastic_policy(elastic_state(job, di, now, count, counts, on, insts, preempted, len(slots), drained))
    why = f"{want.spot} spot + {want.on_demand} on-demand of {len(slots)} workers ({said} spot VMs can be had)"
    if held is None or (held[1], held[2]) != (want.spot, want.on_demand):
        records.append(RecordElasticChoice(want.spot, want.on_demand, why))
    old = frozenset(i.name for i in superseded)
    going = [*(i for i in live if i.name in drained and i.name not in old), *superseded]
    drop, create, empty = assign(slots, newest, going, want, job.rdzv_slot)
    return ElasticPlan(drop, create, empty, old, tuple(records), "deadline policy (elastic): " + why)


def _tick(at: float, started: float, di: DeadlineInputs) -> int:
    return int((at - started) / di.tick_s + 1e-9)
