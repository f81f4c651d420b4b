"""Carry out the reconciler's actions: record intent, call the provider / transport, record the outcome.

Cloud calls never run inside an open DB transaction: intent is committed first ("requested X"), then
the call, then the outcome, so a crash in between is visible to the next pass and reconciled. Creates and
deletes are operations the pass starts and later passes settle (control/operations.py): none waits.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from orchestrator.control import lighthouse, operations, stage_loss, torch_task
from orchestrator.control.calibration_fold import fold_finished_job
from orchestrator.control.context import TASK, JobContext, fail_job, instance_row
from orchestrator.costmodel.slots import DEFAULT_BATCH
from orchestrator.decide.actions import (
    Action,
    CreateInstance,
    DeleteInstance,
    DrainInstance,
    PrepareInstance,
    RecordElasticChoice,
    RecordLogTail,
    RecordSpotAvailability,
    RecordSpotCount,
    RecordStageLoss,
    RestartTraining,
    SetInstanceStatus,
    SetJobStatus,
    StartTask,
)
from orchestrator.decide.deadline import (
    DRAIN_EVENT,
    ELASTIC_CHOICE_EVENT,
    SPOT_COUNT_EVENT,
    SPOT_SEEN_EVENTS,
    ZONE_SEEN_EVENTS,
)
from orchestrator.model import task as task_schema
from orchestrator.model.cloud_errors import AuthError, InvalidRequestError, ProviderError
from orchestrator.model.instances import ProcState, Role
from orchestrator.model.paths import jobs_dir
from orchestrator.model.spec import BuiltinTraining, CommandTraining, JobSpec, TrainingMode
from orchestrator.model.status import FINAL_JOB, EndReason, InstanceStatus, JobStatus
from orchestrator.model.task import TaskConfig, TrainingSection
from orchestrator.model.torch_spec import SecretError, is_pytorch, payload_env
from orchestrator.providers.base import SupportsHostGpus
from orchestrator.store import queries
from orchestrator.store.models import Instance
from orchestrator.transport.base import Endpoint, FatalTransportError, TransportError
from orchestrator.transport.local import UnsafePathError

__all__ = ["TASK", "JobContext", "cluster_addresses", "execute", "log_action"]
log = logging.getLogger(__name__)
SYNC = "storage-sync"  # beside it when the job's storage is remote (gs://): mirrors ./storage
SEED_TIMEOUT_S = 120.0
COMMAND_SIDECAR_FILES = ("storage_sync.py", "boot_python.sh", "boot_wait.sh")  # jobs/ files a command job gets


def execute(ctx: JobContext, actions: list[Action]) -> None:
    for action in actions:
        if operations.waits(ctx, action):
            continue  # its instance's operation under way ends first; a later pass asks again
        try:
            _one(ctx, action)
            log_action(ctx.job.id, action)
        except ProviderError as exc:
            # One failed call must not stop the pass; the next pass sees the world and tries again.
            ctx.session.rollback()
            queries.note(ctx.session, ctx.job.id, "provider_error", f"{type(exc).__name__}: {exc.message}")
            ctx.session.commit()
            if isinstance(exc, AuthError | InvalidRequestError):
                fail_job(ctx, f"{type(exc).__name__}: {exc.message}")
                return
        except (TransportError, TimeoutError) as exc:
            ctx.session.rollback()
            if isinstance(exc, FatalTransportError):
                # A wrong host key or a refused login stays so on every replacement: fail now, in one line
                # that names the failure and its fix, rather than cycle through replacements.
                fail_job(ctx, str(exc)[:500])
                return
            queries.note(ctx.session, ctx.job.id, "transport_error", f"{type(action).__name__}: {exc}"[:500])
            ctx.session.commit()
            if isinstance(exc, UnsafePathError):
                fail_job(ctx, f"{type(exc).__name__}: {exc}"[:480])
                return


def _one(ctx: JobContext, action: Action) -> None:
    s = ctx.session
    match action:
        case SetJobStatus(status=status, reason=reason, outcome=outcome):
            if outcome is not None:
                ctx.job.outcome = outcome.value
            queries.switch_status(s, ctx.job, status, reason)
            s.commit()
            if status == JobStatus.SUCCEEDED:
                _fold(ctx)
            if status in FINAL_JOB and torch_task.uses_torchft(ctx.spec):
                lighthouse.stop(ctx.storage)
                lighthouse.stop_tunnels(ctx.job.id)
        case SetInstanceStatus(name=name, status=status, reason=reason, end_reason=end_reason):
            inst = instance_row(ctx, name)
            if end_reason is not None and inst.end_reason is None:
                inst.end_reason = end_reason.value
            if status in (InstanceStatus.PROVISIONING, InstanceStatus.DELETED):  # seen, or gone: its ledger's start
                operations.bill_from_provider(ctx, inst)
            until = operations.billed_until(ctx, name) if status == InstanceStatus.DELETED else None
            queries.switch_status(s, inst, status, reason, billed_until=until)
            s.commit()
            if status == InstanceStatus.DELETED and torch_task.uses_torchft(ctx.spec):
                lighthouse.stop_tunnels(ctx.job.id, only=name)  # a remote worker's way to the Lighthouse
        case CreateInstance():
            operations.create(ctx, action)
        case PrepareInstance(name=name):
            _prepare(ctx, name)
        case StartTask(name=name, reason=reason):
            _start_task(ctx, name, reason)
        case RecordLogTail(name=name, reason=reason):
            _record_log_tail(ctx, name, reason)
        case RecordStageLoss(name=name, action=what, reason=reason):
            stage_loss.record(s, ctx.job, name, what, reason)
        case RecordSpotAvailability(available=available, reason=reason, zone=zone):
            queries.note(s, ctx.job.id, (SPOT_SEEN_EVENTS if zone is None else ZONE_SEEN_EVENTS)[available], reason)
            s.commit()
        case RecordSpotCount(reason=reason):
            queries.note(s, ctx.job.id, SPOT_COUNT_EVENT, reason)
            s.commit()
        case RecordElasticChoice(reason=reason):
            queries.note(s, ctx.job.id, ELASTIC_CHOICE_EVENT, reason)
            s.commit()
        case DrainInstance(name=name, reason=reason):
            _drain(ctx, name, reason)
        case RestartTraining(reason=reason, fatal=fatal):
            _restart(ctx, reason, fatal)
        case DeleteInstance(name=name, reason=reason, end_reason=end_reason):
            operations.delete(ctx, name, reason, end_reason)


def _drain(ctx: JobContext, name: str, reason: str) -> None:
    """The drain is recorded before its notice is written: a crash in between leaves a drain whose checkpoint
    never comes, which the reconciler ends at the notice window (not a notice read as a preemption)."""
    now = ctx.clock.time()
    queries.note(ctx.session, ctx.job.id, DRAIN_EVENT, reason, instance_id=instance_row(ctx, name).id, now=now)
    ctx.session.commit()
    ctx.storage.write_notice(name, json.dumps({"at": now, "drain": True, "reason": reason}))


def _fold(ctx: JobContext) -> None:
    """The finished job's step times refine the next plan's calibration; a failed fold never fails the job."""
    try:
        fold_finished_job(ctx.session, ctx.job)
    except Exception as exc:  # noqa: BLE001 - a calibration problem is a note, never a failed pass
        ctx.session.rollback()
        queries.note(ctx.session, ctx.job.id, "calibration", f"calibration not refined: {exc}"[:500])
        ctx.session.commit()


def _prepare(ctx: JobContext, name: str) -> None:
    inst = instance_row(ctx, name)
    observed = ctx.observed[name]
    ep = ctx.backend.endpoint(observed)
    ctx.backend.transport.wait_reachable(ep, timeout_s=120)
    _push_files(ctx, ep)
    if ctx.storage.local_path() is None and not is_pytorch(ctx.spec):
        _seed_storage(ctx, ep)  # a PyTorch node's is pulled at each start of its task (_start_task)
    inst.host = observed.internal_host or observed.host
    queries.switch_status(ctx.session, inst, InstanceStatus.READY, "reachable; job files pushed")
    ctx.session.commit()


def _start_task(ctx: JobContext, name: str, reason: str) -> None:
    s = ctx.session
    inst = instance_row(ctx, name)
    ep = ctx.backend.endpoint(ctx.observed[name])
    t = ctx.backend.transport
    if ctx.storage.local_path() is None and is_pytorch(ctx.spec):
        # Every start, restarts too: a world that forms again resumes from the newest checkpoint in the bucket (a
        # lost node's notice checkpoint), which the survivors' running sidecars, pulling only at their start, lack.
        _seed_storage(ctx, ep)
    if ctx.storage.local_path() is None:
        writes = _writes_job_files(ctx.spec, inst)
        t.start(ep, SYNC, [ctx.backend.python, "jobs/storage_sync.py", "--uri", ctx.storage.uri, "--local",
                           "storage", "--interval", "1", "--instance", inst.name] + ([] if writes else ["--pull-only"])
                + (["--pull-result"] if torch_task.uses_torchft(ctx.spec) else []),
                ctx.backend.task_env)
    t.write(ep, "task.json", _task_config(ctx, inst).to_json())
    try:  # the spec's env: and secrets (read now, never stored) for the payload's process only
        env = {**ctx.backend.task_env, **payload_env(ctx.spec)}
    except SecretError as exc:
        fail_job(ctx, str(exc))
        return
    t.start(ep, TASK, _task_argv(ctx.spec, ctx.backend.python, ctx.backend.command_prefix), env)
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


def log_action(job_id: str, action: Action) -> None:
    """The daemon's log: one line per action on a job, naming the job and the instance."""
    match action:
        case SetInstanceStatus(name=name, status=status, reason=reason):
            log.info("job %s instance %s: %s (%s)", job_id, name, status.value, reason)
        case DeleteInstance(name=name, reason=reason):
            log.info("job %s instance %s: deleting (%s)", job_id, name, reason)
        case StartTask(name=name, reason=reason):
            log.info("job %s instance %s: task started (%s)", job_id, name, reason)
        case RestartTraining(reason=reason):
            log.info("job %s: training restarted (%s)", job_id, reason)
        case SetJobStatus(status=status, reason=reason, outcome=outcome):
            tail = f" -> {outcome.value}" if outcome is not None else ""
            log.info("job %s: %s%s (%s)", job_id, status.value, tail, reason)
        case RecordLogTail(name=name):
            log.info("job %s instance %s: log tail kept", job_id, name)
        case RecordStageLoss(name=name, reason=reason):
            log.info("job %s instance %s: %s", job_id, name, reason)
        case (RecordSpotAvailability(reason=reason) | RecordSpotCount(reason=reason)
              | RecordElasticChoice(reason=reason)):
            log.info("job %s: %s", job_id, reason)
        case PrepareInstance(name=name):
            log.info("job %s instance %s: ready (files pushed)", job_id, name)


def _record_log_tail(ctx: JobContext, name: str, reason: str, lines: int = 20) -> None:
    observed = ctx.observed.get(name)
    try:
        data = ctx.backend.transport.read_log(ctx.backend.endpoint(observed), TASK) if observed else b""
    except (TransportError, OSError) as exc:
        data = f"(log unreadable: {exc})".encode()
    tail = "\n".join(data.decode(errors="replace").splitlines()[-lines:]) or "(empty log)"
    inst = instance_row(ctx, name)
    queries.note(ctx.session, ctx.job.id, "log_tail", f"{reason}; last lines of {name}:\n{tail}"[-500:],
                 instance_id=inst.id)
    ctx.session.commit()


def _push_files(ctx: JobContext, ep: Endpoint) -> None:
    training = ctx.spec.training
    if isinstance(training, CommandTraining):
        for path in training.files:
            ctx.backend.transport.put(ep, path, path.name)
        # Not the payload, but what runs beside a command too: the storage sidecar (gs:// storage) and the
        # interpreter that waits for the first-boot set-up (gce), both started as jobs/... like the payload's.
        for name in COMMAND_SIDECAR_FILES:
            ctx.backend.transport.put(ep, jobs_dir() / name, f"jobs/{name}")
    else:
        ctx.backend.transport.put(ep, jobs_dir(), "jobs")
        # The task.json schema the payload reads: the controller's own definition, so the two always agree.
        ctx.backend.transport.put(ep, Path(task_schema.__file__), "jobs/task_schema.py")
        for path in torch_task.push_paths(ctx.spec):  # run: the user's script beside jobs/
            ctx.backend.transport.put(ep, path, path.name)


def _task_argv(spec: JobSpec, python: str, command_prefix: Sequence[str] = ()) -> list[str]:
    if isinstance(spec.training, CommandTraining):  # behind the backend's prefix (gce: the boot wait)
        return [*command_prefix, "/bin/sh", "-c", spec.training.command]
    if is_pytorch(spec):
        return torch_task.node_argv(python)
    return [python, "jobs/train.py", "--task", "task.json"]


def _writes_job_files(spec: JobSpec, inst: Instance) -> bool:
    """The tasks that write metrics, checkpoints and the result: the async chief, sync worker 0, or every worker of
    a PyTorch job (its rank 0 moves to another node when worker 0 is revoked: storage_sync appends to the bucket's
    metrics what each wrote)."""
    if spec.mode == TrainingMode.ASYNC:  # the chief runs on worker 0 with cluster.chief.on_worker0
        host = Role.WORKER if spec.pinned.chief.on_worker0 else Role.CHIEF
        return inst.role == host.value and inst.slot_index == 0
    return inst.role == Role.WORKER.value and (inst.slot_index == 0 or is_pytorch(spec))


def _seed_storage(ctx: JobContext, ep: Endpoint) -> None:
    """Pull the job's storage (notices, checkpoints, metrics so far) before a task may start there."""
    t = ctx.backend.transport
    # pull-only: the instance's own sidecar (running, or started next) is the one that uploads, and a second one
    # beside it would send its lines again
    t.start(ep, "storage-seed", [ctx.backend.python, "jobs/storage_sync.py", "--uri", ctx.storage.uri, "--local",
                                 "storage", "--once", "--pull-only"], ctx.backend.task_env)
    deadline = ctx.clock.monotonic() + SEED_TIMEOUT_S
    while ctx.clock.monotonic() < deadline:
        st = t.status(ep, ["storage-seed"])["storage-seed"]
        if st.state == ProcState.EXITED:
            if st.exit_code != 0:
                raise TransportError(f"storage seed on {ep.host} exited with {st.exit_code}: cannot read "
                                     f"{ctx.storage.uri}")
            return
        ctx.clock.sleep(0.2)
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


def _lighthouse_for(ctx: JobContext, inst: Instance) -> tuple[str | None, str | None]:
    """A job on torchft replica groups: (the Lighthouse's address as ``inst`` reaches it, the address its peers reach
    it at). A local worker reaches the Lighthouse on this host's loopback; a remote one through its own reverse
    forward (control/lighthouse.reach), and its peers at its internal address."""
    if not torch_task.uses_torchft(ctx.spec):
        return None, None
    if ctx.spec.provider.as_local() is not None:
        return lighthouse.ensure(ctx.storage), None
    ep = ctx.backend.endpoint(ctx.observed[inst.name])
    return lighthouse.reach(ctx.storage, ctx.job.id, inst.name, ep, ctx.clock), inst.host


def _task_config(ctx: JobContext, inst: Instance) -> TaskConfig:
    spec = ctx.spec
    training = spec.training
    batches = tuple(s.batch or DEFAULT_BATCH for s in ctx.slots if s.role == Role.WORKER)
    storage = ctx.storage.local_path()
    local = spec.provider.as_local()
    provider = ctx.backend.provider
    host_gpus = provider.gpus_on(inst.name) if isinstance(provider, SupportsHostGpus) else None
    reach, replica_host = _lighthouse_for(ctx, inst)
    torch = (torch_task.torch_section(spec, ctx.slots, list(ctx.job.instances), inst, sum(batches),
                                      ctx.emulation_sleep, stage_loss.dropped_slots(ctx.session, ctx.job),
                                      host_gpus=host_gpus, lighthouse=reach, replica_host=replica_host,
                                      join=torch_task.joins(ctx.job.status, list(ctx.job.instances), inst))
             if is_pytorch(spec) else None)
    return TaskConfig(
        job_id=ctx.job.id, instance=inst.name, mode=spec.mode.value, role=inst.role, index=inst.slot_index,
        cluster={k: tuple(v) for k, v in cluster_addresses(ctx).items()},
        storage=str(storage) if storage is not None else "storage",  # remote: the synced local copy
        storage_uri=ctx.storage.uri,
        training=TrainingSection(
            model=training.model if isinstance(training, BuiltinTraining) else "resnet", hparam_set=training.hparam_set,
            problem=getattr(training, "problem", "image_cifar10"),
            data_dir=training.data_dir if isinstance(training, BuiltinTraining) else None,
            train_steps=training.train_steps, batch_per_worker=batches, checkpoint_every=training.checkpoint_every,
            eval_every=training.eval_every, log_every=training.log_every, seed=local.seed if local else 0),
        step_sleep_s=(ctx.emulation_sleep(inst.gpu, inst.batch or DEFAULT_BATCH) if inst.role == Role.WORKER.value
                      else 0.0),
        gpu=inst.gpu if torch is not None else None, torch=torch,
    )
