"""One reconcile pass over the jobs a driver owns: claim -> observe -> decide (pure) -> dispatch, per job.

The daemon and the foreground `launch` both call ``run_pass``; a lease on each job makes sure only one
of them drives it, and an expired lease (a killed driver) lets the other take over. Each job's pass is
isolated: whatever one job raises (auth, network, provider, a forbidden transition, a corrupt row) becomes an
event on that job with a backoff (control/failures.py); the other jobs go on.

Nothing in a pass waits on the cloud: a provider with a slow API lists in the background (the pass reads its
latest snapshot) and runs its creates and deletes as operations that later passes settle
(control/operations.py). A job none of whose instances changed after that snapshot began is decided from
it; otherwise it waits for the next one (an instance missing from a listing older than its last change may
simply be newer than the listing).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import yaml
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from orchestrator.control import deadline, operations, stage_loss, torch_task
from orchestrator.control.context import Budget, fail_job
from orchestrator.control.deadline import DeadlineCache
from orchestrator.control.execute import TASK, JobContext, execute
from orchestrator.control.failures import job_failed, job_recovered
from orchestrator.control.ingest import Result, ingest_metrics, read_result
from orchestrator.control.lease import LEASE_S, LeaseLost, claim, guarded, release
from orchestrator.control.live_pace import LiveWatch
from orchestrator.control.metrics import LatencyWatch
from orchestrator.control.torch_task import torch_view
from orchestrator.costmodel.launch_plan import LaunchPlan
from orchestrator.costmodel.slots import Slot
from orchestrator.decide.actions import Action, RestartTraining, SetJobStatus
from orchestrator.decide.deadline_elastic import elastic_spot_workers
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import InstanceView, JobView, Observation
from orchestrator.model import timings
from orchestrator.model.blocks import blocked, provider_key
from orchestrator.model.instances import ObservedInstance, ProcStatus, Role
from orchestrator.model.spec import JobSpec, stored_spec
from orchestrator.model.status import FINAL_JOB, InstanceStatus, JobStatus
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.providers.operations import Snapshot, SupportsSnapshots
from orchestrator.providers.registry import Backend, backend_for
from orchestrator.storage import JobStorage, open_storage
from orchestrator.storage.base import StorageError, UnusableStorage
from orchestrator.storage.gcs_endpoint import STORAGE_ENDPOINT_ENV
from orchestrator.store import queries
from orchestrator.store.db import CLOCK
from orchestrator.store.models import Block, Job, Operation

log = logging.getLogger(__name__)

__all__ = ["LEASE_S", "DriverState", "claim", "drive", "ingest_metrics", "job_spec", "job_view", "release", "run_pass"]


@functools.lru_cache(maxsize=512)
def job_spec(spec_yaml: str) -> JobSpec:
    return stored_spec(spec_yaml)


def spec_to_yaml(spec: JobSpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False)


NEW_PER_PASS = 8  # a daemon takes on at most this many more jobs per pass (several daemons spread them)
STARTS_PER_PASS = 100  # creates and deletes one pass starts for one provider's jobs (a burst waits a pass)
SNAPSHOT_MAX_AGE_S = 300.0  # a background listing older than this is not acted on (its refresh is stuck)


@dataclass
class DriverState:
    """What a driver keeps from one pass to the next, owned by its loop (the daemon's ``run_on`` and scheduler, a
    ``launch --wait``) rather than by module globals: a driver started anew starts with a fresh one."""

    deadline: DeadlineCache = field(default_factory=DeadlineCache)  # the deadline jobs' plans and spot history
    inflight: dict[str, Future[None]] = field(default_factory=dict)  # backend key -> its group's work still running
    reported: dict[str, int] = field(default_factory=dict)  # backend key -> its listing's failed attempt reported
    live: LiveWatch = field(default_factory=LiveWatch)  # the running jobs' last look at their step times
    latency: LatencyWatch = field(default_factory=LatencyWatch)  # the newest event its latency metrics have read
    _pool: ThreadPoolExecutor | None = None

    def pool(self, threads: int) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="backend")
        return self._pool


def run_pass(session: Session, owner: str, job_ids: Sequence[str] | None = None, *, threads: int = 0,
             state: DriverState | None = None) -> list[str]:
    """Drive every job this owner may drive; returns their ids. ``state``: what the driver keeps across its
    passes (None: a pass on its own, with a fresh one).

    ``threads > 0`` (the daemon): each provider's jobs are driven in a worker thread with its own session,
    and the pass does not wait for them; a provider whose jobs are still being driven from an earlier pass
    is skipped this time, so one provider's burst never holds up the others (their leases are renewed
    anyway). No provider call in a pass waits on the cloud (see the module docstring). The pass reads the time
    from the session's clock (``store.queries.clock_of``: the wall clock unless the session was opened on another),
    and so do the backends it drives the jobs with.
    """
    state = DriverState() if state is None else state
    clock = queries.clock_of(session)
    now = clock.time()
    jobs = claim(session, owner, job_ids, now, max_new=NEW_PER_PASS if threads > 0 else None)
    ids = [j.id for j in jobs]
    groups: dict[str, tuple[Backend, list[tuple[str, str | None]]]] = {}
    for job_id, job in zip(ids, jobs, strict=True):
        if job.retry_at is not None and job.retry_at > now and not job.cancel_requested:
            continue  # backing off after failed passes
        token = job.lease_token
        try:
            backend = backend_for(job_spec(job.spec_yaml), clock)
        except Exception as exc:  # noqa: BLE001 - a bad spec row or unusable credentials: this job only
            with guarded(session, job_id, token):
                job_failed(session, job_id, "backend", exc)
            continue
        groups.setdefault(backend.key, (backend, []))[1].append((job_id, token))
    for key, (backend, group) in groups.items():
        if threads <= 0:
            _drive_group(session, backend, group, state)
            continue
        running = state.inflight.get(key)
        if running is not None and not running.done():
            log.debug("provider %s is still busy with an earlier pass; %d job(s) wait", key, len(group))
            continue
        state.inflight[key] = state.pool(threads).submit(_drive_group_alone, session.get_bind(), backend, group, state)
    return ids


def _drive_group_alone(bind: Engine | Connection, backend: Backend, group: list[tuple[str, str | None]],
                       state: DriverState) -> None:
    try:
        with Session(bind, expire_on_commit=False, info={CLOCK: backend.clock}) as session:
            _drive_group(session, backend, group, state)
    except Exception:  # noqa: BLE001 - a worker thread has no caller to raise to
        log.exception("driving the jobs of %s failed; the next pass tries again", backend.key)


def _drive_group(session: Session, backend: Backend, group: list[tuple[str, str | None]], state: DriverState
                 ) -> None:
    snapshot = _observe(session, backend, group, state.reported)
    if snapshot is None:
        return
    by_job: dict[str, dict[str, ObservedInstance]] = defaultdict(dict)
    for o in snapshot.instances:
        by_job[o.job_id][o.name] = o
    reads = GroupReads.load(session, [job_id for job_id, _ in group])
    for job_id, token in group:
        with guarded(session, job_id, token):
            try:
                job = reads.jobs.get(job_id)
                if job is None or job.lease_token != token:
                    continue  # taken over since the claim
                drive(session, job, backend, by_job.get(job_id, {}), snapshot.started_at, reads, state.deadline,
                      state.live)
                job_recovered(session, job)
            except LeaseLost as exc:
                session.rollback()
                log.warning("%s", exc)
            except Exception as exc:  # noqa: BLE001 - one job's failure stays with that job
                job_failed(session, job_id, "drive", exc)


def _observe(session: Session, backend: Backend, group: list[tuple[str, str | None]], reported: dict[str, int]
             ) -> Snapshot | None:
    """What the group's provider reports now: its background listing's latest snapshot (never waits), or one
    ``list()`` call where listing is instant (local, ssh). None: nothing to decide from this pass (the first
    listing is under way, or listing failed: each failure is an event on every job of the group, once)."""
    provider = backend.provider
    try:
        if isinstance(provider, SupportsSnapshots):
            snapshot = provider.snapshot()
        else:
            started = backend.clock.time()
            snapshot = Snapshot(tuple(provider.list([job_id for job_id, _ in group])), started)
    except Exception as exc:  # noqa: BLE001 - each job of the group gets the error, with its backoff
        snapshot = Snapshot((), backend.clock.time(), exc, attempt=-1)
    if snapshot is None:
        return None
    if snapshot.error is not None:
        if snapshot.attempt < 0 or reported.get(backend.key) != snapshot.attempt:
            reported[backend.key] = snapshot.attempt
            for job_id, token in group:
                with guarded(session, job_id, token):
                    job_failed(session, job_id, "list", snapshot.error)
        return None
    if snapshot.age_s(backend.clock.time()) > SNAPSHOT_MAX_AGE_S:
        log.warning("the latest listing of %s is %.0fs old; its jobs wait for a newer one", backend.key,
                    snapshot.age_s(backend.clock.time()))
        return None
    return snapshot


@dataclass
class GroupReads:
    """What a pass reads for all of one provider's jobs at once: a query each, not one per job.

    The jobs are read afresh with their instances (``populate_existing``): a Job kept in the session's
    identity map since an earlier pass would otherwise show the instances as they were then, and a create
    would record one of them twice (the unique name then fails the whole pass)."""

    jobs: dict[str, Job]
    plans: dict[str, LaunchPlan]
    costs: dict[str, float]
    pending: dict[str, list[tuple[str, Operation]]]
    _blocks: dict[str, list[Block]] = field(default_factory=dict)
    starts: Budget = field(default_factory=lambda: Budget(STARTS_PER_PASS))

    @classmethod
    def load(cls, session: Session, job_ids: list[str]) -> GroupReads:
        return cls(queries.jobs_with_instances(session, job_ids), queries.latest_plans(session, job_ids),
                   queries.job_costs(session, job_ids), queries.pending_operations(session, job_ids))

    def blocks(self, session: Session, spec: JobSpec) -> list[Block]:
        """The provider's active blocks, read once per pass; a block a job adds during it joins the list."""
        key = provider_key(spec)
        if key not in self._blocks:
            self._blocks[key] = queries.active_blocks(session, key)
        return self._blocks[key]


def drive(session: Session, job: Job, backend: Backend, observed: dict[str, ObservedInstance],
          seen_at: float | None = None, reads: GroupReads | None = None, cache: DeadlineCache | None = None,
          live: LiveWatch | None = None) -> None:
    """One job's pass; ``seen_at``: when the listing ``observed`` comes from began; ``reads``: the group's;
    ``cache``: the driver's deadline cache (``DriverState.deadline``; None: planned afresh); ``live``: its last
    look at the running jobs' step times (``DriverState.live``; None: no look)."""
    reads = reads or GroupReads.load(session, [job.id])
    spec = job_spec(job.spec_yaml)
    plan = reads.plans.get(job.id) or queries.job_plan(session, job, spec, step_model_for(spec))  # stored at launch
    slots = list(plan.slots)
    storage = _open_storage(job)
    result, result_error = _ingest(session, job, storage, slots)
    if live is not None:  # the step times just read: the pace against the plan, the calibration (live_pace.py)
        live.look(session, job, spec, slots, backend.clock.time())
    ctx = JobContext(session, job, spec, slots, backend, storage, observed, emulation(spec),
                     blocks=reads.blocks(session, spec) if spec.provider.is_cloud else None, starts=reads.starts)
    if isinstance(storage, UnusableStorage):
        _storage_failed(ctx, storage.error)  # decided now; the teardown below deletes the instances without it
    operations.settle(ctx, reads.pending.get(job.id, []))  # what the provider answered since the last pass
    if seen_at is not None and _newer_than_view(job, observed, seen_at):
        return  # decided from the next listing
    now = backend.clock.time()
    view = job_view(session, job, spec, slots, now, backend.stable_addresses, cost=reads.costs.get(job.id),
                    cache=cache)
    obs = Observation(instances=observed, procs=observe_tasks(job, backend, observed), notices=_notices(job, storage),
                      result=result.raw if result is not None else None, payload_error=result_error,
                      failed_zones=blocked_zones(session, spec, slots, ctx.blocks),
                      spot_available=deadline.spot_available(backend.provider, job.id, slots)
                      if view.deadline_inputs is not None else None,
                      spot_by_zone=deadline.spot_available_by_zone(backend.provider, job.id, slots)
                      if view.deadline_inputs is not None else None,
                      spot_forecast=deadline.spot_forecast(backend.provider),
                      spot_count=deadline.spot_count(backend.provider, job.id, slots, observed)
                      if view.deadline_inputs is not None and elastic_spot_workers(spec) else None,
                      spot_by_gpu=deadline.spot_available_by_gpu(backend.provider, job.id, view.deadline_inputs))
    actions = reconcile(view, obs, now)
    if any(isinstance(a, RestartTraining) for a in actions):
        actions = _unless_storage_broken(ctx, actions)
    if actions:
        log.debug("job %s: %s", job.id, actions)
    execute(ctx, actions)


def _open_storage(job: Job) -> JobStorage:
    """The job's storage, or, when it cannot be opened (refused, a file in the way, no permission), one that
    reads as empty and says why on every write: a pass never fails on it, so the job fails at once, not after
    every pass of its backoff has failed."""
    try:
        return job_storage(job.storage_uri, job.id)
    except StorageError as exc:
        return UnusableStorage(job.storage_uri, exc)


def _storage_failed(ctx: JobContext, exc: StorageError) -> None:
    if ctx.job.status in (JobStatus.TEARING_DOWN, *FINAL_JOB):
        return
    log.warning("job %s: %s", ctx.job.id, exc.message)
    fail_job(ctx, exc.message[:500])


def _unless_storage_broken(ctx: JobContext, actions: list[Action]) -> list[Action]:
    """A task that exited is restarted only if its storage can still be written: on a full disk (ENOSPC) or a
    read-only one every restart would fail the same way until the restarts run out; the job fails now, saying
    so."""
    try:
        ctx.storage.check_writable()
    except StorageError as exc:
        log.warning("job %s: %s", ctx.job.id, exc.message)
        return [SetJobStatus(JobStatus.TEARING_DOWN, exc.message[:500], JobStatus.FAILED)]
    return actions


def _ingest(session: Session, job: Job, storage: JobStorage, slots: list[Slot]) -> tuple[Result | None, str | None]:
    """What the payload wrote since the last pass (metrics, events, its result); untrusted, never raises."""
    try:
        ingest_metrics(session, job, storage, slots)
        torch_task.ingest_events(session, job, storage)  # PyTorch: world shrink / grow, checkpoint on notice
    except (OSError, ValueError) as exc:  # e.g. metrics.jsonl is a directory: the payload's doing, not ours
        session.rollback()
        queries.note(session, job.id, "bad_metrics", f"payload output cannot be read: {exc}"[:500])
    result, result_error = read_result(storage)
    if result is not None and job.accuracy is None:
        job.accuracy = result.accuracy
        job.final_step = result.step
        job.final_loss = result.loss
    session.commit()
    return result, result_error


def _notices(job: Job, storage: JobStorage) -> frozenset[str]:
    try:
        return frozenset(storage.notices())
    except (OSError, ValueError) as exc:  # notices/ replaced by a file: no notice, the provider's view decides
        log.info("job %s: notices cannot be listed: %s", job.id, exc)
        return frozenset()


def _newer_than_view(job: Job, observed: dict[str, ObservedInstance], seen_at: float) -> bool:
    """Did an instance change after the listing began, and is it absent from it? Then the listing cannot say
    whether it is gone, and nothing is decided from it (never a deletion older than what it contradicts)."""
    return any(i.status != InstanceStatus.DELETED.value and i.name not in observed and i.updated_at >= seen_at
               for i in job.instances)


_gcs_clients: dict[str, Any] = {}  # GCS endpoint -> the process's one storage client for it
_gcs_lock = threading.Lock()


def job_storage(uri: str, job_id: str) -> JobStorage:
    """A job's storage, made once per process (not per pass); every job on GCS shares one client."""
    endpoint = os.environ.get(STORAGE_ENDPOINT_ENV, "") if uri.startswith("gs://") else ""
    return _job_storage(uri, job_id, endpoint)


@functools.lru_cache(maxsize=4096)
def _job_storage(uri: str, job_id: str, endpoint: str) -> JobStorage:
    if not uri.startswith("gs://"):
        return open_storage(uri, job_id)
    from orchestrator.storage.gcs import GcsStorage, make_client  # google-cloud-storage: gs:// jobs only

    with _gcs_lock:  # a client is bound to the endpoint it was made for (an emulator's, in tests)
        if endpoint not in _gcs_clients:
            _gcs_clients[endpoint] = make_client()
        client = _gcs_clients[endpoint]
    return GcsStorage(uri, job_id, client=client)


def blocked_zones(session: Session, spec: JobSpec, slots: list[Slot],
                  blocks: list[Block] | None = None) -> dict[str, tuple[str, ...]]:
    """Each slot's allowed zones that a persisted block (stockout, quota) rules out now (clouds only)."""
    if not spec.provider.is_cloud:
        return {}
    blocks = queries.active_blocks(session, provider_key(spec)) if blocks is None else blocks
    if not blocks:
        return {}
    return {s.name: tuple(z for z in s.zones if blocked(blocks, z, s.gpu)) for s in slots}


def observe_tasks(job: Job, backend: Backend, observed: dict[str, ObservedInstance]) -> dict[str, ProcStatus]:
    out: dict[str, ProcStatus] = {}
    for inst in job.instances:
        if inst.status == InstanceStatus.TRAINING.value and inst.name in observed:
            try:
                out[inst.name] = backend.transport.status(backend.endpoint(observed[inst.name]), [TASK])[TASK]
            except Exception as exc:  # an unreachable host is judged by the provider's view, not here
                log.info("cannot read task status on %s: %s", inst.name, exc)
    return out


def job_view(session: Session, job: Job, spec: JobSpec, slots: list[Slot], now: float,
             stable_addresses: bool = True, cost: float | None = None, cache: DeadlineCache | None = None) -> JobView:
    cost = queries.job_cost(session, job.id)["total"] if cost is None else cost
    instances = tuple(
        InstanceView(id=i.id, name=i.name, role=Role(i.role), index=i.slot_index, generation=i.generation,
                     status=InstanceStatus(i.status), spot=i.spot, zone=i.zone, port=i.port,
                     requested_at=i.requested_at, updated_at=i.updated_at, revoked_at=i.revoked_at,
                     end_reason=i.end_reason, gpu=i.gpu)
        for i in job.instances
    )
    zones = tuple(getattr(spec.provider, "zones", ()) or ())
    return JobView(id=job.id, status=JobStatus(job.status), outcome=job.outcome, mode=spec.mode, slots=tuple(slots),
                   instances=instances, on_revocation=spec.policy.on_revocation,
                   max_replacements=spec.policy.max_replacements, budget_usd=job.budget_usd,
                   deadline_s=job.deadline_s, started_at=job.started_at, restarts=job.restarts, cost_usd=cost,
                   cancel_requested=job.cancel_requested, zones=zones, stable_addresses=stable_addresses,
                   fatal_exits=job.fatal_exits,
                   deadline_inputs=deadline.deadline_inputs(session, job, spec, now, slots, cache),
                   notice_s=timings.notice_window_s(spec.provider),
                   **torch_view(spec, slots), **_stage_loss_view(session, job, spec, slots))


def _stage_loss_view(session: Session, job: Job, spec: JobSpec, slots: list[Slot]) -> dict[str, Any]:
    """A pipeline's lost stage: the inputs of wait-or-re-partition, and the stages it already went on without."""
    if not torch_task.is_pipeline(spec):
        return {}
    gone = stage_loss.repartitioned(session, job)
    dropped = frozenset(name for name, _ in gone)
    step, _ = queries.latest_step(session, job.id)
    inputs = stage_loss.stage_loss_inputs(spec, job.spec_yaml, slots, dropped, step)
    return {"repartitioned": gone, "stage_loss": inputs}


def emulation(spec: JobSpec) -> Callable[[str | None, int], float]:
    """(gpu, batch) -> extra seconds per step on a local worker: the job's step model's sleep (the local
    provider's, ``providers.local.step_model``: measured GPU curves, never the cost model, so the model can be
    tested on local runs; 0 elsewhere)."""
    return step_model_for(spec).sleep_s
