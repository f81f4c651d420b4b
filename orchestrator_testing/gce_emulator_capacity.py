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
    gpu_quota_metric,
    region_of,
)


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


def stockout(
    config: EmulatorConfig, project: str, zone: str, spot: bool, gpu: str | None
) -> tuple[str, str, int] | None:
    for entry in config.stockouts:
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
    return stockout(config, inst_like.project, inst_like.zone, inst_like.spot, inst_like.gpu)
