"""The non-blocking side of ``GceProvider``, used by the controller's passes: operations started in the
background (providers/gce/background.py) and looked at on later passes, and the listing as a snapshot, so no
pass waits on an operation or a listing."""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from functools import partial

from orchestrator.clock import WALL, Clock
from orchestrator.model.instances import InstanceRequest
from orchestrator.providers.gce.api import GceApi
from orchestrator.providers.gce.background import GceBackground, GceCalls
from orchestrator.providers.gce.compute_api import compute_v1
from orchestrator.providers.gce.instances import Instances
from orchestrator.providers.operations import OpKind, OpRef, OpState, Snapshot, SupportsOperations, SupportsSnapshots


class GcePasses(SupportsOperations, SupportsSnapshots):
    """Mixin of ``GceProvider``: what it needs of the provider are the abstract members below."""

    api: GceApi
    instances: Instances
    project: str
    background_threads = 16  # calls (and, apart, polls) under way at once for the passes
    clock: Clock = WALL  # the Backend's (providers/gce/backend.py sets it)
    _background: GceBackground | None = None  # made by the first pass that uses it
    _background_lock: threading.Lock  # the provider's own (made in its __init__)

    @abc.abstractmethod
    def _send_insert(self, request: InstanceRequest, request_id: str) -> compute_v1.Operation | None: ...

    def _prerequisite(self, request: InstanceRequest) -> tuple[str, Callable[[], None]] | None:
        """(key, call) that must be done before the insert, once per key (``_before_create``'s slow part):
        the background runs it once and queues the key's inserts after it, instead of each waiting in a thread
        (IsolatedGceProvider: the job's firewall rules)."""
        return None

    @abc.abstractmethod
    def _after_delete(self, name: str) -> None: ...

    def _cleanup_key(self, name: str) -> str | None:
        """Deletes whose ``_after_delete`` may be merged into one (None: nothing to do after a delete)."""
        return None

    @property
    def operation_timeout_s(self) -> float:  # type: ignore[override]
        return self.api.retry.operation_timeout_s

    def _bg(self) -> GceBackground:
        with self._background_lock:
            if self._background is None:
                calls = GceCalls(self.project, partial(self.instances.observed, None), self.instances.get_operation,
                                 self.instances.list_operations, self._after_delete, self._cleanup_key)
                self._background = GceBackground(calls, threads=self.background_threads, clock=self.clock)
                self.api.widen_pools(2 * self.background_threads + 4)
            return self._background

    def close_background(self) -> None:
        if self._background is not None:
            self._background.close()

    def start_create(self, request: InstanceRequest, request_id: str) -> None:
        ref = OpRef(OpKind.INSERT, request.name, request.zone, request_id)
        self._bg().start(ref, partial(self._send_insert, request, request_id), request.gpu or request.machine_type,
                         prerequisite=self._prerequisite(request))

    def start_delete(self, name: str, zone: str, request_id: str) -> None:
        ref = OpRef(OpKind.DELETE, name, zone, request_id)
        self._bg().start(ref, partial(self.instances.send_delete, name, zone, request_id))

    def operation(self, ref: OpRef) -> OpState:
        return self._bg().operation(ref)

    def forget(self, ref: OpRef) -> None:
        self._bg().forget(ref)

    def snapshot(self) -> Snapshot | None:
        return self._bg().snapshot()

    def ended_at(self, name: str) -> float | None:
        """When the VM stopped by itself (a preemption's hard off), as its record says (lastStopTimestamp)."""
        return self.instances.stopped_at.get(name)
