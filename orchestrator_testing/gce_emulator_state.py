"""State and behaviour of the emulated Compute Engine: resources, operations, quotas, faults and the clock.

Everything here runs under one lock; timed transitions (boot, stop, delete, preemption) are events on a
heap run by one scheduler thread against an emulated clock, and test hooks run on their own thread so
a slow hook never delays the cloud's timeline. The HTTP layer lives in ``gce_emulator``.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import logging
import shutil
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.model.timings import NOTICE_WINDOW_S
from orchestrator_testing import gce_emulator_capacity as capacity
from orchestrator_testing.gce_emulator_capacity import admission, quota_items
from orchestrator_testing.gce_emulator_instance import build_instance
from orchestrator_testing.gce_emulator_model import (
    DISK_RE,
    ApiError,
    EmulatorConfig,
    Fault,
    Hook,
    InstanceRecord,
    OperationRecord,
    invalid,
    last_segment,
    link,
    not_found,
    not_ready,
    region_of,
)
from orchestrator_testing.gce_emulator_resources import DiskOwners, GlobalResources

log = logging.getLogger(__name__)


class GceState(DiskOwners):
    """The emulated cloud. Public methods are called by the HTTP layer (and tests) from many threads."""

    def __init__(self, config: EmulatorConfig, hooks: Mapping[str, Hook | None] | None = None) -> None:
        super().__init__(config, hooks)
        self.calls: Counter[str] = Counter()
        self.instances_created = 0
        self.faults = [Fault(**f) for f in config.faults]
        self._instances: dict[tuple[str, str, str], InstanceRecord] = {}
        self.resources = GlobalResources(self)

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
        capacity: int | None = None,
    ) -> None:
        """Refuse every such VM in ``zone`` (a stockout), or with ``capacity``, any beyond that many at once."""
        with self.lock:
            entry: dict[str, Any] = {"zone": zone, "gpu": gpu, "provisioning": provisioning, "code": code}
            if capacity is not None:
                entry["capacity"] = capacity
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

    def _get_instance(self, project: str, zone: str, name: str) -> InstanceRecord:
        inst = self._instances.get((project, zone, name))
        if inst is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return inst

    def _current(self, inst: InstanceRecord) -> bool:
        return self._instances.get((inst.project, inst.zone, inst.name)) is inst

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
            failure = admission(self.config, self._instances.values(), inst)
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

        # preempt_delay_s stands for GCE's 30 s window; scheduling.preemptionNoticeDuration lengthens it.
        notice = float((inst.body["scheduling"].get("preemptionNoticeDuration") or {}).get("seconds", 0))
        self.after(self.config.preempt_delay_s * (notice / NOTICE_WINDOW_S if notice else 1.0), finish)
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
            failure = admission(self.config, self._instances.values(), inst)
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
                "quotas": quota_items(self.config, self._instances.values(), project, region),
                "selfLink": link(project, f"regions/{region}"),
            }

    def capacity_advice(self, project: str, region: str, body: dict[str, Any], beta: bool = False) -> dict[str, Any]:
        """advice.capacity: whether a shape can be had now in a region's zones (its stockouts decide); SPOT only on
        the beta API."""
        with self.lock:
            if not any(region_of(z) == region for z in self.config.zones):
                raise not_found(f"projects/{project}/regions/{region}")
            return capacity.capacity_advice(self.config, list(self._instances.values()), project, region, body, beta)

    def get_project(self, project: str) -> dict[str, Any]:
        """projects.get: the project's global quotas (e.g. GPUS_ALL_REGIONS)."""
        with self.lock:
            return {
                "kind": "compute#project",
                "id": str(abs(hash(project)) % 10**6),
                "name": project,
                "quotas": quota_items(self.config, self._instances.values(), project, "global"),
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
