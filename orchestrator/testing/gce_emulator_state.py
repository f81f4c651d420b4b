"""State and behaviour of the emulated Compute Engine: resources, operations, quotas, faults and the clock.

Everything here runs under one lock; timed transitions (boot, stop, delete, preemption) are events on a
heap run by one scheduler thread against an emulated clock, and test hooks run on their own thread so
a slow hook never delays the cloud's timeline. The HTTP layer lives in ``gce_emulator``.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import heapq
import itertools
import logging
import queue
import random
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.testing.gce_emulator_filter import (
    FilterError,
    compile_filter,
    decode_page_token,
    encode_page_token,
)
from orchestrator.testing.gce_emulator_model import (
    DISK_RE,
    HOOK_EVENTS,
    HTTP_PHRASES,
    QUOTA_STATUSES,
    ApiError,
    Clock,
    EmulatorConfig,
    Fault,
    Hook,
    InstanceRecord,
    OperationRecord,
    build_instance,
    gpu_quota_metric,
    invalid,
    last_segment,
    link,
    not_found,
    not_ready,
    region_of,
)
from orchestrator.testing.gce_emulator_resources import GlobalResources

log = logging.getLogger(__name__)


class GceState:
    """The emulated cloud. Public methods are called by the HTTP layer (and tests) from many threads."""

    def __init__(self, config: EmulatorConfig, hooks: Mapping[str, Hook | None] | None = None) -> None:
        self.config = config
        self.clock = Clock(config.time_scale)
        self.hooks: dict[str, Hook] = {}
        for event, hook in (hooks or {}).items():
            if event not in HOOK_EVENTS:  # a typo would otherwise silently never fire
                raise ValueError(f"unknown emulator hook {event!r}; known: {', '.join(HOOK_EVENTS)}")
            if hook is not None:
                self.hooks[event] = hook
        self.calls: Counter[str] = Counter()
        self.instances_created = 0
        self.faults = [Fault(**f) for f in config.faults]
        self.lock = threading.RLock()
        self._cond = threading.Condition(self.lock)
        self._instances: dict[tuple[str, str, str], InstanceRecord] = {}
        self._ops: dict[str, OperationRecord] = {}
        self._request_ids: dict[tuple[str, str], str] = {}
        self.resources = GlobalResources(self)
        self._ids = itertools.count(random.randrange(10**18, 2 * 10**18))
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._hook_queue: queue.Queue[tuple[Hook, dict[str, Any]] | None] = queue.Queue()
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._run_timers, name="gce-emulator-timers", daemon=True),
            threading.Thread(target=self._run_hooks, name="gce-emulator-hooks", daemon=True),
        ]

    # ------------------------------------------------------------------ lifecycle of the emulator

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

    # ------------------------------------------------------------------ control API (tests)

    def advance(self, seconds: float) -> None:
        with self._cond:
            self.clock.advance(seconds)
            self._cond.notify_all()

    def add_fault(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def take_fault(self, endpoint: str) -> Fault | None:
        """Count the call and consume the first matching fault."""
        with self.lock:
            self.calls[endpoint] += 1
            for fault in self.faults:
                if fnmatch.fnmatchcase(endpoint, fault.endpoint):
                    if fault.count is not None:
                        fault.count -= 1
                        if fault.count <= 0:
                            self.faults.remove(fault)
                    return fault
            return None

    def latency(self, endpoint: str) -> float:
        with self.lock:
            return sum(s for pat, s in self.config.latency_s.items() if fnmatch.fnmatchcase(endpoint, pat))

    def set_stockout(
        self,
        zone: str,
        gpu: str = "*",
        provisioning: str = "*",
        enabled: bool = True,
        code: str = "ZONE_RESOURCE_POOL_EXHAUSTED",
    ) -> None:
        with self.lock:
            entry = {"zone": zone, "gpu": gpu, "provisioning": provisioning, "code": code}
            stockouts = self.config.stockouts
            stockouts[:] = [
                s
                for s in stockouts
                if (s.get("zone"), s.get("gpu", "*"), s.get("provisioning", "*")) != (zone, gpu, provisioning)
            ]
            if enabled:
                stockouts.append(entry)

    def set_quota(self, region: str, metric: str, limit: float | None) -> None:
        with self.lock:
            metrics = self.config.quotas.setdefault(region, {})
            if limit is None:
                metrics.pop(metric, None)
            else:
                metrics[metric] = limit

    def configure(self, **changes: Any) -> None:
        """Change config knobs at runtime (delays, latency, unreachable zones, ...)."""
        with self.lock:
            known = {f.name for f in dataclasses.fields(EmulatorConfig)}
            for key, value in changes.items():
                if key not in known or key == "time_scale":
                    raise ValueError(f"cannot change emulator config key {key!r} at runtime")
                setattr(self.config, key, value)

    def reset_calls(self) -> None:
        with self.lock:
            self.calls.clear()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            by_status = Counter(inst.status for inst in self._instances.values())
            return {
                "instances_by_status": dict(by_status),
                "instances": [
                    {
                        "project": i.project,
                        "zone": i.zone,
                        "name": i.name,
                        "status": i.status,
                        "spot": i.spot,
                        "gpu": i.gpu,
                        "gpu_count": i.gpu_count,
                    }
                    for i in sorted(self._instances.values(), key=lambda i: (i.zone, i.name))
                ],
                "instances_created": self.instances_created,
                "calls": dict(self.calls),
                "operations": len(self._ops),
                "firewalls": sorted(name for _, name in self.resources.firewalls),
                "images": sorted(name for _, name in self.resources.images),
                "faults": [dataclasses.asdict(f) for f in self.faults],
                "now": self.clock.now(),
            }

    def instance(
        self, name: str, zone: str | None = None, project: str | None = None
    ) -> dict[str, Any] | None:
        with self.lock:
            for inst in self._instances.values():
                if inst.name == name and zone in (None, inst.zone) and project in (None, inst.project):
                    return copy.deepcopy(inst.body)
            return None

    def preempt(self, name: str, zone: str | None = None, project: str | None = None) -> str:
        """Revoke a running spot/preemptible instance as GCE does; returns the preemption operation."""
        with self.lock:
            matches = [
                i
                for i in self._instances.values()
                if i.name == name and zone in (None, i.zone) and project in (None, i.project)
            ]
            if not matches:
                raise not_found(f"zones/{zone or '*'}/instances/{name}")
            inst = matches[0]
            if not (inst.spot or inst.legacy_preemptible):
                raise ApiError(400, "invalid", f"Instance '{name}' is not a spot or preemptible instance")
            if inst.status != "RUNNING":
                raise not_ready(inst.path)
            return self._preempt_locked(inst)

    # ------------------------------------------------------------------ helpers

    def _check_zone(self, zone: str) -> None:
        if zone not in self.config.zones:
            raise invalid("zone", zone, "Unknown zone.")

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

    def _get_instance(self, project: str, zone: str, name: str) -> InstanceRecord:
        inst = self._instances.get((project, zone, name))
        if inst is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return inst

    def _current(self, inst: InstanceRecord) -> bool:
        return self._instances.get((inst.project, inst.zone, inst.name)) is inst

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

    # ------------------------------------------------------------------ quota & capacity

    def _demand(
        self,
        zone: str,
        spot: bool,
        cpus: int,
        gpu: str | None,
        gpu_count: int,
    ) -> dict[tuple[str, str], float]:
        region = region_of(zone)
        regional = self.config.quotas.get(region, {})
        # GCE charges spot VMs to the PREEMPTIBLE_* quota when the project has one, else the regular one.
        cpu_metric = "PREEMPTIBLE_CPUS" if spot and "PREEMPTIBLE_CPUS" in regional else "CPUS"
        demand = {(region, cpu_metric): float(cpus), (region, "INSTANCES"): 1.0}
        if gpu and gpu_count:
            preemptible_metric = gpu_quota_metric(gpu, preemptible=True)
            metric = preemptible_metric if spot and preemptible_metric in regional else gpu_quota_metric(gpu)
            demand[(region, metric)] = float(gpu_count)
            demand[("global", "GPUS_ALL_REGIONS")] = float(gpu_count)
        return demand

    def _usage(self, project: str) -> Counter[tuple[str, str]]:
        """(region or "global", metric) -> what the project's instances in QUOTA_STATUSES hold."""
        usage: Counter[tuple[str, str]] = Counter()
        for inst in self._instances.values():
            if inst.project == project and inst.status in QUOTA_STATUSES:
                usage.update(self._demand(inst.zone, inst.spot, inst.cpus, inst.gpu, inst.gpu_count))
        return usage

    def _quota_items(self, project: str, scope: str) -> list[dict[str, Any]]:
        """The ``quotas`` field of a Region (or Project, scope "global"): configured limits and usage."""
        usage = self._usage(project)
        return [
            {"metric": metric, "limit": float(limit), "usage": float(usage[(scope, metric)])}
            for metric, limit in sorted(self.config.quotas.get(scope, {}).items())
        ]

    def _quota_problem(
        self, project: str, zone: str, spot: bool, cpus: int, gpu: str | None, gpu_count: int
    ) -> str | None:
        demand = self._demand(zone, spot, cpus, gpu, gpu_count)
        usage = self._usage(project)
        for (scope, metric), amount in sorted(demand.items()):
            limit = self.config.quotas.get(scope, {}).get(metric)
            if limit is not None and usage[(scope, metric)] + amount > limit:
                where = "globally" if scope == "global" else f"in region {scope}"
                return f"Quota '{metric}' exceeded.  Limit: {float(limit)} {where}."
        return None

    def _stockout(self, project: str, zone: str, spot: bool, gpu: str | None) -> tuple[str, str, int] | None:
        for entry in self.config.stockouts:
            if entry.get("zone", "*") not in ("*", zone):
                continue
            if entry.get("gpu", "*") not in ("*", None, gpu):
                continue
            provisioning = entry.get("provisioning", "*")
            if (provisioning == "spot" and not spot) or (provisioning == "standard" and spot):
                continue
            code = entry.get("code", "ZONE_RESOURCE_POOL_EXHAUSTED")
            message = (
                f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available "
                "to fulfill the request.  Try a different zone, or try again later."
            )
            return code, message, 503
        return None

    def _admission(self, inst_like: InstanceRecord) -> tuple[str, str, int] | None:
        """Quota first (as GCE checks it), then capacity; raises when quota errors are synchronous."""
        problem = self._quota_problem(
            inst_like.project,
            inst_like.zone,
            inst_like.spot,
            inst_like.cpus,
            inst_like.gpu,
            inst_like.gpu_count,
        )
        if problem is not None:
            if self.config.quota_errors_as_http:
                raise ApiError(403, "quotaExceeded", problem)
            return "QUOTA_EXCEEDED", problem, 403
        return self._stockout(inst_like.project, inst_like.zone, inst_like.spot, inst_like.gpu)

    # ------------------------------------------------------------------ instances

    def insert_instance(
        self,
        project: str,
        zone: str,
        body: dict[str, Any],
        request_id: str | None,
    ) -> dict[str, Any]:
        with self.lock:
            self._check_zone(zone)
            if (previous := self.dedupe(project, request_id)) is not None:
                return previous
            inst = build_instance(self.config, project, zone, body, self.new_id(), self.clock.timestamp())
            for disk in body.get("disks") or []:
                if disk.get("boot") and (disk.get("initializeParams") or {}).get("sourceImage"):
                    self.resources.resolve_image(project, disk["initializeParams"]["sourceImage"])
            if (project, zone, inst.name) in self._instances:
                raise ApiError(409, "alreadyExists", f"The resource '{inst.path}' already exists")
            op = self.new_op(project, f"zones/{zone}", "insert", inst.body["selfLink"], inst.body["id"])
            failure = self._admission(inst)
            if failure is not None:
                self._finish_later(op, failure)
                return self.remember(project, request_id, op)
            self._instances[(project, zone, inst.name)] = inst
            self.instances_created += 1
            inst.busy_op = op.body["name"]
            self._make_workdir(inst)
            self._boot(inst, op)
            return self.remember(project, request_id, op)

    def _set_nat(self, inst: InstanceRecord, up: bool) -> None:
        """Ephemeral external IPs exist only while the VM runs, as on GCE."""
        for nic in inst.body["networkInterfaces"]:
            for ac in nic["accessConfigs"]:
                if up:
                    ac["natIP"] = self.config.nat_ip
                else:
                    ac.pop("natIP", None)

    def _make_workdir(self, inst: InstanceRecord) -> None:
        if self.config.workdir_root:
            (Path(self.config.workdir_root) / inst.name).mkdir(parents=True, exist_ok=True)

    def _boot(self, inst: InstanceRecord, op: OperationRecord) -> None:
        inst.boots += 1
        boot = inst.boots
        inst.body["status"] = "PROVISIONING"

        def staging() -> None:
            if self._current(inst) and inst.boots == boot and inst.status == "PROVISIONING":
                inst.body["status"] = "STAGING"

        def running() -> None:
            if not (self._current(inst) and inst.boots == boot and inst.status == "STAGING"):
                return
            inst.body["status"] = "RUNNING"
            inst.body["lastStartTimestamp"] = self.clock.timestamp()
            self._set_nat(inst, up=True)
            inst.busy_op = None
            self.finish_op(op)
            self._emit("running", inst)
            if inst.legacy_preemptible:
                self.after(self.config.preemptible_max_runtime_s, lambda: self._max_runtime(inst, boot))
            if inst.max_run_s is not None:
                self.after(inst.max_run_s, lambda: self._time_limit(inst, boot))

        self.after(self.config.boot_delay_s / 2, staging)
        self.after(self.config.boot_delay_s, running)

    def _max_runtime(self, inst: InstanceRecord, boot: int) -> None:
        if self._current(inst) and inst.boots == boot and inst.status == "RUNNING":
            self._preempt_locked(inst)

    def _time_limit(self, inst: InstanceRecord, boot: int) -> None:
        """maxRunDuration / terminationTime reached: GCE stops or deletes the VM itself (no preemption)."""
        if not (self._current(inst) and inst.boots == boot and inst.status == "RUNNING" and not inst.deleting):
            return
        inst.body["status"] = "STOPPING"
        inst.boots += 1
        stop = inst.boots

        def finish() -> None:
            if self._current(inst) and inst.boots == stop and inst.status == "STOPPING" and not inst.deleting:
                self._remove(inst) if inst.termination_action == "DELETE" else self._terminated(inst)

        self.after(self.config.stop_delay_s, finish)

    def _preempt_locked(self, inst: InstanceRecord) -> str:
        op = self.new_op(
            inst.project,
            f"zones/{inst.zone}",
            "compute.instances.preempted",
            inst.body["selfLink"],
            inst.body["id"],
            user="system",
        )
        op.body["statusMessage"] = "Instance was preempted."
        self.finish_op(op)
        inst.body["status"] = "STOPPING"
        inst.boots += 1
        boot = inst.boots
        self._emit("preempted", inst)

        def finish() -> None:
            if not (
                self._current(inst) and inst.boots == boot and inst.status == "STOPPING" and not inst.deleting
            ):
                return
            if inst.termination_action == "DELETE":
                self._remove(inst)
            else:
                self._terminated(inst)

        self.after(self.config.preempt_delay_s, finish)
        return str(op.body["name"])

    def _terminated(self, inst: InstanceRecord) -> None:
        inst.body["status"] = "TERMINATED"
        inst.body["lastStopTimestamp"] = self.clock.timestamp()
        self._set_nat(inst, up=False)
        self._emit("terminated", inst)

    def _remove(self, inst: InstanceRecord) -> None:
        del self._instances[(inst.project, inst.zone, inst.name)]
        if self.config.workdir_root and self.config.remove_workdir_on_delete:
            shutil.rmtree(Path(self.config.workdir_root) / inst.name, ignore_errors=True)
        self._emit("deleted", inst)

    def get_instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.lock:
            self._check_zone(zone)
            return copy.deepcopy(self._get_instance(project, zone, name).body)

    def delete_instance(self, project: str, zone: str, name: str, request_id: str | None) -> dict[str, Any]:
        with self.lock:
            self._check_zone(zone)
            if (previous := self.dedupe(project, request_id)) is not None:
                return previous
            inst = self._get_instance(project, zone, name)
            if inst.busy_op is not None:
                raise not_ready(inst.path)
            op = self.new_op(project, f"zones/{zone}", "delete", inst.body["selfLink"], inst.body["id"])
            inst.busy_op, inst.deleting = op.body["name"], True
            inst.body["status"] = "STOPPING"

            def gone() -> None:
                if self._current(inst):
                    self._remove(inst)
                self.finish_op(op)

            self.after(self.config.delete_delay_s, gone)
            return self.remember(project, request_id, op)

    def stop_instance(self, project: str, zone: str, name: str, request_id: str | None) -> dict[str, Any]:
        with self.lock:
            self._check_zone(zone)
            if (previous := self.dedupe(project, request_id)) is not None:
                return previous
            inst = self._get_instance(project, zone, name)
            if inst.busy_op is not None:
                raise not_ready(inst.path)
            op = self.new_op(project, f"zones/{zone}", "stop", inst.body["selfLink"], inst.body["id"])
            if inst.status == "TERMINATED":
                self._finish_later(op)
                return self.remember(project, request_id, op)
            inst.busy_op = op.body["name"]
            inst.body["status"] = "STOPPING"
            inst.boots += 1
            boot = inst.boots

            def stopped() -> None:
                if self._current(inst) and inst.boots == boot and inst.status == "STOPPING":
                    inst.busy_op = None
                    self._terminated(inst)
                self.finish_op(op)

            self.after(self.config.stop_delay_s, stopped)
            return self.remember(project, request_id, op)

    def start_instance(self, project: str, zone: str, name: str, request_id: str | None) -> dict[str, Any]:
        with self.lock:
            self._check_zone(zone)
            if (previous := self.dedupe(project, request_id)) is not None:
                return previous
            inst = self._get_instance(project, zone, name)
            if inst.busy_op is not None:
                raise not_ready(inst.path)
            op = self.new_op(project, f"zones/{zone}", "start", inst.body["selfLink"], inst.body["id"])
            if inst.status != "TERMINATED":
                self._finish_later(op)
                return self.remember(project, request_id, op)
            failure = self._admission(inst)
            if failure is not None:
                self._finish_later(op, failure)
                return self.remember(project, request_id, op)
            inst.busy_op = op.body["name"]
            self._boot(inst, op)
            return self.remember(project, request_id, op)

    def list_instances(self, project: str, zone: str, query: Mapping[str, str]) -> dict[str, Any]:
        with self.lock:
            self._check_zone(zone)
            items = [
                copy.deepcopy(i.body)
                for i in sorted(self._instances.values(), key=lambda i: i.name)
                if i.project == project and i.zone == zone
            ]
            page, token = self.page(items, query, f"list/{project}/{zone}/{query.get('filter', '')}")
            out: dict[str, Any] = {
                "kind": "compute#instanceList",
                "id": f"projects/{project}/zones/{zone}/instances",
                "selfLink": link(project, f"zones/{zone}/instances"),
            }
            if page:
                out["items"] = page
            if token:
                out["nextPageToken"] = token
            return out

    def aggregated_instances(self, project: str, query: Mapping[str, str]) -> dict[str, Any]:
        with self.lock:
            unreachable = [z for z in self.config.unreachable_zones if z in self.config.zones]
            partial = query.get("returnPartialSuccess", "").lower() == "true"
            if unreachable and not partial:
                raise ApiError(
                    503, "backendError", f"Scopes unreachable: zones/{', zones/'.join(unreachable)}"
                )
            items = [
                copy.deepcopy(i.body)
                for i in sorted(self._instances.values(), key=lambda i: (i.zone, i.name))
                if i.project == project and i.zone not in unreachable
            ]
            page, token = self.page(items, query, f"agg/{project}/{query.get('filter', '')}")
            scoped: dict[str, Any] = {}
            for zone in self.config.zones:
                if zone in unreachable:
                    continue
                instances = [b for b in page if last_segment(b["zone"]) == zone]
                scope = f"zones/{zone}"
                if instances:
                    scoped[scope] = {"instances": instances}
                else:
                    scoped[scope] = {
                        "warning": {
                            "code": "NO_RESULTS_ON_PAGE",
                            "message": f"There are no results for scope '{scope}' on this page.",
                            "data": [{"key": "scope", "value": scope}],
                        }
                    }
            out: dict[str, Any] = {
                "kind": "compute#instanceAggregatedList",
                "id": f"projects/{project}/aggregated/instances",
                "items": scoped,
                "selfLink": link(project, "aggregated/instances"),
            }
            if token:
                out["nextPageToken"] = token
            if unreachable:
                out["unreachables"] = [f"zones/{z}" for z in unreachable]
            return out

    # ------------------------------------------------------------------ operations

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

    # ------------------------------------------------------------------ zones

    def list_zones(self, project: str, query: Mapping[str, str]) -> dict[str, Any]:
        with self.lock:
            zones = [self._zone_body(project, z) for z in self.config.zones]
            page, token = self.page(zones, query, f"zones/{project}/{query.get('filter', '')}")
            out: dict[str, Any] = {
                "kind": "compute#zoneList",
                "items": page,
                "selfLink": link(project, "zones"),
            }
            if token:
                out["nextPageToken"] = token
            return out

    def get_zone(self, project: str, zone: str) -> dict[str, Any]:
        with self.lock:
            if zone not in self.config.zones:
                raise not_found(f"projects/{project}/zones/{zone}")
            return self._zone_body(project, zone)

    def get_region(self, project: str, region: str) -> dict[str, Any]:
        """regions.get: a Region with its quotas (limit and current usage), as GCE reports them."""
        with self.lock:
            zones = [z for z in self.config.zones if region_of(z) == region]
            if not zones:
                raise not_found(f"projects/{project}/regions/{region}")
            return {
                "kind": "compute#region",
                "id": str(abs(hash(region)) % 10**6),
                "name": region,
                "status": "UP",
                "zones": [link(project, f"zones/{z}") for z in zones],
                "quotas": self._quota_items(project, region),
                "selfLink": link(project, f"regions/{region}"),
            }

    def get_project(self, project: str) -> dict[str, Any]:
        """projects.get: the project's global quotas (e.g. GPUS_ALL_REGIONS)."""
        with self.lock:
            return {
                "kind": "compute#project",
                "id": str(abs(hash(project)) % 10**6),
                "name": project,
                "quotas": self._quota_items(project, "global"),
                "selfLink": link(project, "").rstrip("/"),
            }

    def _zone_body(self, project: str, zone: str) -> dict[str, Any]:
        return {
            "kind": "compute#zone",
            "id": str(abs(hash(zone)) % 10**6),
            "name": zone,
            "status": "UP",
            "region": link(project, f"regions/{region_of(zone)}"),
            "selfLink": link(project, f"zones/{zone}"),
            "availableCpuPlatforms": ["Intel Broadwell", "Intel Skylake"],
        }

    def disk_owner(self, project: str, source_disk: str) -> InstanceRecord:
        m = DISK_RE.match(source_disk)
        if m is None:
            raise invalid("resource.sourceDisk", source_disk)
        for inst in self._instances.values():
            if (
                inst.project == (m["project"] or project)
                and inst.zone == m["zone"]
                and last_segment(inst.body["disks"][0]["source"]) == m["name"]
            ):
                return inst
        raise not_found(f"projects/{m['project'] or project}/zones/{m['zone']}/disks/{m['name']}")
