"""Cloud operations a pass starts and later passes settle: no pass waits on the cloud.

create (intent first)   the instance row (REQUESTED) and an ``operations`` row with a fresh request id are
                        committed, then the insert starts in the background (providers/operations.py).
settle (every pass)     each operation under way is asked about (an answer from memory; polls run in the
                        background), and a finished one is acted on:
  insert done             -> PROVISIONING ("create accepted")
  insert stockout / quota -> the block is persisted and the next allowed zone asked (a new operation), or
                             the instance FAILED (create_failed) when no zone is left
  insert transient error  -> REQUESTED stays; the reconciler asks again after policy.CREATE_REISSUE_S
  delete done             -> DELETED, billed to the provider's own end time (the operation's endTime, or
                             an earlier stop or preemption)
  delete error            -> DELETING stays; the reconciler asks again after its DELETING timeout
  not DONE within the provider's ``operation_timeout_s`` -> timed_out, then asked again as above
  unknown (its starter died before the answer) -> started again with the same request id: the cloud answers
                             with the first call's operation, so nothing is done twice
While an instance has an operation under way, the reconciler's create, delete or "deletion confirmed" for it
waits: GCE refuses to delete a VM that is still being inserted, and a deletion is billed to its own end.
"""

from __future__ import annotations

import logging
import uuid

from sqlalchemy.exc import IntegrityError

from orchestrator.control.billing import provider_end_time, provider_start_time
from orchestrator.control.context import TASK, JobContext, fail_job, instance_row
from orchestrator.control.keep_logs import keep_log
from orchestrator.costmodel.slots import Slot, on_gpu
from orchestrator.decide.actions import Action, CreateInstance, DeleteInstance, SetInstanceStatus, SetJobStatus
from orchestrator.model.blocks import block_for, blocked, provider_key
from orchestrator.model.cloud_errors import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaError,
)
from orchestrator.model.instances import REVOKE_AT_STEP, InstanceRequest, instance_name
from orchestrator.model.status import FINAL_JOB, EndReason, InstanceStatus
from orchestrator.providers.base import SupportsOwnPricing
from orchestrator.providers.local.revocations import revoke_after_s, revoke_at_step
from orchestrator.providers.operations import OpKind, OpPhase, OpRef, OpState, SupportsOperations, operations_of
from orchestrator.storage.base import NOTICES
from orchestrator.store import queries
from orchestrator.store.models import Block, Instance, Operation

log = logging.getLogger(__name__)
DONE, FAILED, TIMED_OUT = queries.OP_DONE, queries.OP_FAILED, queries.OP_TIMED_OUT  # besides queries.OP_PENDING


def waits(ctx: JobContext, action: Action) -> bool:
    """Is this action put off to a later pass (which asks for it again)? It waits for its instance's
    operation under way, or, a create or delete, for a pass with operations left to start (one is taken
    from the pass's budget when it starts one: ``create`` and ``delete``)."""
    match action:
        case CreateInstance(slot=slot, generation=generation):
            name = instance_name(ctx.job.id, slot.role, slot.index, generation)
            return name in ctx.pending or not _may_start(ctx)
        case DeleteInstance(name=name):
            return name in ctx.pending or not _may_start(ctx)
        case SetInstanceStatus(name=name, status=InstanceStatus.DELETED):
            return name in ctx.pending
        case SetJobStatus(status=status) if status in FINAL_JOB:
            return bool(ctx.pending)  # its instances are not all done with while an operation is under way
    return False


def _may_start(ctx: JobContext) -> bool:
    return ctx.starts is None or ctx.starts.left > 0


def _take_start(ctx: JobContext) -> bool:
    """One operation from the pass's budget, taken where it starts (a check alone takes nothing)."""
    return ctx.starts is None or ctx.starts.take()


def _ops(ctx: JobContext) -> SupportsOperations:
    return operations_of(ctx.backend.provider)


def _ref(op: Operation, name: str) -> OpRef:
    return OpRef(OpKind(op.kind), name, op.zone, op.request_id, op.name)


# ---------------------------------------------------------------- create


def create(ctx: JobContext, action: CreateInstance) -> None:
    slot = action.slot
    name = instance_name(ctx.job.id, slot.role, slot.index, action.generation)
    inst = _requested(ctx, action, name, ctx.clock.time())
    if name in ctx.pending or inst.status != InstanceStatus.REQUESTED.value:
        return  # its insert is under way, or it exists already
    if not _take_start(ctx):
        return  # the pass's budget is spent: a later pass asks again (the row stays REQUESTED)
    ctx.backend.ensure_network()  # e.g. the firewall rule that keeps the gRPC ports inside the cluster
    _insert(ctx, inst, list(action.zones), [])


def _requested(ctx: JobContext, action: CreateInstance, name: str, now: float) -> Instance:
    """The instance's row, recorded before the create call (committed with its operation: intent first).

    The job's instances are read afresh every pass (driver.GroupReads); a row another driver recorded since
    breaks the unique name here, and that row is used."""
    inst = next((i for i in ctx.job.instances if i.name == name), None)  # read afresh by this pass
    if inst is not None:
        return inst
    slot = action.slot
    inst = Instance(
        job_id=ctx.job.id, name=name, role=slot.role.value, slot_index=slot.index, generation=action.generation,
        gpu=slot.gpu, machine_type=slot.machine_type, zone=action.zones[0], spot=action.spot,
        price_per_hour=slot.price(action.spot), batch=slot.batch, port=ctx.backend.task_port(action.port),
        status=InstanceStatus.REQUESTED.value, status_reason=action.reason, requested_at=now, updated_at=now,
    )
    ctx.job.instances.append(inst)  # keeps the loaded list true for the rest of this pass
    try:
        ctx.session.flush()
    except IntegrityError:  # another driver recorded it between our read and this write: use its row
        ctx.session.rollback()
        found = queries.instance_by_name(ctx.session, name)
        if found is None:
            raise
        return found
    queries.note(ctx.session, ctx.job.id, "requested", action.reason, instance_id=inst.id, now=now)
    return inst


def _insert(ctx: JobContext, inst: Instance, zones: list[str], why: list[str]) -> None:
    """Start the instance's insert in the first of ``zones`` no block rules out; FAILED if none is left.

    An inline provider (local, ssh) answers at once: a stockout there comes back here with the zones after
    it. A cloud's answer is settled by a later pass, which continues from the zones left."""
    blocks = _blocks(ctx)
    for k, zone in enumerate(zones):
        why_blocked = blocked(blocks, zone, inst.gpu)
        if why_blocked is not None:  # a stockout or quota seen earlier (this pass or another job's)
            why.append(f"{zone}: {why_blocked}")
            continue
        now = ctx.clock.time()
        op = Operation(job_id=ctx.job.id, instance_id=inst.id, kind=OpKind.INSERT.value, zone=zone,
                       zones_left=",".join(zones[k + 1:]), request_id=str(uuid.uuid4()), status=queries.OP_PENDING,
                       started_at=now)
        if zone != inst.zone:
            queries.note(ctx.session, ctx.job.id, "zone_fallback", f"{inst.name}: asking {zone} instead of "
                         f"{inst.zone}", instance_id=inst.id)
            inst.zone = zone  # where its VM will be: a delete or an adoption looks there
        inst.updated_at = now  # asked (again) now: the reconciler's REQUESTED timeouts run from here
        inst.requested_at = now  # and billed from this send (it follows the commit), not from an earlier record
        ctx.session.add(op)
        ctx.session.commit()  # intent first: a crash from here on resends this request id
        ctx.pending[inst.name] = op
        _ops(ctx).start_create(_request(ctx, inst, zone, now), op.request_id)
        _settled(ctx, [_settle(ctx, inst.name, op)])  # an inline provider has answered already
        return
    inst.end_reason = EndReason.CREATE_FAILED.value
    msg = "; ".join(why) or "no zone to try"
    queries.switch_status(ctx.session, inst, InstanceStatus.FAILED, f"every allowed zone refused: {msg}"[:500])
    ctx.session.commit()
    log.warning("job %s instance %s: create failed in every allowed zone: %s", ctx.job.id, inst.name, msg)


def _slot(ctx: JobContext, inst: Instance) -> Slot:
    """The instance's slot in the job's plan; on the GPU type it was created on, where the deadline policy moved
    it to another (policy.also_gpus: that type's machine type and GPU count)."""
    found = next((s for s in ctx.slots if s.role.value == inst.role and s.index == inst.slot_index), None)
    if found is None:
        raise LookupError(f"{inst.name}: no slot {inst.slot} in the job's plan")
    if found.gpu is not None and inst.gpu is not None and inst.gpu != found.gpu:
        return on_gpu(ctx.spec, found, inst.gpu, book=ctx.job.price_book)
    return found


def _request(ctx: JobContext, inst: Instance, zone: str, now: float) -> InstanceRequest:
    slot = _slot(ctx, inst)
    return InstanceRequest(
        name=inst.name, job_id=ctx.job.id, role=slot.role, index=slot.index, generation=inst.generation, zone=zone,
        machine_type=slot.machine_type, spot=inst.spot, gpu=slot.gpu, gpu_count=slot.gpu_count if slot.gpu else 0,
        price_per_hour=inst.price_per_hour, metadata=_metadata(ctx, slot, inst),
        revoke_after_s=_revoke_after(ctx, slot, inst, now), max_run_s=_cloud_deadline(ctx, slot, now),
        flex_start=slot.flex_start and not inst.spot,
    )


def _metadata(ctx: JobContext, slot: Slot, inst: Instance) -> dict[str, str]:
    metadata = ctx.backend.instance_metadata(ctx.job.id, inst.name, ctx.storage)
    shared = ctx.storage.local_path()
    if shared is not None:
        # Where the emulated shutdown script reports a preemption notice (instances that share this disk).
        metadata["notice-file"] = str(shared / NOTICES / inst.name)
    metadata.update(ctx.backend.request_metadata(ctx.spec, ctx.slots, ctx.emulation_sleep))  # local: progress clock
    local = ctx.spec.provider.as_local()
    step = None if local is None else revoke_at_step(local, slot.role, slot.index, inst.generation, inst.spot)
    if step is not None:
        metadata[REVOKE_AT_STEP] = str(step)
    return metadata


def _revoke_after(ctx: JobContext, slot: Slot, inst: Instance, now: float) -> float | None:
    local = ctx.spec.provider.as_local()
    if local is None:
        return None
    return revoke_after_s(local, slot.role, slot.index, inst.generation, slot.gpu, inst.zone, inst.spot,
                          ctx.job.started_at, now)


def _cloud_deadline(ctx: JobContext, slot: Slot, now: float) -> int | None:
    """The VM's cloud-side time limit from what is left of the job's deadline and budget (a Backend capability)."""
    limit = ctx.backend.cloud_deadline
    if limit is None:
        return None
    job = ctx.job
    spent = queries.job_cost(ctx.session, job.id)["total"] if job.budget_usd is not None else 0.0
    return limit(deadline_s=job.deadline_s, elapsed_s=now - (job.started_at or now), budget_usd=job.budget_usd,
                 spent_usd=spent, cluster_usd_per_hour=sum(s.price_per_hour for s in ctx.slots),
                 flex_start=slot.flex_start)


def _blocks(ctx: JobContext) -> list[Block]:
    """Blocks apply to clouds (GCE); an inventory's hosts free up as jobs end, so ssh and local keep none."""
    if not ctx.spec.provider.is_cloud:
        return []
    if ctx.blocks is None:
        return queries.active_blocks(ctx.session, provider_key(ctx.spec))
    now = ctx.clock.time()
    return [b for b in ctx.blocks if b.expires_at > now]  # as this pass read them, plus those it added


def _remember_block(ctx: JobContext, exc: CapacityError | QuotaError, zone: str, gpu: str | None) -> None:
    if not ctx.spec.provider.is_cloud:
        return
    scope, location, resource, ttl = block_for(exc, zone, gpu)
    block = queries.add_block(ctx.session, provider_key(ctx.spec), scope, location, resource, exc.message, ttl)
    if ctx.blocks is not None:
        ctx.blocks.append(block)  # the next job's creates in this pass skip it too
    log.warning("job %s: %s %s blocked for %s for %.0fs: %s", ctx.job.id, scope, location, resource, ttl,
                exc.message)


# ---------------------------------------------------------------- delete


def delete(ctx: JobContext, name: str, reason: str, end_reason: EndReason | None) -> None:
    """DELETING and the delete's operation (one commit: intent first), then the delete starts."""
    if not _take_start(ctx):
        return  # the pass's budget is spent: a later pass asks again
    inst = instance_row(ctx, name)
    if inst.ready_at is not None:  # never ready: no task ran there, no log to keep (and no SSH to wait on)
        keep_log(ctx.backend, ctx.storage, ctx.observed.get(name), name, TASK)  # the disk goes with it
    if end_reason is not None and inst.end_reason is None:
        inst.end_reason = end_reason.value
    queries.switch_status(ctx.session, inst, InstanceStatus.DELETING, reason)
    op = Operation(job_id=ctx.job.id, instance_id=inst.id, kind=OpKind.DELETE.value, zone=inst.zone, zones_left="",
                   request_id=str(uuid.uuid4()), status=queries.OP_PENDING, started_at=ctx.clock.time())
    ctx.session.add(op)
    ctx.session.commit()  # a crash from here on leaves DELETING and the request id, which the next pass resends
    ctx.pending[name] = op
    _ops(ctx).start_delete(name, inst.zone, op.request_id)
    _settled(ctx, [_settle(ctx, name, op)])


# ---------------------------------------------------------------- settle


def settle(ctx: JobContext, rows: list[tuple[str, Operation]] | None = None) -> None:
    """Follow each of the job's operations under way (``rows``: as read for the whole group); act on the
    finished ones (see the module docstring), and commit what they changed once."""
    if rows is None:
        rows = queries.pending_operations(ctx.session, [ctx.job.id])[ctx.job.id]
    ctx.pending = dict(rows)  # two drivers that raced may have started two for one instance: both settle
    finished: list[OpRef | None] = []
    for name, op in rows:
        try:
            finished.append(_settle(ctx, name, op))
        except ProviderError as exc:  # e.g. the next zone's request cannot be built: this operation only
            ctx.session.rollback()  # what settled before it is asked about again (and answered alike)
            finished.clear()
            queries.note(ctx.session, ctx.job.id, "provider_error", f"{name}: {type(exc).__name__}: {exc.message}")
    _settled(ctx, finished)
    under_way = {name: op for name, op in rows if op.status == queries.OP_PENDING}
    under_way.update({name: op for name, op in ctx.pending.items() if op.status == queries.OP_PENDING})
    ctx.pending = under_way  # including the next zone's inserts started just now


def _settled(ctx: JobContext, finished: list[OpRef | None]) -> None:
    """Commit the outcomes, then let the provider drop those operations (not before: a crash in between
    finds them pending, asks again, and gets the same answer)."""
    ctx.session.commit()
    ops = _ops(ctx)
    for ref in finished:
        if ref is not None:
            ops.forget(ref)


def _settle(ctx: JobContext, name: str, op: Operation) -> OpRef | None:
    """Act on what is known of ``op`` now (nothing committed here); its ref once it is finished with."""
    ops = _ops(ctx)
    ref = _ref(op, name)
    state = ops.operation(ref)
    if state.phase == OpPhase.UNKNOWN:
        state = _resend(ctx, name, op, ref)
    if state.name is not None and op.name != state.name:
        op.name = state.name  # persisted: another process can follow the operation from here
    if state.phase == OpPhase.DONE:
        _unpend(ctx, name, op)
        if op.kind == OpKind.INSERT.value:
            _insert_done(ctx, name, op, state)
        else:
            _delete_done(ctx, name, op, state)
        return ref
    if ctx.clock.time() - op.started_at > ops.operation_timeout_s:
        _unpend(ctx, name, op)
        queries.close_operation(op, TIMED_OUT, f"not done after {ops.operation_timeout_s:.0f}s", ctx.clock.time())
        queries.note(ctx.session, ctx.job.id, "provider_error", f"{op.kind} of {name} in {op.zone}: operation "
                     f"{op.name or op.request_id} not done after {ops.operation_timeout_s:.0f}s; asked again")
        return ref
    return None


def _unpend(ctx: JobContext, name: str, op: Operation) -> None:
    if ctx.pending.get(name) is op:
        del ctx.pending[name]


def _resend(ctx: JobContext, name: str, op: Operation, ref: OpRef) -> OpState:
    """Its starter died before recording the answer: send it again, same request id (the cloud dedupes)."""
    inst = instance_row(ctx, name)
    if op.kind == OpKind.INSERT.value:
        if inst.status != InstanceStatus.REQUESTED.value:
            return OpState(OpPhase.DONE)  # seen since: nothing left to ask
        _ops(ctx).start_create(_request(ctx, inst, op.zone, ctx.clock.time()), op.request_id)
    else:
        _ops(ctx).start_delete(name, op.zone, op.request_id)
    return _ops(ctx).operation(ref)




def _insert_done(ctx: JobContext, name: str, op: Operation, state: OpState) -> None:
    s = ctx.session
    inst = instance_row(ctx, name)
    error = state.error
    queries.close_operation(op, DONE if error is None else FAILED, error.message if error else None, ctx.clock.time())
    if error is None:
        if inst.status == InstanceStatus.REQUESTED.value:
            _accepted(ctx, inst)
        return
    if isinstance(error, CapacityError | QuotaError):
        if isinstance(error, QuotaError):
            why = f"{op.zone}: quota {error.metric or '?'} exhausted in {error.region}: {error.message}; next region"
            queries.note(s, ctx.job.id, "quota", why, instance_id=inst.id)
        else:
            queries.note(s, ctx.job.id, "stockout", f"{op.zone}: {error.message}; trying the next allowed zone",
                         instance_id=inst.id)
        _remember_block(ctx, error, op.zone, inst.gpu)
        if inst.status == InstanceStatus.REQUESTED.value:
            _insert(ctx, inst, [z for z in op.zones_left.split(",") if z], [error.message])  # commits first
        return
    queries.note(s, ctx.job.id, "provider_error", f"{op.zone}: {error.message} (will retry)", instance_id=inst.id)
    if isinstance(error, AuthError | InvalidRequestError):
        fail_job(ctx, f"{type(error).__name__}: {error.message}")


def _accepted(ctx: JobContext, inst: Instance) -> None:
    provider = ctx.backend.provider
    if isinstance(provider, SupportsOwnPricing):
        own = provider.price_per_hour(inst.name)
        if own is not None:
            inst.price_per_hour = own  # e.g. an on-prem host's price from the inventory, not a price book
    bill_from_provider(ctx, inst)
    reason = inst.status_reason
    queries.switch_status(ctx.session, inst, InstanceStatus.PROVISIONING, "create accepted")
    log.info("job %s instance %s: %s in %s (%s)", ctx.job.id, inst.name,
             "replaced" if inst.generation > 0 else "created", inst.zone, reason)


def _delete_done(ctx: JobContext, name: str, op: Operation, state: OpState) -> None:
    s = ctx.session
    inst = instance_row(ctx, name)
    error = state.error
    queries.close_operation(op, DONE if error is None else FAILED, error.message if error else None,
                            state.ended_at or ctx.clock.time())
    if error is not None:  # DELETING stays: the reconciler asks again after its timeout
        queries.note(s, ctx.job.id, "provider_error", f"{error.message} (will retry)", instance_id=inst.id)
    elif inst.status == InstanceStatus.DELETING.value:
        bill_from_provider(ctx, inst)
        queries.switch_status(s, inst, InstanceStatus.DELETED, "deleted", billed_until=billed_until(ctx, name,
                                                                                                  state.ended_at))
        log.info("job %s instance %s: deleted", ctx.job.id, name)


def bill_from_provider(ctx: JobContext, inst: Instance) -> None:
    """The ledger starts where the provider made the instance, as it reports it: the send that created it,
    which may be a later daemon's resend of a create its recorder never sent, or the first send where a resend
    found it made. Without such a report it starts at the latest send (``_insert``)."""
    if inst.status in (InstanceStatus.DELETED.value, InstanceStatus.FAILED.value):
        return  # its ledger is closed (or it never ran)
    start = provider_start_time(ctx.backend.provider, inst.name)
    if start is not None:
        inst.requested_at = min(start, ctx.clock.time())


def billed_until(ctx: JobContext, name: str, deleted_at: float | None = None) -> float | None:
    """The provider's own end of the instance: the earliest of its stop or preemption time (as the provider
    reports it) and its deletion (the delete operation's endTime); None: the bill closes now."""
    times = [t for t in (provider_end_time(ctx.backend.provider, name), deleted_at) if t is not None]
    return min(times) if times else None
