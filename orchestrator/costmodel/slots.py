"""A pinned cluster expanded into slots: one row per instance the job needs, with its hourly price.

A slot (``worker-2``) outlives its instances: a revoked worker's replacement fills the same slot
with the next generation, so names stay deterministic: ``<job>-worker-2-1``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.costmodel.batches import DEFAULT_BATCH as DEFAULT_BATCH  # re-exported: callers import them here
from orchestrator.costmodel.batches import price_book_for as price_book_for
from orchestrator.costmodel.batches import proportional_split as proportional_split
from orchestrator.costmodel.batches import worker_batches as worker_batches
from orchestrator.costmodel.compute import Calibration
from orchestrator.costmodel.stepmodel import StepModel
from orchestrator.model.catalog import Catalog, load_catalog
from orchestrator.model.instances import Role
from orchestrator.model.spec import (
    LOCAL_ZONE,
    Chief,
    JobSpec,
    ParameterServers,
    TrainingMode,
)


@dataclass(frozen=True)
class Slot:
    role: Role
    index: int
    gpu: str | None
    machine_type: str
    zone: str
    spot: bool
    price_per_hour: float
    batch: int | None = None  # workers only
    group: int = -1  # index of the worker group in the spec
    on_demand_price_per_hour: float = 0.0  # what a fallback-on-demand replacement costs
    zones: tuple[str, ...] = ()  # where to create it, in order: a stockout moves on to the next
    gpu_count: int = 1  # GPUs on the instance: an accelerator-optimized type's fixed count (a3-highgpu-2g: 2)
    flex_start: bool = False  # workers only: provisioning: flex_start (GCE Dynamic Workload Scheduler)
    # Worker 0 of an async job with cluster.chief.on_worker0 (the ICAC'19 setup): its task runs the chief too,
    # so the job has no chief slot (no VM, no bill) and this worker's loss stops training like a chief's.
    hosts_chief: bool = False

    def price(self, spot: bool) -> float:
        """Hourly price as requested: the slot's own, or on-demand for a fallback replacement."""
        return self.price_per_hour if spot == self.spot or spot else self.on_demand_price_per_hour

    @property
    def name(self) -> str:
        return f"{self.role.value}-{self.index}"


def _zones(spec: JobSpec, zone: str | None, gpu: str | None, catalog: Catalog) -> tuple[str, ...]:
    """The slot's zone first, then the other allowed zones that offer its GPU (stockout fallbacks)."""
    if not spec.provider.is_cloud:
        local = spec.provider.as_local()
        replayed = tuple(local.zone_availability_traces) if local is not None else ()
        if not replayed:
            return (zone or LOCAL_ZONE,)
        return (zone, *(z for z in replayed if z != zone)) if zone else replayed
    allowed = spec.provider.allowed_zones
    offered = set(catalog.zones_for(gpu)) if gpu else set(catalog.all_zones())
    others = [z for z in allowed if z in offered and z != zone]
    ordered = ([zone] if zone else []) + others
    return tuple(ordered) or ((allowed[0],) if allowed else ("us-central1-c",))


def expand(spec: JobSpec, catalog: Catalog | None = None, book: str | None = None,
           calibration: Calibration | None = None, steps: StepModel | None = None) -> list[Slot]:
    """Every slot of a pinned cluster: parameter servers, the chief (async, unless it runs on worker 0), then
    the workers (their batches split with ``calibration``'s speeds; None: the shipped calibration's)."""
    cat = catalog or load_catalog()
    prices = price_book_for(spec, cat, book)
    cluster = spec.pinned
    cloud = spec.provider.is_cloud
    disk = stopped_disk_usd_per_hour(spec, cat)

    def cpu_slot(role: Role, index: int, cfg: ParameterServers | Chief) -> Slot:
        machine = cfg.machine_type if cloud else "local"
        zones = _zones(spec, cfg.zone, None, cat)
        return Slot(role, index, None, machine, zones[0], cfg.spot,
                    prices.instance_price(machine, None, 0, cfg.spot) + disk,
                    on_demand_price_per_hour=prices.instance_price(machine, None, 0, False) + disk, zones=zones)

    slots = [cpu_slot(Role.PS, i, cluster.parameter_servers) for i in range(spec.ps_count)]
    chief_on_worker0 = spec.mode == TrainingMode.ASYNC and cluster.chief.on_worker0
    if spec.mode == TrainingMode.ASYNC and not chief_on_worker0:
        slots.append(cpu_slot(Role.CHIEF, 0, cluster.chief))
    batches = worker_batches(spec, cat, calibration, steps)
    index = 0
    for g, group in enumerate(cluster.workers):
        gpu = cat.gpu(group.gpu)
        machine = (group.machine_type or gpu.default_machine_type) if cloud else "local"
        zones = _zones(spec, group.zone, gpu.key, cat)
        for _ in range(group.count):
            slots.append(
                Slot(
                    Role.WORKER,
                    index,
                    gpu.key,
                    machine,
                    zones[0],
                    group.spot,
                    prices.instance_price(machine, gpu.key, 1, group.spot) + disk,
                    batches[index],
                    g,
                    on_demand_price_per_hour=prices.instance_price(machine, gpu.key, 1, False) + disk,
                    zones=zones,
                    gpu_count=cat.gpus_per_instance(machine),
                    flex_start=group.provisioning == "flex_start",
                    hosts_chief=chief_on_worker0 and index == 0,
                )
            )
            index += 1
    return slots


def on_gpu(spec: JobSpec, slot: Slot, gpu: str, catalog: Catalog | None = None, book: str | None = None) -> Slot:
    """``slot`` (a spot worker) on another GPU type (``policy.also_gpus``): that type's usual machine type, its
    prices, and the allowed zones that offer it; the batch as planned."""
    cat = catalog or load_catalog()
    prices = price_book_for(spec, cat, book)
    key = cat.gpu(gpu).key
    machine = cat.gpu(key).default_machine_type if spec.provider.is_cloud else "local"
    disk = stopped_disk_usd_per_hour(spec, cat)
    zones = _zones(spec, None, key, cat)
    return replace(slot, gpu=key, machine_type=machine, zone=zones[0], zones=zones,
                   price_per_hour=prices.instance_price(machine, key, 1, slot.spot) + disk,
                   on_demand_price_per_hour=prices.instance_price(machine, key, 1, False) + disk,
                   gpu_count=cat.gpus_per_instance(machine), flex_start=False)


BOOT_DISK_GB = 50  # GceProvider's default boot disk (pd-balanced)


def stopped_disk_usd_per_hour(spec: JobSpec, catalog: Catalog) -> float:
    """With termination_action STOP a preempted VM keeps its boot disk (billed until deleted): the
    ledger bills every gce instance its disk on top. DELETE (the default) leaves no disk behind."""
    if not spec.provider.stopped_disk_billed:
        return 0.0
    return round(BOOT_DISK_GB * catalog.fact("pd_balanced_usd_per_gb_month") / 730.0, 6)


def cluster_shape(spec: JobSpec) -> str:
    """'1ps+chief+2xk80(spot)+1xv100' — what job_summary shows."""
    cluster = spec.pinned
    parts = [f"{spec.ps_count}ps"] if spec.ps_count else []
    if spec.mode == TrainingMode.ASYNC:
        parts.append("chief@worker0" if cluster.chief.on_worker0 else "chief")
    for g in cluster.workers:
        parts.append(f"{g.count}x{g.gpu}{'(spot)' if g.spot else ''}")
    return "+".join(parts)
