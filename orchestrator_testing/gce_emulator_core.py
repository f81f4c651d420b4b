"""The GCE emulator's engine: its clock and timers, the thread that runs test hooks, and operations.

State changes are timers in a heap run by one scheduler thread against the emulated clock; test hooks
run on their own thread so that a slow hook never stalls the cloud. ``GceState`` builds on this.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import logging
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator_testing.gce_emulator_filter import (
    FilterError,
    compile_filter,
    decode_page_token,
    encode_page_token,
)
from orchestrator_testing.gce_emulator_model import (
    HOOK_EVENTS,
    HTTP_PHRASES,
    Clock,
    EmulatorConfig,
    Hook,
    InstanceRecord,
    OperationRecord,
    invalid,
    link,
    not_found,
)

log = logging.getLogger(__name__)


class EmulatorCore:
    """Clock, timers, hooks, ids and operations, behind one lock (an RLock with a condition)."""

    def __init__(self, config: EmulatorConfig, hooks: Mapping[str, Hook | None] | None = None) -> None:
        self.config = config
        self.clock = Clock(config.time_scale)
        self.hooks: dict[str, Hook] = {}
        for event, hook in (hooks or {}).items():
            if event not in HOOK_EVENTS:  # a typo would otherwise silently never fire
                raise ValueError(f"unknown emulator hook {event!r}; known: {', '.join(HOOK_EVENTS)}")
            if hook is not None:
                self.hooks[event] = hook
        self.lock = threading.RLock()
        self._cond = threading.Condition(self.lock)
        self._ops: dict[str, OperationRecord] = {}
        self._request_ids: dict[tuple[str, str], str] = {}
        self._ids = itertools.count(random.randrange(10**18, 2 * 10**18))
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._hook_queue: queue.Queue[tuple[Hook, dict[str, Any]] | None] = queue.Queue()
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._run_timers, name="gce-emulator-timers", daemon=True),
            threading.Thread(target=self._run_hooks, name="gce-emulator-hooks", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._hook_queue.put(None)
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=5)

    def _run_timers(self) -> None:
        with self._cond:
            while not self._stopped:
                now = self.clock.now()
                ran = False
                while self._timers and self._timers[0][0] <= now:
                    _, _, action = heapq.heappop(self._timers)
                    try:
                        action()
                    except Exception:  # a bug in one transition must not stop the cloud's clock
                        log.exception("emulator timer failed")
                    ran = True
                if ran:
                    self._cond.notify_all()
                wait = 1.0 if not self._timers else (self._timers[0][0] - now) / self.clock.scale
                self._cond.wait(min(max(wait, 0.0), 1.0))

    def _run_hooks(self) -> None:
        while (item := self._hook_queue.get()) is not None:
            hook, instance = item
            try:
                hook(instance)
            except Exception:  # a failing test hook is the test's problem, not the cloud's
                log.exception("emulator hook failed")

    def after(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (self.clock.now() + max(delay, 0.0), next(self._seq), action))
        self._cond.notify_all()

    def _emit(self, event: str, inst: InstanceRecord) -> None:
        hook = self.hooks.get(event)
        if hook is not None:
            self._hook_queue.put((hook, copy.deepcopy(inst.body)))

    def new_id(self) -> str:
        return str(next(self._ids))

    def new_op(
        self,
        project: str,
        scope: str,
        op_type: str,
        target_link: str,
        target_id: str,
        user: str = "emulator@example.com",
    ) -> OperationRecord:
        now_ms = int(time.time() * 1000)
        name = f"operation-{now_ms}-{uuid.uuid4().hex[:13]}-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:8]}"
        stamp = self.clock.timestamp()
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": self.new_id(),
            "name": name,
            "operationType": op_type,
            "targetLink": target_link,
            "targetId": target_id,
            "status": "RUNNING",
            "user": user,
            "progress": 0,
            "insertTime": stamp,
            "startTime": stamp,
            "selfLink": link(project, f"{scope}/operations/{name}"),
        }
        if scope.startswith("zones/"):
            body["zone"] = link(project, scope)
        op = OperationRecord(project, scope, body)
        self._ops[name] = op
        return op

    def finish_op(self, op: OperationRecord, error: tuple[str, str, int] | None = None) -> None:
        """Mark DONE; ``error`` is (code, message, http status) as GCE puts in ``error.errors``."""
        op.body.update(status="DONE", progress=100, endTime=self.clock.timestamp())
        if error is not None:
            code, message, http = error
            op.body["error"] = {"errors": [{"code": code, "message": message}]}
            op.body["httpErrorStatusCode"] = http
            op.body["httpErrorMessage"] = HTTP_PHRASES.get(http, "ERROR")
        self._cond.notify_all()

    def _finish_later(self, op: OperationRecord, error: tuple[str, str, int] | None = None) -> None:
        self.after(self.config.op_delay_s, lambda: self.finish_op(op, error))

    def dedupe(self, project: str, request_id: str | None) -> dict[str, Any] | None:
        """The operation a request with this ``requestId`` already started, if any."""
        if not request_id:
            return None
        try:
            if uuid.UUID(request_id).int == 0:
                raise ValueError
        except ValueError as exc:
            raise invalid("requestId", request_id, "Must be a valid non-zero UUID.") from exc
        name = self._request_ids.get((project, request_id))
        return copy.deepcopy(self._ops[name].body) if name in self._ops else None

    def remember(self, project: str, request_id: str | None, op: OperationRecord) -> dict[str, Any]:
        if request_id:
            self._request_ids[(project, request_id)] = op.body["name"]
        return copy.deepcopy(op.body)

    def page(
        self,
        items: list[dict[str, Any]],
        query: Mapping[str, str],
        query_key: str,
    ) -> tuple[list[dict[str, Any]], str | None]:
        try:
            predicate = compile_filter(query.get("filter"))
            offset = decode_page_token(query["pageToken"], query_key) if query.get("pageToken") else 0
        except FilterError as exc:
            raise invalid(
                "filter" if "token" not in str(exc) else "pageToken", query.get("filter", ""), str(exc)
            ) from exc
        try:
            limit = int(query.get("maxResults", self.config.max_results_limit))
        except ValueError as exc:
            raise invalid("maxResults", query["maxResults"]) from exc
        if not 0 <= limit <= self.config.max_results_limit:
            raise invalid(
                "maxResults", limit, f"Must be less than or equal to {self.config.max_results_limit}"
            )
        limit = limit or self.config.max_results_limit
        matched = [item for item in items if predicate(item)]
        page = matched[offset : offset + limit]
        more = offset + limit < len(matched)
        return page, encode_page_token(offset + limit, query_key) if more else None

    def _get_op(self, project: str, scope: str, name: str) -> OperationRecord:
        op = self._ops.get(name)
        if op is None or op.project != project or op.scope != scope:
            raise not_found(f"projects/{project}/{scope}/operations/{name}")
        return op

    def get_operation(self, project: str, scope: str, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self._get_op(project, scope, name).body)

    def wait_operation(self, project: str, scope: str, name: str) -> dict[str, Any]:
        """Block until DONE or ``operation_wait_max_s`` (real seconds), like operations.wait."""
        deadline = time.monotonic() + self.config.operation_wait_max_s
        with self._cond:
            op = self._get_op(project, scope, name)
            while op.body["status"] != "DONE" and not self._stopped:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return copy.deepcopy(op.body)

    def delete_operation(self, project: str, scope: str, name: str) -> dict[str, Any]:
        with self.lock:
            self._get_op(project, scope, name)
            del self._ops[name]
            return {}

    def list_operations(self, project: str, scope: str, query: Mapping[str, str]) -> dict[str, Any]:
        with self.lock:
            ops = [
                copy.deepcopy(o.body) for o in self._ops.values() if o.project == project and o.scope == scope
            ]
            page, token = self.page(ops, query, f"ops/{project}/{scope}/{query.get('filter', '')}")
            out: dict[str, Any] = {
                "kind": "compute#operationList",
                "id": f"projects/{project}/{scope}/operations",
                "selfLink": link(project, f"{scope}/operations"),
            }
            if page:
                out["items"] = page
            if token:
                out["nextPageToken"] = token
            return out
