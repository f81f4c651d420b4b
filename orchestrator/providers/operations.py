"""Cloud calls a pass starts but never waits for, and listings a pass reads without making them.

A reconcile pass must not wait on the cloud (GCE answers an insert with an operation that runs for
minutes, and every API call may take seconds). Two optional capabilities say how a provider avoids it:

- ``SupportsOperations``: ``start_create`` / ``start_delete`` return at once; the call runs in the
  background and ``operation(ref)`` reports what is known of it now (starting, running, done with the
  typed error or none). The caller persists an ``OpRef`` (with the call's ``request_id``) before the call,
  so after a restart it asks again with the same id and gets the first call's operation back.
- ``SupportsSnapshots``: ``snapshot()`` returns the latest complete listing and when it began, and starts
  the next refresh in the background when one is due.

A provider whose calls are instant (local, an SSH inventory) needs neither: ``operations_of`` wraps it in
``InlineOperations``, which makes the call at once and reports it done, behind the same interface.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from enum import StrEnum

from orchestrator.clock import WALL, Clock
from orchestrator.model.cloud_errors import ProviderError
from orchestrator.model.instances import InstanceRequest, ObservedInstance
from orchestrator.providers.base import Provider

log = logging.getLogger(__name__)


class OpKind(StrEnum):
    INSERT = "insert"
    DELETE = "delete"


class OpPhase(StrEnum):
    STARTING = "starting"  # the call is on its way (or being retried): no operation id yet
    RUNNING = "running"  # the provider took it: an operation id, not done yet
    DONE = "done"  # finished; ``error`` None is success
    UNKNOWN = "unknown"  # this process never started it (its starter died): start it again, same request id


@dataclass(frozen=True)
class OpRef:
    """What the caller persists about one call: enough to find it again from another process."""

    kind: OpKind
    target: str  # the instance name
    zone: str
    request_id: str  # the call's idempotency key: the same id gets the same operation back
    name: str | None = None  # the provider's operation id, once known


@dataclass(frozen=True)
class OpState:
    phase: OpPhase
    name: str | None = None
    error: ProviderError | None = None
    ended_at: float | None = None  # the provider's own end time (a delete: when the VM was gone)


class SupportsOperations(abc.ABC):
    """Optional capability: create and delete without waiting (see the module docstring)."""

    operation_timeout_s: float = 900.0  # an operation not DONE by then is given up (and asked again)

    @abc.abstractmethod
    def start_create(self, request: InstanceRequest, request_id: str) -> None: ...

    @abc.abstractmethod
    def start_delete(self, name: str, zone: str, request_id: str) -> None: ...

    @abc.abstractmethod
    def operation(self, ref: OpRef) -> OpState:
        """What is known of the call now; never waits (a poll it needs starts in the background)."""

    def forget(self, ref: OpRef) -> None:  # noqa: B027 - optional hook
        """The caller has recorded the outcome: drop what is kept of the call."""


class InlineOperations(SupportsOperations):
    """A provider whose create and delete are instant, behind the operations interface: each call is made
    when started and is done when asked about."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self._done: dict[str, OpState] = {}
        self._lock = threading.Lock()

    def _run(self, request_id: str, call: Callable[[], None]) -> None:
        try:
            call()
            state = OpState(OpPhase.DONE)
        except ProviderError as exc:
            state = OpState(OpPhase.DONE, error=exc)
        with self._lock:
            self._done[request_id] = state

    def start_create(self, request: InstanceRequest, request_id: str) -> None:
        self._run(request_id, lambda: self.provider.create(request))

    def start_delete(self, name: str, zone: str, request_id: str) -> None:
        self._run(request_id, lambda: self.provider.delete(name, zone))

    def operation(self, ref: OpRef) -> OpState:
        with self._lock:
            return self._done.get(ref.request_id, OpState(OpPhase.UNKNOWN))

    def forget(self, ref: OpRef) -> None:
        with self._lock:
            self._done.pop(ref.request_id, None)


_inline_lock = threading.Lock()
_WRAPPER = "_orchestrator_inline_operations"  # the wrapper lives on its provider: collected with it


def operations_of(provider: Provider) -> SupportsOperations:
    """The provider's own non-blocking operations, or its instant calls wrapped (one wrapper per provider)."""
    if isinstance(provider, SupportsOperations):
        return provider
    with _inline_lock:
        found: InlineOperations | None = getattr(provider, _WRAPPER, None)
        if found is None:
            found = InlineOperations(provider)
            setattr(provider, _WRAPPER, found)
        return found


# ---------------------------------------------------------------- listings


@dataclass(frozen=True)
class Snapshot:
    """One complete listing of every managed instance, and when the listing began: the world as it was
    no earlier than ``started_at`` (an instance absent here may have been created since)."""

    instances: tuple[ObservedInstance, ...]
    started_at: float
    error: Exception | None = None  # the latest refresh failed: these instances are from an older one
    attempt: int = 0  # refreshes finished so far (a failure is reported once, not on every pass)

    def age_s(self, now: float) -> float:
        return now - self.started_at


class SupportsSnapshots(abc.ABC):
    """Optional capability: a listing the pass reads without waiting for the cloud."""

    @abc.abstractmethod
    def snapshot(self) -> Snapshot | None:
        """The latest listing (None before the first one is done); starts a refresh when one is due."""


class BackgroundListing:
    """Refreshes a provider's listing in the background, one refresh at a time, when asked and due.

    Demand-driven (a refresh starts from ``latest()``), so nothing runs once no pass asks any more. A refresh
    starts ``every_s`` after the previous one started, and no sooner than twice the CPU time it took after it
    ended: parsing a thousand VMs costs CPU that the passes (same process, same GIL) need too, while waiting
    on a slow API costs none.
    """

    def __init__(self, list_all: Callable[[], list[ObservedInstance]], executor: Executor,
                 every_s: float = 2.0, clock: Clock = WALL) -> None:
        self._list_all = list_all
        self._clock = clock
        self._executor = executor
        self.every_s = every_s
        self._lock = threading.Lock()
        self._latest: Snapshot | None = None
        self._running: Future[None] | None = None
        self._next_at = 0.0  # monotonic
        self._attempts = 0

    def latest(self) -> Snapshot | None:
        with self._lock:
            idle = self._running is None or self._running.done()
            if idle and self._clock.monotonic() >= self._next_at:
                self._next_at = self._clock.monotonic() + self.every_s
                try:
                    self._running = self._executor.submit(self._refresh)
                except RuntimeError:  # the executor was shut down (the provider is closed)
                    self._running = None
            return self._latest

    def peek(self) -> Snapshot | None:
        """The latest listing, starting nothing."""
        with self._lock:
            return self._latest

    def _refresh(self) -> None:
        started, cpu = self._clock.time(), time.thread_time()  # CPU time: this thread's own, real
        try:
            items = tuple(self._list_all())
            error: Exception | None = None
        except Exception as exc:  # noqa: BLE001 - kept for the pass to report on the jobs it concerns
            items, error = (), exc
        took = time.thread_time() - cpu
        with self._lock:
            self._attempts += 1
            self._next_at = max(self._next_at, self._clock.monotonic() + 2 * took)
            if error is None:
                self._latest = Snapshot(items, started, None, self._attempts)
            else:
                old = self._latest or Snapshot((), started)
                self._latest = replace(old, error=error, attempt=self._attempts)
