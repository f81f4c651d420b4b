"""Carry out the reconciler's actions: record intent, call the provider / transport, record the outcome.

Cloud calls never run inside an open DB transaction: intent is committed first ("requested X"), then
the call, then the outcome, so a crash in between is visible to the next pass and reconciled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from orchestrator.control import torch_task
from orchestrator.control.billing import provider_end_time
from orchestrator.control.keep_logs import keep_log
from orchestrator.core import task as task_schema
from orchestrator.core.actions import (
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
from orchestrator.core.blocks import block_for, blocked, provider_key
from orchestrator.core.cloud_errors import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaError,
    TransientError,
)
from orchestrator.core.instances import InstanceRequest, ObservedInstance, ProcState, Role, instance_name
from orchestrator.core.paths import jobs_dir
from orchestrator.core.policy import revoke_after_s
from orchestrator.core.slots import Slot
from orchestrator.core.spec import BuiltinTraining, CommandTraining, JobSpec, TrainingMode
from orchestrator.core.status import EndReason, InstanceStatus, JobStatus
from orchestrator.core.task import TaskConfig, TrainingSection
from orchestrator.core.torch_spec import SecretError, is_pytorch, payload_env
from orchestrator.providers.base import SupportsOwnPricing
from orchestrator.providers.registry import Backend
from orchestrator.storage.base import NOTICES, JobStorage
from orchestrator.store import queries
from orchestrator.store.models import Block, Instance, Job
from orchestrator.transport.base import Endpoint, TransportError
from orchestrator.transport.local import UnsafePathError

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
            log_action(ctx.job.id, action)
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
            queries.note(ctx.session, ctx.job.id, "transport_error", f"{type(action).__name__}: {exc}"[:500])
            ctx.session.commit()
            if isinstance(exc, UnsafePathError):  # the job's files can never be pushed as listed
                _fail_job(ctx, f"{type(exc).__name__}: {exc}"[:480])
                return


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
            until = provider_end_time(ctx.backend.provider, name) if status == InstanceStatus.DELETED else None
            queries.switch_status(s, inst, status, reason, billed_until=until)
            s.commit()
        case CreateInstance():
            _create(ctx, action)
        case PrepareInstance(name=name):
            _prepare(ctx, name)
        case StartTask(name=name, reason=reason):
            _start_task(ctx, name, reason)
        case RecordLogTail(name=name, reason=reason):
            _record_log_tail(ctx, name, reason)
        case RestartTraining(reason=reason, fatal=fatal):
            _restart(ctx, reason, fatal)
        case DeleteInstance(name=name, reason=reason, end_reason=end_reason):
            _delete(ctx, name, reason, end_reason)


def _prepare(ctx: JobContext, name: str) -> None:
    inst = _instance(ctx, name)
    observed = ctx.observed[name]
    ep = ctx.backend.endpoint(observed)
    ctx.backend.transport.wait_reachable(ep, timeout_s=120)
    _push_files(ctx, ep)
    if ctx.storage.local_path() is None:
        _seed_storage(ctx, ep)
    inst.host = observed.internal_host or observed.host
    queries.switch_status(ctx.session, inst, InstanceStatus.READY, "reachable; job files pushed")
    ctx.session.commit()


def _start_task(ctx: JobContext, name: str, reason: str) -> None:
    s = ctx.session
    inst = _instance(ctx, name)
    ep = ctx.backend.endpoint(ctx.observed[name])
    t = ctx.backend.transport
    if ctx.storage.local_path() is None:
        writes = _writes_job_files(ctx.spec, inst)
        t.start(ep, SYNC, [ctx.backend.python, "jobs/storage_sync.py", "--uri", ctx.storage.uri, "--local",
                           "storage", "--interval", "1"] + ([] if writes else ["--pull-only"]),
                ctx.backend.task_env)
    t.write(ep, "task.json", _task_config(ctx, inst).to_json())
    try:  # the spec's env: and secrets (read now, never stored) for the payload's process only
        env = {**ctx.backend.task_env, **payload_env(ctx.spec)}
    except SecretError as exc:
        _fail_job(ctx, str(exc))
        return
    t.start(ep, TASK, _task_argv(ctx.spec, ctx.backend.python), env)
    if inst.status != InstanceStatus.TRAINING:
        queries.switch_status(s, inst, InstanceStatus.TRAINING, reason)
    else:
        queries.note(s, ctx.job.id, "task_restarted", reason, instance_id=inst.id)
    s.commit()


def _restart(ctx: JobContext, reason: str, fatal: bool) -> None:
    s = ctx.session
    ctx.job.fatal_exits += 1 if fatal else 0
    for inst in ctx.job.instances:
        if inst.status == InstanceStatus.TRAINING and inst.name in ctx.observed:
            ctx.backend.transport.stop(ctx.backend.endpoint(ctx.observed[inst.name]), TASK)
            queries.switch_status(s, inst, InstanceStatus.READY, f"restart training: {reason}")
    ctx.job.restarts += 1
    queries.note(s, ctx.job.id, "restart", f"training restarts from the latest checkpoint: {reason}")
    s.commit()


def _delete(ctx: JobContext, name: str, reason: str, end_reason: EndReason | None) -> None:
    s = ctx.session
    inst = _instance(ctx, name)
    if end_reason is not None and inst.end_reason is None:
        inst.end_reason = end_reason.value
    queries.switch_status(s, inst, InstanceStatus.DELETING, reason)
    s.commit()  # intent first: a crash from here on leaves DELETING, which the next pass finishes
    keep_log(ctx.backend, ctx.storage, ctx.observed.get(name), name, TASK)  # the disk goes with it
    ctx.backend.provider.delete(name, inst.zone)
    queries.switch_status(s, inst, InstanceStatus.DELETED, "deleted",
                          billed_until=provider_end_time(ctx.backend.provider, name))
    s.commit()


def log_action(job_id: str, action: Action) -> None:
    """The daemon's log: one line per action on a job, naming the job and the instance."""
    match action:
        case SetInstanceStatus(name=name, status=status, reason=reason):
            log.info("job %s instance %s: %s (%s)", job_id, name, status.value, reason)
        case DeleteInstance(name=name, reason=reason):
            log.info("job %s instance %s: deleted (%s)", job_id, name, reason)
        case StartTask(name=name, reason=reason):
            log.info("job %s instance %s: task started (%s)", job_id, name, reason)
        case RestartTraining(reason=reason):
            log.info("job %s: training restarted (%s)", job_id, reason)
        case SetJobStatus(status=status, reason=reason, outcome=outcome):
            tail = f" -> {outcome.value}" if outcome is not None else ""
            log.info("job %s: %s%s (%s)", job_id, status.value, tail, reason)
        case RecordLogTail(name=name):
            log.info("job %s instance %s: log tail kept", job_id, name)
        case PrepareInstance(name=name):
            log.info("job %s instance %s: ready (files pushed)", job_id, name)


def _cloud_deadline(ctx: JobContext, slot: Slot, now: float) -> int | None:
    """The VM's cloud-side time limit from what is left of the job's deadline and budget (see gce_requests)."""
    if ctx.spec.provider.kind != "gce":
        return None
    from orchestrator.providers.gce.requests import cloud_max_run_s  # pulls google-cloud-compute: gce only

    job = ctx.job
    spent = queries.job_cost(ctx.session, job.id)["total"] if job.budget_usd is not None else 0.0
    return cloud_max_run_s(deadline_s=job.deadline_s, elapsed_s=now - (job.started_at or now),
                           budget_usd=job.budget_usd, spent_usd=spent,
                           cluster_usd_per_hour=sum(s.price_per_hour for s in ctx.slots), flex_start=slot.flex_start)


def _record_log_tail(ctx: JobContext, name: str, reason: str, lines: int = 20) -> None:
    observed = ctx.observed.get(name)
    try:
        data = ctx.backend.transport.read_log(ctx.backend.endpoint(observed), TASK) if observed else b""
    except (TransportError, OSError) as exc:
        data = f"(log unreadable: {exc})".encode()
    tail = "\n".join(data.decode(errors="replace").splitlines()[-lines:]) or "(empty log)"
    inst = _instance(ctx, name)
    queries.note(ctx.session, ctx.job.id, "log_tail", f"{reason}; last lines of {name}:\n{tail}"[-500:],
                 instance_id=inst.id)
    ctx.session.commit()


def _requested(ctx: JobContext, action: CreateInstance, name: str, now: float) -> Instance:
    """The instance's row, recorded (and committed) before the create call: intent first."""
    inst = next((i for i in ctx.job.instances if i.name == name), None)
    if inst is not None:
        return inst
    slot = action.slot
    inst = Instance(
        job_id=ctx.job.id, name=name, role=slot.role.value, slot_index=slot.index, generation=action.generation,
        gpu=slot.gpu, machine_type=slot.machine_type, zone=action.zones[0], spot=action.spot,
        price_per_hour=slot.price(action.spot), batch=slot.batch, port=ctx.backend.task_port(action.port),
        status=InstanceStatus.REQUESTED.value, status_reason=action.reason, requested_at=now, updated_at=now,
    )
    ctx.session.add(inst)
    ctx.session.flush()
    queries.note(ctx.session, ctx.job.id, "requested", action.reason, instance_id=inst.id, now=now)
    ctx.session.commit()
    return inst


def _metadata(ctx: JobContext, name: str) -> dict[str, str]:
    metadata = ctx.backend.instance_metadata(ctx.job.id, name, ctx.storage)
    shared = ctx.storage.local_path()
    if shared is not None:
        # Where the emulated shutdown script reports a preemption notice (instances that share this disk).
        metadata["notice-file"] = str(shared / NOTICES / name)
    metadata.update(ctx.backend.request_metadata(ctx.spec, ctx.slots, ctx.emulation_sleep))  # local: progress clock
    return metadata


def _accepted(ctx: JobContext, inst: Instance, action: CreateInstance, zone: str) -> None:
    s = ctx.session
    provider = ctx.backend.provider
    if isinstance(provider, SupportsOwnPricing):
        own = provider.price_per_hour(inst.name)
        if own is not None:
            inst.price_per_hour = own  # e.g. an on-prem host's price from the inventory, not a price book
    if zone != inst.zone:
        queries.note(s, ctx.job.id, "zone_fallback", f"{inst.name} created in {zone} instead of {inst.zone}",
                     instance_id=inst.id)
        inst.zone = zone
    queries.switch_status(s, inst, InstanceStatus.PROVISIONING, "create accepted")
    s.commit()
    log.info("job %s instance %s: %s in %s (%s)", ctx.job.id, inst.name,
             "replaced" if action.generation > 0 else "created", zone, action.reason)


def _create(ctx: JobContext, action: CreateInstance) -> None:
    s = ctx.session
    slot = action.slot
    name = instance_name(ctx.job.id, slot.role, slot.index, action.generation)
    now = time.time()
    inst = _requested(ctx, action, name, now)
    last_error: ProviderError | None = None
    ctx.backend.ensure_network()  # e.g. the firewall rule that keeps the gRPC ports inside the cluster
    metadata = _metadata(ctx, name)
    blocks = _blocks(ctx)
    skipped: list[str] = []
    for zone in action.zones:
        why_blocked = blocked(blocks, zone, slot.gpu)
        if why_blocked is not None:  # a stockout or quota seen earlier (this pass or another job's)
            skipped.append(f"{zone}: {why_blocked}")
            continue
        request = InstanceRequest(
            name=name, job_id=ctx.job.id, role=slot.role, index=slot.index, generation=action.generation, zone=zone,
            machine_type=slot.machine_type, spot=action.spot, gpu=slot.gpu, gpu_count=slot.gpu_count if slot.gpu else 0,
            price_per_hour=inst.price_per_hour,
            metadata=metadata,
            revoke_after_s=_revoke_after(ctx, slot, action, now),
            max_run_s=_cloud_deadline(ctx, slot, now), flex_start=slot.flex_start and not action.spot,
        )
        try:
            ctx.backend.provider.create(request)
        except (CapacityError, QuotaError) as exc:
            last_error = exc
            if isinstance(exc, QuotaError):
                why = f"{zone}: quota {exc.metric or '?'} exhausted in {exc.region}: {exc.message}; next region"
                queries.note(s, ctx.job.id, "quota", why, instance_id=inst.id)
            else:
                queries.note(s, ctx.job.id, "stockout", f"{zone}: {exc.message}; trying the next allowed zone",
                             instance_id=inst.id)
            _remember_block(ctx, blocks, exc, zone, slot.gpu)
            s.commit()
            continue
        except TransientError as exc:
            queries.note(s, ctx.job.id, "provider_error", f"{zone}: {exc.message} (will retry)", instance_id=inst.id)
            s.commit()
            return  # REQUESTED stays; the reconciler asks again
        _accepted(ctx, inst, action, zone)
        return
    inst.end_reason = EndReason.CREATE_FAILED.value
    msg = "; ".join(([last_error.message] if last_error else []) + skipped) or "no zone to try"
    queries.switch_status(s, inst, InstanceStatus.FAILED, f"every allowed zone refused: {msg}"[:500])
    s.commit()
    log.warning("job %s instance %s: create failed in every allowed zone: %s", ctx.job.id, name, msg)


def _blocks(ctx: JobContext) -> list[Block]:
    """Blocks apply to clouds (GCE); an inventory's hosts free up as jobs end, so ssh and local keep none."""
    if not ctx.spec.provider.is_cloud:
        return []
    return queries.active_blocks(ctx.session, provider_key(ctx.spec))


def _remember_block(ctx: JobContext, blocks: list[Block], exc: CapacityError | QuotaError, zone: str,
                    gpu: str | None) -> None:
    if not ctx.spec.provider.is_cloud:
        return
    scope, location, resource, ttl = block_for(exc, zone, gpu)
    blocks.append(queries.add_block(ctx.session, provider_key(ctx.spec), scope, location, resource, exc.message, ttl))
    log.warning("job %s: %s %s blocked for %s for %.0fs: %s", ctx.job.id, scope, location, resource, ttl,
                exc.message)


def _revoke_after(ctx: JobContext, slot: Slot, action: CreateInstance, now: float) -> float | None:
    local = ctx.spec.provider.as_local()
    if local is None:
        return None
    return revoke_after_s(local, slot.role, slot.index, action.generation, slot.gpu, action.zones[0],
                          action.spot, ctx.job.started_at, now)


def _push_files(ctx: JobContext, ep: Endpoint) -> None:
    training = ctx.spec.training
    if isinstance(training, CommandTraining):
        for path in training.files:
            ctx.backend.transport.put(ep, path, path.name)
    else:
        ctx.backend.transport.put(ep, jobs_dir(), "jobs")
        # The task.json schema the payload reads: the controller's own definition, so the two always agree.
        ctx.backend.transport.put(ep, Path(task_schema.__file__), "jobs/task_schema.py")
        for path in torch_task.push_paths(ctx.spec):  # run: the user's script beside jobs/
            ctx.backend.transport.put(ep, path, path.name)


def _task_argv(spec: JobSpec, python: str) -> list[str]:
    if isinstance(spec.training, CommandTraining):
        return ["/bin/sh", "-c", spec.training.command]
    if is_pytorch(spec):
        return torch_task.node_argv(python)
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


def _task_config(ctx: JobContext, inst: Instance) -> TaskConfig:
    spec = ctx.spec
    training = spec.training
    batches = tuple(s.batch or 128 for s in ctx.slots if s.role == Role.WORKER)
    storage = ctx.storage.local_path()
    local = spec.provider.as_local()
    torch = (torch_task.torch_section(spec, ctx.slots, list(ctx.job.instances), inst, sum(batches),
                                      ctx.emulation_sleep) if is_pytorch(spec) else None)
    return TaskConfig(
        job_id=ctx.job.id, instance=inst.name, mode=spec.mode.value, role=inst.role, index=inst.slot_index,
        cluster={k: tuple(v) for k, v in cluster_addresses(ctx).items()},
        storage=str(storage) if storage is not None else "storage",  # remote: the synced local copy
        storage_uri=ctx.storage.uri,
        training=TrainingSection(
            model=getattr(training, "model", "resnet"), hparam_set=training.hparam_set,
            problem=getattr(training, "problem", "image_cifar10"),
            data_dir=training.data_dir if isinstance(training, BuiltinTraining) else None,
            train_steps=training.train_steps, batch_per_worker=batches, checkpoint_every=training.checkpoint_every,
            eval_every=training.eval_every, log_every=training.log_every, seed=local.seed if local else 0),
        step_sleep_s=ctx.emulation_sleep(inst.gpu, inst.batch or 128) if inst.role == Role.WORKER.value else 0.0,
        gpu=inst.gpu if torch is not None else None, torch=torch,
    )
