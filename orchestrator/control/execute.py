"""Carry out the reconciler's actions: record intent, call the provider / transport, record the outcome.

Cloud calls never run inside an open DB transaction: intent is committed first ("requested X"), then
the call, then the outcome, so a crash in between is visible to the next pass and reconciled.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from orchestrator.catalog import region_of
from orchestrator.control.actions import (
    Action,
    CreateInstance,
    DeleteInstance,
    PrepareInstance,
    RestartTraining,
    SetInstanceStatus,
    SetJobStatus,
    StartTask,
)
from orchestrator.control.backends import Backend
from orchestrator.control.revocations import revoke_after_s
from orchestrator.paths import jobs_dir
from orchestrator.providers.base import (
    AuthError,
    CapacityError,
    InstanceRequest,
    InvalidRequestError,
    ObservedInstance,
    ProviderError,
    QuotaError,
    Role,
    SupportsOwnPricing,
    TransientError,
    instance_name,
)
from orchestrator.slots import Slot
from orchestrator.spec import BuiltinTraining, CommandTraining, JobSpec, LocalProvider, TrainingMode
from orchestrator.storage.base import NOTICES, JobStorage
from orchestrator.store import queries
from orchestrator.store.models import Instance, Job
from orchestrator.store.status import EndReason, InstanceStatus, JobStatus
from orchestrator.transport.base import Endpoint, ProcState, TransportError

log = logging.getLogger(__name__)
TASK = "task"  # the process name of the training task on every instance
SYNC = "storage-sync"  # beside it when the job's storage is remote (gs://): mirrors ./storage
SEED_TIMEOUT_S = 120.0


@dataclass
class JobContext:
    session: Session
    job: Job
    spec: JobSpec
    slots: list[Slot]
    backend: Backend
    storage: JobStorage
    observed: dict[str, ObservedInstance]
    emulation_sleep: Callable[[str | None, int], float]  # (gpu, batch) -> extra seconds per step (local)


def execute(ctx: JobContext, actions: list[Action]) -> None:
    for action in actions:
        try:
            _one(ctx, action)
        except ProviderError as exc:
            # One failed call must not stop the pass; the next pass sees the world and tries again.
            ctx.session.rollback()
            queries.note(ctx.session, ctx.job.id, "provider_error", f"{type(exc).__name__}: {exc.message}")
            ctx.session.commit()
            if isinstance(exc, AuthError | InvalidRequestError):
                _fail_job(ctx, f"{type(exc).__name__}: {exc.message}")
                return
        except (TransportError, TimeoutError) as exc:
            ctx.session.rollback()
            queries.note(ctx.session, ctx.job.id, "transport_error", f"{type(action).__name__}: {exc}")
            ctx.session.commit()


def _fail_job(ctx: JobContext, reason: str) -> None:
    if ctx.job.status not in (JobStatus.TEARING_DOWN, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
        ctx.job.outcome = JobStatus.FAILED.value
        queries.switch_status(ctx.session, ctx.job, JobStatus.TEARING_DOWN, reason)
        ctx.session.commit()


def _instance(ctx: JobContext, name: str) -> Instance:
    inst = next((i for i in ctx.job.instances if i.name == name), None)
    if inst is None:
        raise LookupError(f"no instance {name} in job {ctx.job.id}")
    observed = ctx.observed.get(name)
    if observed is not None and observed.zone != inst.zone:
        # Created in a fallback zone by a pass that died before recording it: adopt the VM where it is,
        # or its delete would go to the wrong zone (not found there: "deleted") and leave it running.
        queries.note(ctx.session, ctx.job.id, "zone_fallback",
                     f"{name} found in {observed.zone}, recorded in {inst.zone}", instance_id=inst.id)
        inst.zone = observed.zone
    return inst


def _one(ctx: JobContext, action: Action) -> None:
    s = ctx.session
    match action:
        case SetJobStatus(status=status, reason=reason, outcome=outcome):
            if outcome is not None:
                ctx.job.outcome = outcome.value
            queries.switch_status(s, ctx.job, status, reason)
            s.commit()
        case SetInstanceStatus(name=name, status=status, reason=reason, end_reason=end_reason):
            inst = _instance(ctx, name)
            if end_reason is not None and inst.end_reason is None:
                inst.end_reason = end_reason.value
            queries.switch_status(s, inst, status, reason)
            s.commit()
        case CreateInstance():
            _create(ctx, action)
        case PrepareInstance(name=name):
            inst = _instance(ctx, name)
            observed = ctx.observed[name]
            ep = ctx.backend.endpoint(observed)
            ctx.backend.transport.wait_reachable(ep, timeout_s=120)
            _push_files(ctx, ep)
            if ctx.storage.local_path() is None:
                _seed_storage(ctx, ep)
            inst.host = observed.internal_host or observed.host
            queries.switch_status(s, inst, InstanceStatus.READY, "reachable; job files pushed")
            s.commit()
        case StartTask(name=name, reason=reason):
            inst = _instance(ctx, name)
            ep = ctx.backend.endpoint(ctx.observed[name])
            t = ctx.backend.transport
            if ctx.storage.local_path() is None:
                writes = _writes_job_files(ctx.spec, inst)
                t.start(ep, SYNC, [ctx.backend.python, "jobs/storage_sync.py", "--uri", ctx.storage.uri, "--local",
                                   "storage", "--interval", "1"] + ([] if writes else ["--pull-only"]),
                        ctx.backend.task_env)
            t.write(ep, "task.json", json.dumps(_task_config(ctx, inst), indent=1))
            t.start(ep, TASK, _task_argv(ctx.spec, ctx.backend.python), ctx.backend.task_env)
            if inst.status != InstanceStatus.TRAINING:
                queries.switch_status(s, inst, InstanceStatus.TRAINING, reason)
            else:
                queries.note(s, ctx.job.id, "task_restarted", reason, instance_id=inst.id)
            s.commit()
        case RestartTraining(reason=reason):
            for inst in ctx.job.instances:
                if inst.status == InstanceStatus.TRAINING and inst.name in ctx.observed:
                    ctx.backend.transport.stop(ctx.backend.endpoint(ctx.observed[inst.name]), TASK)
                    queries.switch_status(s, inst, InstanceStatus.READY, f"restart training: {reason}")
            ctx.job.restarts += 1
            queries.note(s, ctx.job.id, "restart", f"training restarts from the latest checkpoint: {reason}")
            s.commit()
        case DeleteInstance(name=name, reason=reason, end_reason=end_reason):
            inst = _instance(ctx, name)
            if end_reason is not None and inst.end_reason is None:
                inst.end_reason = end_reason.value
            queries.switch_status(s, inst, InstanceStatus.DELETING, reason)
            s.commit()  # intent first: a crash from here on leaves DELETING, which the next pass finishes
            ctx.backend.provider.delete(name, inst.zone)
            queries.switch_status(s, inst, InstanceStatus.DELETED, "deleted")
            s.commit()


def _create(ctx: JobContext, action: CreateInstance) -> None:
    s = ctx.session
    slot = action.slot
    name = instance_name(ctx.job.id, slot.role, slot.index, action.generation)
    inst = next((i for i in ctx.job.instances if i.name == name), None)
    now = time.time()
    if inst is None:
        inst = Instance(
            job_id=ctx.job.id, name=name, role=slot.role.value, slot_index=slot.index, generation=action.generation,
            gpu=slot.gpu, machine_type=slot.machine_type, zone=action.zones[0], spot=action.spot,
            price_per_hour=slot.price(action.spot), batch=slot.batch, port=ctx.backend.task_port(action.port),
            status=InstanceStatus.REQUESTED.value, status_reason=action.reason, requested_at=now, updated_at=now,
        )
        s.add(inst)
        s.flush()
        queries.note(s, ctx.job.id, "requested", action.reason, instance_id=inst.id, now=now)
        s.commit()  # intent first
    last_error: ProviderError | None = None
    ctx.backend.ensure_network()  # e.g. the firewall rule that keeps the gRPC ports inside the cluster
    shared = ctx.storage.local_path()
    metadata = ctx.backend.instance_metadata(ctx.job.id, name, ctx.storage)
    if shared is not None:
        # Where the emulated shutdown script reports a preemption notice (instances that share this disk).
        metadata["notice-file"] = str(shared / NOTICES / name)
    exhausted_regions: set[str] = set()  # a regional quota is spent: its other zones cannot help
    for zone in action.zones:
        if region_of(zone) in exhausted_regions:
            continue
        request = InstanceRequest(
            name=name, job_id=ctx.job.id, role=slot.role, index=slot.index, generation=action.generation, zone=zone,
            machine_type=slot.machine_type, spot=action.spot, gpu=slot.gpu, gpu_count=1 if slot.gpu else 0,
            price_per_hour=inst.price_per_hour,
            metadata=metadata,
            revoke_after_s=_revoke_after(ctx, slot, action, now),
        )
        try:
            ctx.backend.provider.create(request)
        except (CapacityError, QuotaError) as exc:
            last_error = exc
            if isinstance(exc, QuotaError):
                exhausted_regions.add(exc.region or region_of(zone))
                why = f"{zone}: quota {exc.metric or '?'} exhausted in {exc.region}: {exc.message}; next region"
                queries.note(s, ctx.job.id, "quota", why, instance_id=inst.id)
            else:
                queries.note(s, ctx.job.id, "stockout", f"{zone}: {exc.message}; trying the next allowed zone",
                             instance_id=inst.id)
            s.commit()
            continue
        except TransientError as exc:
            queries.note(s, ctx.job.id, "provider_error", f"{zone}: {exc.message} (will retry)", instance_id=inst.id)
            s.commit()
            return  # REQUESTED stays; the reconciler asks again
        provider = ctx.backend.provider
        if isinstance(provider, SupportsOwnPricing):
            own = provider.price_per_hour(name)
            if own is not None:
                inst.price_per_hour = own  # e.g. an on-prem host's price from the inventory, not a price book
        if zone != inst.zone:
            queries.note(s, ctx.job.id, "zone_fallback", f"{name} created in {zone} instead of {inst.zone}",
                         instance_id=inst.id)
            inst.zone = zone
        queries.switch_status(s, inst, InstanceStatus.PROVISIONING, "create accepted")
        s.commit()
        return
    inst.end_reason = EndReason.CREATE_FAILED.value
    msg = last_error.message if last_error else "no zone to try"
    queries.switch_status(s, inst, InstanceStatus.FAILED, f"every allowed zone refused: {msg}")
    s.commit()


def _revoke_after(ctx: JobContext, slot: Slot, action: CreateInstance, now: float) -> float | None:
    if not isinstance(ctx.spec.provider, LocalProvider):
        return None
    return revoke_after_s(ctx.spec.provider, slot.role, slot.index, action.generation, slot.gpu, action.zones[0],
                          action.spot, ctx.job.started_at, now)


def _push_files(ctx: JobContext, ep: Endpoint) -> None:
    training = ctx.spec.training
    if isinstance(training, CommandTraining):
        for path in training.files:
            ctx.backend.transport.put(ep, path, path.name)
    else:
        ctx.backend.transport.put(ep, jobs_dir(), "jobs")


def _task_argv(spec: JobSpec, python: str) -> list[str]:
    if isinstance(spec.training, CommandTraining):
        return ["/bin/sh", "-c", spec.training.command]
    return [python, "jobs/train.py", "--task", "task.json"]


def _writes_job_files(spec: JobSpec, inst: Instance) -> bool:
    """The task that writes metrics, checkpoints and the result: the async chief, or sync worker 0."""
    if spec.mode == TrainingMode.ASYNC:
        return inst.role == Role.CHIEF.value
    return inst.role == Role.WORKER.value and inst.slot_index == 0


def _seed_storage(ctx: JobContext, ep: Endpoint) -> None:
    """Pull the job's storage (notices, checkpoints, metrics so far) before a task may start there."""
    t = ctx.backend.transport
    t.start(ep, "storage-seed", [ctx.backend.python, "jobs/storage_sync.py", "--uri", ctx.storage.uri, "--local",
                                 "storage", "--once"], ctx.backend.task_env)
    deadline = time.monotonic() + SEED_TIMEOUT_S
    while time.monotonic() < deadline:
        st = t.status(ep, ["storage-seed"])["storage-seed"]
        if st.state == ProcState.EXITED:
            if st.exit_code != 0:
                raise TransportError(f"storage seed on {ep.host} exited with {st.exit_code}: cannot read "
                                     f"{ctx.storage.uri}")
            return
        time.sleep(0.2)
    raise TransportError(f"storage seed on {ep.host} did not finish in {SEED_TIMEOUT_S:.0f}s")


def cluster_addresses(ctx: JobContext) -> dict[str, list[str]]:
    """TF cluster spec: each slot's address (a replacement keeps its slot's address)."""
    latest: dict[str, Instance] = {}
    for inst in ctx.job.instances:
        if inst.end_reason == EndReason.CREATE_FAILED.value:
            continue
        if inst.slot not in latest or inst.generation > latest[inst.slot].generation:
            latest[inst.slot] = inst
    cluster: dict[str, list[str]] = {}
    for slot in ctx.slots:
        current = latest.get(slot.name)
        host = current.host if current is not None and current.host else "127.0.0.1"
        port = current.port if current is not None and current.port else 0
        cluster.setdefault(slot.role.value, []).append(f"{host}:{port}")
    if ctx.spec.mode == TrainingMode.SYNC:
        cluster = {"worker": cluster.get("worker", [])}
    return cluster


def _task_config(ctx: JobContext, inst: Instance) -> dict[str, object]:
    spec = ctx.spec
    training = spec.training
    batches = [s.batch or 128 for s in ctx.slots if s.role == Role.WORKER]
    storage = ctx.storage.local_path()
    return {
        "job_id": ctx.job.id,
        "instance": inst.name,
        "mode": spec.mode.value,
        "role": inst.role,
        "index": inst.slot_index,
        "cluster": cluster_addresses(ctx),
        "storage": str(storage) if storage is not None else "storage",  # remote: the synced local copy
        "storage_uri": ctx.storage.uri,
        "training": {
            "model": getattr(training, "model", "resnet"),
            "hparam_set": training.hparam_set,
            "problem": getattr(training, "problem", "image_cifar10"),
            "data_dir": training.data_dir if isinstance(training, BuiltinTraining) else None,
            "train_steps": training.train_steps,
            "batch_per_worker": batches,
            "checkpoint_every": training.checkpoint_every,
            "eval_every": training.eval_every,
            "log_every": training.log_every,
            "seed": spec.provider.seed if isinstance(spec.provider, LocalProvider) else 0,
        },
        "emulation": {"step_sleep_s": ctx.emulation_sleep(inst.gpu, inst.batch or 128)
                      if inst.role == Role.WORKER.value else 0.0},
    }
