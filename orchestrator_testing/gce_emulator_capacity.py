"""Quota and capacity of the GCE emulator: what instances demand and hold, and whether a new one is admitted.

Pure functions of the configuration and the instances: the state calls them under its lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from orchestrator_testing.gce_emulator_model import (
    QUOTA_STATUSES,
    ApiError,
    EmulatorConfig,
    InstanceRecord,
    bundled_gpus,
    gpu_quota_metric,
    invalid,
    last_segment,
    region_of,
)

# What the emulator answers for a spot shape it can place (GCE's bands: 0.7-1.0 high, 0.4-0.6 moderate, 0.0-0.3
# low; estimatedUptime is one of 3600s and 600s): a stocked-out zone scores 0, any other 1.
ADVICE_UPTIME = "3600s"


def demand(
    config: EmulatorConfig,
    zone: str,
    spot: bool,
    cpus: int,
    gpu: str | None,
    gpu_count: int,
) -> dict[tuple[str, str], float]:
    region = region_of(zone)
    regional = config.quotas.get(region, {})
    # GCE charges spot VMs to the PREEMPTIBLE_* quota when the project has one, else the regular one.
    cpu_metric = "PREEMPTIBLE_CPUS" if spot and "PREEMPTIBLE_CPUS" in regional else "CPUS"
    demand = {(region, cpu_metric): float(cpus), (region, "INSTANCES"): 1.0}
    if gpu and gpu_count:
        preemptible_metric = gpu_quota_metric(gpu, preemptible=True)
        metric = preemptible_metric if spot and preemptible_metric in regional else gpu_quota_metric(gpu)
        demand[(region, metric)] = float(gpu_count)
        demand[("global", "GPUS_ALL_REGIONS")] = float(gpu_count)
    return demand


def usage(config: EmulatorConfig, instances: Iterable[InstanceRecord], project: str) -> Counter[tuple[str, str]]:
    """(region or "global", metric) -> what the project's instances in QUOTA_STATUSES hold."""
    usage: Counter[tuple[str, str]] = Counter()
    for inst in instances:
        if inst.project == project and inst.status in QUOTA_STATUSES:
            usage.update(demand(config, inst.zone, inst.spot, inst.cpus, inst.gpu, inst.gpu_count))
    return usage


def quota_items(
    config: EmulatorConfig, instances: Iterable[InstanceRecord], project: str, scope: str
) -> list[dict[str, Any]]:
    """The ``quotas`` field of a Region (or Project, scope "global"): configured limits and usage."""
    held = usage(config, instances, project)
    return [
        {"metric": metric, "limit": float(limit), "usage": float(held[(scope, metric)])}
        for metric, limit in sorted(config.quotas.get(scope, {}).items())
    ]


def quota_problem(
    config: EmulatorConfig,
    instances: Iterable[InstanceRecord],
    project: str,
    zone: str,
    spot: bool,
    cpus: int,
    gpu: str | None,
    gpu_count: int,
) -> str | None:
    wanted = demand(config, zone, spot, cpus, gpu, gpu_count)
    held = usage(config, instances, project)
    for (scope, metric), amount in sorted(wanted.items()):
        limit = config.quotas.get(scope, {}).get(metric)
        if limit is not None and held[(scope, metric)] + amount > limit:
            where = "globally" if scope == "global" else f"in region {scope}"
            return f"Quota '{metric}' exceeded.  Limit: {float(limit)} {where}."
    return None


def _matches(entry: dict[str, Any], zone: str, spot: bool, gpu: str | None) -> bool:
    provisioning = entry.get("provisioning", "*")
    return (entry.get("zone", "*") in ("*", zone) and entry.get("gpu", "*") in ("*", None, gpu)
            and not (provisioning == "spot" and not spot) and not (provisioning == "standard" and spot))


def stockout(
    config: EmulatorConfig, project: str, zone: str, spot: bool, gpu: str | None,
    instances: Iterable[InstanceRecord] = (), size: int = 1,
) -> tuple[str, str, int] | None:
    """Whether ``size`` more VMs of the kind are refused: a stockout entry refuses every one; an entry with a
    ``capacity`` (set_stockout(..., capacity=k)) lets the zone hold at most k of them at once (the project's VMs
    of the kind in QUOTA_STATUSES count against it)."""
    instances = list(instances)
    for entry in config.stockouts:
        if not _matches(entry, zone, spot, gpu):
            continue
        capacity = entry.get("capacity")
        if capacity is not None:
            held = sum(1 for i in instances if i.project == project and i.status in QUOTA_STATUSES
                       and i.zone == zone and _matches(entry, i.zone, i.spot, i.gpu))
            if held + size <= int(capacity):
                continue
        code = entry.get("code", "ZONE_RESOURCE_POOL_EXHAUSTED")
        message = (
            f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available "
            "to fulfill the request.  Try a different zone, or try again later."
        )
        return code, message, 503
    return None


def admission(
    config: EmulatorConfig, instances: Iterable[InstanceRecord], inst_like: InstanceRecord
) -> tuple[str, str, int] | None:
    """Quota first (as GCE checks it), then capacity; raises when quota errors are synchronous."""
    problem = quota_problem(
        config,
        instances,
        inst_like.project,
        inst_like.zone,
        inst_like.spot,
        inst_like.cpus,
        inst_like.gpu,
        inst_like.gpu_count,
    )
    if problem is not None:
        if config.quota_errors_as_http:
            raise ApiError(403, "quotaExceeded", problem)
        return "QUOTA_EXCEEDED", problem, 403
    return stockout(config, inst_like.project, inst_like.zone, inst_like.spot, inst_like.gpu, instances)


def capacity_advice(config: EmulatorConfig, instances: Iterable[InstanceRecord], project: str, region: str,
                    body: dict[str, Any], beta: bool = False) -> dict[str, Any]:
    """``regions.advice.capacity``: can ``size`` more VMs of the request's shape be had in the request's zones
    (default: the region's)? The emulator's answer follows its stockouts and capacities: obtainability 1.0 when one
    zone that offers the GPU places them all for the provisioning model (ANY / ANY_SINGLE_ZONE), 0.0 when none
    does, in one recommendation. SPOT is answered on the beta API only (``beta``), as GCE's Public Preview."""
    size = int(body.get("size") or 0)
    if size < 1:
        raise invalid("size", body.get("size"), "Must be at least 1.")
    selections = sorted((body.get("instanceFlexibilityPolicy") or {}).get("instanceSelections", {}).values(),
                        key=lambda s: int(s.get("rank", 0)))
    if not selections or not selections[0].get("machineTypes"):
        raise invalid("instanceFlexibilityPolicy.instanceSelections", "", "Name at least one machine type.")
    machine = str(selections[0]["machineTypes"][0])
    accelerators = selections[0].get("guestAccelerators") or []
    bundled = bundled_gpus(machine)
    gpu = bundled[0] if bundled else last_segment(accelerators[0]["acceleratorType"]) if accelerators else None
    model = (((body.get("instanceProperties") or {}).get("scheduling") or {}).get("provisioningModel")) or "STANDARD"
    if model == "SPOT" and not beta:  # the v1 backend refuses SPOT (Public Preview: beta only)
        raise invalid("instanceProperties.scheduling.provisioningModel", model, "Use the beta API for SPOT advice.")
    asked = [last_segment(z["zone"]) for z in (body.get("distributionPolicy") or {}).get("zones", [])]
    zones = [z for z in asked or config.zones if region_of(z) == region and z in config.zones]
    placeable = [z for z in zones if (gpu is None or gpu in config.accelerators.get(z, config.default_accelerators))
                 and stockout(config, project, z, model == "SPOT", gpu, instances, size) is None]
    shards = [{"zone": f"zones/{placeable[0]}", "machineType": machine, "instanceCount": size,
               "provisioningModel": model}] if placeable else []
    return {"recommendations": [{"scores": {"obtainability": 1.0 if placeable else 0.0,
                                            "estimatedUptime": ADVICE_UPTIME}, "shards": shards}]}
