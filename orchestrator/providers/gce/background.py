"""The GCE provider's non-blocking side: inserts and deletes sent, their operations polled and the
instances listed in background threads, so a reconcile pass only ever reads what is known now.

- A started call runs on the ``start`` pool (with the provider's bounded retries and the caller's
  requestId, so a retry never acts twice); its answer is the operation, whose id the caller persists.
- ``operation(ref)`` answers from memory and, when the operation is not DONE and no poll is under way,
  queues one ``zoneOperations.get`` (never ``wait``) on the ``poll`` pool, at most every ``poll_every_s``.
- The listing (``aggregatedList`` of every managed VM) is refreshed on its own thread, so polls queued
  behind a burst of inserts never delay it.

Errors on a DONE operation map to the same typed errors as the blocking calls (stockout -> CapacityError,
quota -> QuotaError, ...). A delete that finds the VM already gone reports when GCE preempted it, if it
did, so the ledger closes at the provider's time, not the controller's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from orchestrator.clock import WALL, Clock
from orchestrator.model.cloud_errors import ProviderError, TransientError
from orchestrator.model.instances import ObservedInstance, ObservedState
from orchestrator.providers.gce.compute_api import compute_v1
from orchestrator.providers.gce.errors import op_has_code, operation_error
from orchestrator.providers.operations import BackgroundListing, OpKind, OpPhase, OpRef, OpState, Snapshot

log = logging.getLogger(__name__)
PREEMPTED = "compute.instances.preempted"
# Codes that mean the operation did what was asked: the VM exists (insert) / is gone (delete).
_ALREADY = {OpKind.INSERT: "RESOURCE_ALREADY_EXISTS", OpKind.DELETE: "RESOURCE_NOT_FOUND"}


def epoch(stamp: str) -> float | None:
    """An RFC 3339 timestamp of the Compute API (``2026-11-24T10:00:00.123-08:00``) as epoch seconds."""
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class GceCalls:
    """What the background needs of the provider: its calls, each with the provider's bounded retries."""

    project: str
    list_all: Callable[[], list[ObservedInstance]]
    get_operation: Callable[[str, str], compute_v1.Operation]  # (zone, name): zoneOperations.get
    list_operations: Callable[[str, str], Iterable[compute_v1.Operation]]  # (zone, filter)
    after_delete: Callable[[str], None]  # a VM is gone: e.g. its job's firewall rules go with its last VM
    cleanup_key: Callable[[str], str | None]  # deletes whose after_delete may be merged (None: nothing to do)


@dataclass
class _Tracked:
    ref: OpRef
    state: OpState
    resource: str = ""  # the insert's GPU or machine type, named in a stockout's message
    polling: bool = False
    polled_at: float = 0.0  # monotonic, of the background's clock (set when tracked)
    polls: int = 0


class GceBackground:
    """Started calls and their operations, by request id; the background listing."""

    def __init__(self, calls: GceCalls, *, threads: int = 16, poll_every_s: float = 1.0,
                 poll_max_s: float = 30.0, list_every_s: float = 2.0, clock: Clock = WALL) -> None:
        self.calls = calls
        self.clock = clock
        self.poll_every_s = poll_every_s
        self.poll_max_s = poll_max_s  # an operation running for long is asked less often (1, 2, 4 ... 30 s)
        self._start_pool = ThreadPoolExecutor(threads, thread_name_prefix="gce-start")
        self._poll_pool = ThreadPoolExecutor(threads, thread_name_prefix="gce-poll")
        self._list_pool = ThreadPoolExecutor(1, thread_name_prefix="gce-list")
        self.listing = BackgroundListing(calls.list_all, self._list_pool, list_every_s, clock)
        self._ops: dict[str, _Tracked] = {}
        self._prereqs: dict[str, Future[None]] = {}  # prerequisite key -> its call under way
        self._cleaning: set[str] = set()  # after-delete keys with a check under way
        self._recheck: set[str] = set()  # ... and another delete done since it began
        self._seen_snapshot: Snapshot | None = None
        self._seen_states: dict[str, ObservedState] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        for pool in (self._start_pool, self._poll_pool, self._list_pool):
            pool.shutdown(wait=False, cancel_futures=True)

    def snapshot(self) -> Snapshot | None:
        return self.listing.latest()

    # ---------------------------------------------------------------- starting

    def start(self, ref: OpRef, send: Callable[[], compute_v1.Operation | None], resource: str = "",
              prerequisite: tuple[str, Callable[[], None]] | None = None) -> None:
        """Send the call in the background unless this request id is already known here; after
        ``prerequisite`` (key, call), run once per key however many calls wait for it."""
        first: Future[None] | None = None
        with self._lock:
            if ref.request_id in self._ops:
                return
            tracked = self._ops[ref.request_id] = _Tracked(ref, OpState(OpPhase.STARTING), resource,
                                                           polled_at=self.clock.monotonic())
            if prerequisite is not None:
                key, call = prerequisite
                first = self._prereqs.get(key)
                if first is None:
                    first = self._prereqs[key] = self._submit(self._start_pool, call)
        if first is not None:
            first.add_done_callback(lambda done: self._after(done, key, tracked, send))
            return
        try:
            self._start_pool.submit(self._send, tracked, send)
        except RuntimeError:  # shut down: the provider is closed; the caller finds the call UNKNOWN later
            with self._lock:
                self._ops.pop(ref.request_id, None)

    @staticmethod
    def _submit(pool: ThreadPoolExecutor, call: Callable[[], None]) -> Future[None]:
        try:
            return pool.submit(call)
        except RuntimeError as exc:  # shut down: a future that failed, so its waiters hear of it
            failed: Future[None] = Future()
            failed.set_exception(exc)
            return failed

    def _after(self, done: Future[None], key: str, tracked: _Tracked,
               send: Callable[[], compute_v1.Operation | None]) -> None:
        with self._lock:
            if self._prereqs.get(key) is done:
                del self._prereqs[key]  # done either way: a failed one is tried again by the next call
        exc = done.exception()
        if exc is None:
            try:
                self._start_pool.submit(self._send, tracked, send)
                return
            except RuntimeError as closed:  # shut down meanwhile
                exc = closed
        error = exc if isinstance(exc, ProviderError) else TransientError(f"{type(exc).__name__}: {exc}")
        with self._lock:
            tracked.state = OpState(OpPhase.DONE, error=error)

    def _send(self, tracked: _Tracked, send: Callable[[], compute_v1.Operation | None]) -> None:
        try:
            op = send()
            state = self._state(tracked, op)
        except ProviderError as exc:
            state = OpState(OpPhase.DONE, error=exc)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the caller must hear of it
            log.exception("%s %s failed unexpectedly", tracked.ref.kind.value, tracked.ref.target)
            state = OpState(OpPhase.DONE, error=TransientError(f"{type(exc).__name__}: {exc}"))
        with self._lock:
            tracked.state = state
            tracked.polled_at = self.clock.monotonic()

    # ---------------------------------------------------------------- following

    def operation(self, ref: OpRef) -> OpState:
        with self._lock:
            tracked = self._ops.get(ref.request_id)
            if tracked is None:
                if ref.name is None:
                    return OpState(OpPhase.UNKNOWN)  # its starter died before the answer: send it again
                # Started by an earlier process, which recorded the operation's id: follow it from here.
                tracked = self._ops[ref.request_id] = _Tracked(ref, OpState(OpPhase.RUNNING, ref.name), polled_at=0.0)
            state = tracked.state
            wait = min(self.poll_max_s, self.poll_every_s * 2 ** min(tracked.polls, 8))
            if ref.kind == OpKind.INSERT and self._listed().get(ref.target) == ObservedState.PENDING:
                wait = self.poll_max_s  # its VM is listed, booting: the insert went through and ends with the boot
            due = self.clock.monotonic() - tracked.polled_at >= wait
            if state.phase == OpPhase.RUNNING and not tracked.polling and due:
                tracked.polling = True
                try:
                    self._poll_pool.submit(self._poll, tracked)
                except RuntimeError:
                    tracked.polling = False
            return state

    def _poll(self, tracked: _Tracked) -> None:
        name = tracked.state.name
        assert name is not None
        try:
            state = self._state(tracked, self.calls.get_operation(tracked.ref.zone, name))
        except ProviderError as exc:  # a failed poll is not a failed operation: the next one may answer
            log.info("polling %s: %s", name, exc.message)
            state = tracked.state
        with self._lock:
            tracked.state = state
            tracked.polling = False
            tracked.polled_at = self.clock.monotonic()
            tracked.polls += 1

    def _listed(self) -> dict[str, ObservedState]:
        """Each VM's state in the latest listing (kept per listing, not rebuilt on every question)."""
        snapshot = self.listing.peek()
        if snapshot is not self._seen_snapshot:
            self._seen_snapshot = snapshot
            self._seen_states = {i.name: i.state for i in snapshot.instances} if snapshot is not None else {}
        return self._seen_states

    def forget(self, ref: OpRef) -> None:
        with self._lock:
            self._ops.pop(ref.request_id, None)

    # ---------------------------------------------------------------- answers

    def _state(self, tracked: _Tracked, op: compute_v1.Operation | None) -> OpState:
        ref = tracked.ref
        if op is None:  # the VM already existed (insert) or was already gone (delete)
            ended = self._preempted_at(ref.target, ref.zone) if ref.kind == OpKind.DELETE else None
            return OpState(OpPhase.DONE, ended_at=ended)
        if op.status != compute_v1.Operation.Status.DONE:
            return OpState(OpPhase.RUNNING, op.name)
        what = f"{'create' if ref.kind == OpKind.INSERT else 'delete'} {ref.target} in {ref.zone}"
        error = operation_error(op, what, self.calls.project, zone=ref.zone, resource=tracked.resource)
        if error is not None and op_has_code(op, _ALREADY[ref.kind]):
            error = None
        ended = epoch(op.end_time) if ref.kind == OpKind.DELETE and error is None else None
        if error is None and ref.kind == OpKind.DELETE:
            self._after_delete(ref.target)
        return OpState(OpPhase.DONE, op.name, error, ended)

    def _after_delete(self, name: str) -> None:
        """Run the provider's after-delete work (the job's firewall rules) in the background, once per key
        at a time: a burst of deletes of one job's VMs makes one check, and one more after it."""
        key = self.calls.cleanup_key(name)
        if key is None:
            return
        with self._lock:
            if key in self._cleaning:
                self._recheck.add(key)
                return
            self._cleaning.add(key)
        try:
            self._poll_pool.submit(self._clean, key, name)
        except RuntimeError:
            with self._lock:
                self._cleaning.discard(key)

    def _clean(self, key: str, name: str) -> None:
        while True:
            try:
                self.calls.after_delete(name)
            except Exception as exc:  # noqa: BLE001 - the next delete of the job, or gc, tries again
                log.warning("after deleting %s: %s", name, exc)
            with self._lock:
                if key not in self._recheck:
                    self._cleaning.discard(key)
                    return
                self._recheck.discard(key)

    def _preempted_at(self, name: str, zone: str) -> float | None:
        """When GCE preempted VM ``name`` (its preemption operation), if it did and still says so."""
        try:
            times = [epoch(op.end_time or op.insert_time)
                     for op in self.calls.list_operations(zone, f'operationType = "{PREEMPTED}"')
                     if op.target_link.rstrip("/").endswith(f"/instances/{name}")]
        except ProviderError as exc:
            log.info("cannot read the preemption time of %s: %s", name, exc.message)
            return None
        known = [t for t in times if t is not None]
        return max(known) if known else None
