"""The inputs of ``on_revocation: deadline`` for one pass: the job's work and restart overhead (the
simulator's accounting of its planned cluster, computed once per spec), how much of the work is done
(the latest step), the restarts it has measured, the instances drained before a hop and the newest checkpoint,
the spot capacity that earlier jobs in the same spot market saw before it started, and the provider's spot
capacity probe where it has one."""

from __future__ import annotations

import bisect
import re
import statistics
from collections.abc import Mapping, Sequence
from itertools import pairwise

import yaml
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.costmodel.slots import Slot
from orchestrator.decide import deadline as policy
from orchestrator.decide import deadline_zones
from orchestrator.decide.state import DeadlineInputs, GpuMarket
from orchestrator.model import timings
from orchestrator.model.instances import ObservedInstance, ObservedState, Role
from orchestrator.model.spec import JobSpec, OnRevocation, SpecError, validate_spec
from orchestrator.model.status import EndReason
from orchestrator.model.torch_spec import replica_groups
from orchestrator.planning.outlook import DeadlineFigures, DeadlinePlans
from orchestrator.providers.base import Provider, SupportsSpotCapacity
from orchestrator.store import queries
from orchestrator.store.models import Event, Instance, Job, Metric


class DeadlineCache:
    """What the daemon keeps between passes for its deadline jobs, in one object rather than module globals: each
    job's planned figures (``planning.outlook.DeadlinePlans``, the one planning call), its spot market, and the spot
    capacity earlier jobs in that market saw before it started (fixed once it started). The daemon's pass loop
    owns one (``control.driver.DriverState``, passed down each pass); a call given none plans afresh."""

    def __init__(self, max_cached: int = 256) -> None:
        self.plans = DeadlinePlans(max_cached)
        self.markets: dict[str, str | None] = {}  # job id -> its spot market (a job's spec never changes)
        self.before: dict[str, tuple[tuple[bool, float], ...]] = {}  # started job id -> spot_before
        self.max_cached = max_cached

    def clear(self) -> None:
        self.plans.clear()
        self.markets.clear()
        self.before.clear()


def _or_fresh(cache: DeadlineCache | None) -> DeadlineCache:
    return DeadlineCache() if cache is None else cache


def _figures(session: Session, job: Job, spec: JobSpec, cache: DeadlineCache | None = None
             ) -> tuple[DeadlineFigures, float]:
    return _or_fresh(cache).plans.figures(session, job.id, job.created_at, spec)


def gpu_markets(session: Session, job: Job, spec: JobSpec, slots: Sequence[Slot],
                cache: DeadlineCache | None = None) -> tuple[GpuMarket, ...]:
    """The GPU types of ``policy.also_gpus`` as the job was planned (``DeadlinePlans.gpu_markets``)."""
    return _or_fresh(cache).plans.gpu_markets(session, job.id, job.created_at, spec, slots)


def planned_figures(session: Session, job: Job, spec: JobSpec, cache: DeadlineCache | None = None
                    ) -> DeadlineFigures:
    """The work, restart overhead and prices the daemon plans ``job`` with (what `report` shows it planned)."""
    return _figures(session, job, spec, cache)[0]


def measured_overhead_s(session: Session, job: Job, now: float) -> float:
    """The longest restart this job has seen: from an instance's request to the first training step after it
    (an instance still starting counts its time so far). A loaded host or a slow image makes restarts dearer
    than the plan says; the policy then keeps more slack for them."""
    steps = sorted(session.scalars(select(Metric.at).where(
        Metric.job_id == job.id, Metric.kind == "step", Metric.worker == -1)))
    worst = 0.0
    for inst in job.instances:
        if inst.end_reason == EndReason.CREATE_FAILED.value:
            continue
        k = bisect.bisect_right(steps, inst.requested_at)
        ended = inst.revoked_at or inst.deleted_at
        if k < len(steps) and (ended is None or steps[k] <= ended):
            worst = max(worst, steps[k] - inst.requested_at)
        elif ended is None:
            worst = max(worst, now - inst.requested_at)
    return worst


PACE_WINDOWS = 5  # the job's own reports of progress before its measured pace replaces the predicted one
PACE_RECENT = 20  # ... of which the newest count (a shrunk world, a slowed host: the pace now)


def measured_step_s(session: Session, job_id: str, moved: Sequence[tuple[float, float]] = ()) -> float | None:
    """Seconds per training step at the pace the job has reported lately: the median over its newest cluster
    step reports of (time between two reports) / (steps between them). A restart, a wait for spot and a rollback
    to a checkpoint fall in single intervals that the median leaves out. None until PACE_WINDOWS intervals.
    ``moved``: (from, to) spans the job trained on another GPU type (policy.also_gpus), whose pace is not its own
    GPU's: their reports are left out."""
    rows = session.execute(select(Metric.step, Metric.at).where(
        Metric.job_id == job_id, Metric.kind == "step", Metric.worker == -1,
        *(~Metric.at.between(a, b) for a, b in moved)
    ).order_by(Metric.at.desc()).limit(PACE_RECENT + 1)).all()
    per_step = [(b_at - a_at) / (b - a) for (b, b_at), (a, a_at) in pairwise(rows) if b > a and b_at > a_at]
    return statistics.median(per_step) if len(per_step) >= PACE_WINDOWS else None


def own_pace_s(session: Session, job: Job, spec: JobSpec, now: float) -> float | None:
    """``measured_step_s`` on the job's planned GPU types and its whole world: the spans its workers ran another
    type (moved there by the deadline policy, policy.also_gpus) and the spans its PyTorch world ran shrunk (the
    elastic deadline policy's, or a lost worker's until its replacement joined) are left out: the work is counted
    in hours of the whole cluster."""
    planned = {w.gpu for w in spec.cluster.workers} if spec.cluster is not None else set()
    moved = tuple((i.requested_at, i.deleted_at or i.revoked_at or now) for i in job.instances
                  if i.role == Role.WORKER.value and i.gpu is not None and i.gpu not in planned)
    return measured_step_s(session, job.id, moved + shrunk_spans(session, job.id, now))


_WORLD = re.compile(r"world (\d+) -> (\d+) at step")


def shrunk_spans(session: Session, job_id: str, now: float) -> tuple[tuple[float, float], ...]:
    """(from, to) spans in which the job's PyTorch world had fewer ranks than the most it has had (its world events,
    control/torch_task.py); none for a job without them."""
    rows = session.execute(select(Event.at, Event.reason).where(
        Event.job_id == job_id, Event.entity == "note", Event.to_status.in_(("world", "shrink", "grow"))
    ).order_by(Event.at, Event.id)).all()
    sizes = [(float(at), int(m.group(2))) for at, reason in rows if (m := _WORLD.match(reason or "")) is not None]
    full = max((size for _, size in sizes), default=0)
    spans: list[tuple[float, float]] = []
    since: float | None = None
    for at, size in sizes:
        if 0 < size < full and since is None:
            since = at
        elif size == full and since is not None:
            spans.append((since, at))
            since = None
    return tuple(spans) + (((since, now),) if since is not None else ())


def deadline_inputs(session: Session, job: Job, spec: JobSpec, now: float, slots: Sequence[Slot] = (),
                    cache: DeadlineCache | None = None) -> DeadlineInputs | None:
    """The work is the predicted no-revocation time until the job has measured its own pace, then the steps at
    that pace: a prediction off by its interval (+-20% and more) would otherwise spend slack the job has not got,
    or keep on-demand it does not need."""
    if spec.policy.on_revocation != OnRevocation.DEADLINE:
        return None
    cache = _or_fresh(cache)  # one for the figures, the markets and the spot before, planned once
    fig, tick = _figures(session, job, spec, cache)
    step, _ = queries.latest_step(session, job.id)
    overhead = max(fig.overhead_s, measured_overhead_s(session, job, now))
    markets = gpu_markets(session, job, spec, slots, cache)
    pace = own_pace_s(session, job, spec, now)
    work_s = fig.work_s if pace is None else pace * job.train_steps
    anywhere, by_zone, counts, choice = seen_changes(session, job.id)
    return DeadlineInputs(work_s=work_s, done_s=work_s * min(1.0, step / max(1, job.train_steps)),
                          overhead_s=overhead, tick_s=tick, spot_usd_per_h=fig.spot_usd_per_h,
                          on_demand_usd_per_h=fig.on_demand_usd_per_h, time_scale=fig.time_scale,
                          spot_seen=anywhere, zone_spot_seen=by_zone, spot_counts=counts, elastic_choice=choice,
                          drains=drains(session, job.id),
                          spot_before=spot_before(session, job, spec, now, cache),
                          checkpoint_at=session.scalar(select(func.max(Metric.at)).where(
                              Metric.job_id == job.id, Metric.kind == "checkpoint")), markets=markets,
                          change_s=timings.TORCHFT_PAUSE_S if replica_groups(spec) else None)


ZoneChanges = tuple[tuple[str, tuple[tuple[float, bool], ...]], ...]


def seen_changes(session: Session, job_id: str) -> tuple[tuple[tuple[float, bool], ...], ZoneChanges,
                                                         tuple[tuple[float, int], ...], tuple[float, int, int] | None]:
    """The changes of spot capacity the daemon recorded for the job (``RecordSpotAvailability``), oldest first: in
    any zone, each zone's (with a zone, where the provider says by zone), and how many spot VMs could be had (where
    the provider counts them, ``RecordSpotCount``); and the elastic policy's newest choice. One query, once a pass."""
    any_kinds = {v: k for k, v in policy.SPOT_SEEN_EVENTS.items()}
    zone_kinds = {v: k for k, v in policy.ZONE_SEEN_EVENTS.items()}
    rows = session.execute(select(Event.at, Event.to_status, Event.reason).where(
        Event.job_id == job_id, Event.entity == "note",
        Event.to_status.in_([*any_kinds, *zone_kinds, policy.SPOT_COUNT_EVENT, policy.ELASTIC_CHOICE_EVENT])
    ).order_by(Event.at, Event.id))
    anywhere: list[tuple[float, bool]] = []
    by_zone: dict[str, list[tuple[float, bool]]] = {}
    counts: list[tuple[float, int]] = []
    choice: tuple[float, int, int] | None = None
    for at, what, reason in rows:
        if what == policy.ELASTIC_CHOICE_EVENT:
            members = policy.choice_of_reason(reason or "")
            choice = choice if members is None else (float(at), *members)
        elif what == policy.SPOT_COUNT_EVENT:
            counts.append((float(at), policy.count_of_reason(reason or "")))
        elif what in any_kinds:
            anywhere.append((float(at), any_kinds[what]))
        else:
            by_zone.setdefault(deadline_zones.zone_of_reason(reason or ""), []).append((float(at), zone_kinds[what]))
    zones = tuple((zone, tuple(changes)) for zone, changes in sorted(by_zone.items()))
    return tuple(anywhere), zones, tuple(counts), choice


def drains(session: Session, job_id: str) -> tuple[tuple[str, float], ...]:
    """The instances drained before a hop (``DrainInstance``), and when: the first drain of each counts."""
    rows = session.execute(select(Instance.name, func.min(Event.at)).join(Instance, Event.instance_id == Instance.id)
                           .where(Event.job_id == job_id, Event.entity == "note",
                                  Event.to_status == policy.DRAIN_EVENT).group_by(Instance.name))
    return tuple((str(name), float(at)) for name, at in rows)


def spot_forecast(provider: Provider) -> bool:
    """Whether the provider's answer is a forecast that what the job's VMs meet overrules (GCE's advice)."""
    return isinstance(provider, SupportsSpotCapacity) and provider.spot_capacity_forecast


def spot_available(provider: Provider, job_id: str, slots: Sequence[Slot]) -> bool | None:
    """The provider's answer for the job's spot slots, where it can say (replayed trace, GCE capacity advice)."""
    if not isinstance(provider, SupportsSpotCapacity):
        return None
    return provider.spot_capacity(job_id, [s for s in slots if s.spot])


def spot_available_by_gpu(provider: Provider, job_id: str, di: DeadlineInputs | None) -> dict[str, bool] | None:
    """The provider's answer for each GPU type of ``policy.also_gpus`` (its spot slots there), where it can say."""
    if di is None or not di.markets or not isinstance(provider, SupportsSpotCapacity):
        return None
    answers = {m.gpu: provider.spot_capacity(job_id, list(m.slots)) for m in di.markets}
    return {gpu: up for gpu, up in answers.items() if up is not None}


def spot_count(provider: Provider, job_id: str, slots: Sequence[Slot],
               observed: Mapping[str, ObservedInstance]) -> int | None:
    """How many of the job's spot VMs the provider says could be had now, where it counts them (a replayed trace;
    GCE's advice, asked for the spot slots that hold no live spot VM, plus those that do)."""
    if not isinstance(provider, SupportsSpotCapacity):
        return None
    spot = [s for s in slots if s.spot]
    if not provider.spot_count_of_more:
        return provider.spot_capacity_count(job_id, spot)
    held = {(o.role, o.index) for o in observed.values()
            if o.spot and not o.preempted and o.state in (ObservedState.PENDING, ObservedState.RUNNING)}
    free = [s for s in spot if (s.role, s.index) not in held]
    more = provider.spot_capacity_count(job_id, free) if free else 0
    return None if more is None else len(spot) - len(free) + more


def spot_available_by_zone(provider: Provider, job_id: str, slots: Sequence[Slot]) -> dict[str, bool] | None:
    """The provider's answer zone by zone for the job's spot slots, where it can say (GCE's advice per zone)."""
    if not isinstance(provider, SupportsSpotCapacity):
        return None
    return provider.spot_capacity_by_zone(job_id, [s for s in slots if s.spot])


def spot_market(spec: JobSpec) -> str | None:
    """What decides whether a spot VM of this job can be had, as a key that jobs share: the cloud project (its
    quota), the zones and the GPU types. None where there is no market to learn across jobs: the local provider
    (each job replays its own slice of a trace, or none) and the user's own machines."""
    gce = spec.provider.as_gce()
    if gce is None:
        return None
    gpus = {w.gpu for w in spec.cluster.workers} if spec.cluster else set(spec.search.gpus if spec.search else ())
    return f"gce/{gce.project}/{','.join(sorted(gce.zones))}/{','.join(sorted(gpus))}"


def _market_of(job: Job, cache: DeadlineCache) -> str | None:
    markets = cache.markets
    if job.id not in markets:
        if len(markets) >= cache.max_cached:
            markets.clear()
        try:
            markets[job.id] = spot_market(validate_spec(yaml.safe_load(job.spec_yaml)))
        except (SpecError, yaml.YAMLError):  # one an older version wrote that no longer validates: nothing to learn
            markets[job.id] = None
    return markets[job.id]


def spot_before(session: Session, job: Job, spec: JobSpec, now: float, cache: DeadlineCache | None = None
                ) -> tuple[tuple[bool, float], ...]:
    """The stretches of spot capacity that other jobs in this job's spot market saw end within the
    ``policy.HISTORY_H`` hours before it started, (available, seconds) each, oldest first: the history the
    simulator gives the deadline policy. A stretch counts only between two changes one job recorded (its first
    record is where it began to look, not where a stretch began); jobs that looked at the same time each count."""
    market = spot_market(spec)
    if market is None:
        return ()
    cache = _or_fresh(cache)
    before = cache.before
    if job.id in before:
        return before[job.id]
    if len(before) >= cache.max_cached:
        before.clear()
    started = job.started_at if job.started_at is not None else now
    kinds = {v: k for k, v in policy.SPOT_SEEN_EVENTS.items()}
    rows = session.execute(select(Event.job_id, Event.at, Event.to_status).where(
        Event.job_id != job.id, Event.entity == "note", Event.to_status.in_(list(kinds)),
        Event.at >= started - policy.HISTORY_H * 3600, Event.at < started).order_by(Event.job_id, Event.at, Event.id))
    by_job: dict[str, list[tuple[float, bool]]] = {}
    for job_id, at, what in rows:
        by_job.setdefault(str(job_id), []).append((float(at), kinds[what]))
    others = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(list(by_job))))}
    mine = {job_id for job_id in by_job if job_id in others and _market_of(others[job_id], cache) == market}
    stretches = [(start, available, end - start) for job_id, changes in by_job.items() if job_id in mine
                 for (start, available), (end, _) in pairwise(changes[1:])]
    found = tuple((available, seconds) for _, available, seconds in sorted(stretches))
    if job.started_at is not None:
        before[job.id] = found
    return found
