"""A pinned cluster expanded into slots: one row per instance the job needs, with its hourly price.

A slot (``worker-2``) outlives its instances: a revoked worker's replacement fills the same slot
with the next generation, so names stay deterministic: ``<job>-worker-2-1``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.catalog import Catalog, PriceBook, load_catalog
from orchestrator.providers.base import Role
from orchestrator.spec import LOCAL_ZONE, Chief, GceProvider, JobSpec, LocalProvider, ParameterServers, TrainingMode

DEFAULT_BATCH = 128


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

    def price(self, spot: bool) -> float:
        """Hourly price as requested: the slot's own, or on-demand for a fallback replacement."""
        return self.price_per_hour if spot == self.spot or spot else self.on_demand_price_per_hour

    @property
    def name(self) -> str:
        return f"{self.role.value}-{self.index}"


def price_book_for(spec: JobSpec, catalog: Catalog | None = None, book: str | None = None) -> PriceBook:
    cat = catalog or load_catalog()
    base = cat.price_book(book or spec.pricing.book)
    return base.with_overrides(
        {k: (v.on_demand, v.spot) for k, v in spec.pricing.overrides.items()}, set(cat.machine_types)
    )


def _zones(spec: JobSpec, zone: str | None, gpu: str | None, catalog: Catalog) -> tuple[str, ...]:
    """The slot's zone first, then the other allowed zones that offer its GPU (stockout fallbacks)."""
    if not isinstance(spec.provider, GceProvider):
        return (zone or LOCAL_ZONE,)
    offered = set(catalog.zones_for(gpu)) if gpu else set(catalog.all_zones())
    others = [z for z in spec.provider.zones if z in offered and z != zone]
    ordered = ([zone] if zone else []) + others
    return tuple(ordered) or ((spec.provider.zones[0],) if spec.provider.zones else ("us-central1-c",))


def worker_batches(spec: JobSpec, catalog: Catalog | None = None) -> list[int]:
    """Per-worker batch: the group's, the spec's per-worker batch, or the global batch split by speed."""
    cluster = spec.pinned
    training = spec.training
    gpus = [g.gpu for g in cluster.workers for _ in range(g.count)]
    explicit = [g.batch for g in cluster.workers for _ in range(g.count)]
    if training.global_batch is None:
        per = training.batch_per_worker or DEFAULT_BATCH
        return [b or per for b in explicit]
    if spec.mode == TrainingMode.SYNC:
        from orchestrator.costmodel import split_batch  # the planner's split: fast GPUs get more

        if isinstance(spec.provider, LocalProvider):
            # Emulated GPUs step at measured speeds (orchestrator.emulation), not the cost model's: split
            # the global batch in proportion to those speeds.
            from orchestrator.emulation import REFERENCE_BATCH, emulated_step_s

            speeds = [1.0 / emulated_step_s(g, REFERENCE_BATCH, 1.0) for g in gpus]
            return proportional_split(training.global_batch, speeds)
        return list(split_batch(training.profile_name, gpus, training.global_batch))
    share, rest = divmod(training.global_batch, len(gpus))
    return [share + (1 if i < rest else 0) for i in range(len(gpus))]


def proportional_split(total: int, weights: list[float]) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights`` (largest remainder), each at least 1."""
    raw = [total * w / sum(weights) for w in weights]
    out = [max(1, int(r)) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True):
        if sum(out) >= total:
            break
        out[i] += 1
    while sum(out) > total:
        out[out.index(max(out))] -= 1
    return out


def expand(spec: JobSpec, catalog: Catalog | None = None, book: str | None = None) -> list[Slot]:
    """Every slot of a pinned cluster: parameter servers, the chief (async only), then the workers."""
    cat = catalog or load_catalog()
    prices = price_book_for(spec, cat, book)
    cluster = spec.pinned
    cloud = isinstance(spec.provider, GceProvider)
    disk = stopped_disk_usd_per_hour(spec, cat)

    def cpu_slot(role: Role, index: int, cfg: ParameterServers | Chief) -> Slot:
        machine = cfg.machine_type if cloud else "local"
        zones = _zones(spec, cfg.zone, None, cat)
        return Slot(role, index, None, machine, zones[0], cfg.spot,
                    prices.instance_price(machine, None, 0, cfg.spot) + disk,
                    on_demand_price_per_hour=prices.instance_price(machine, None, 0, False) + disk, zones=zones)

    slots = [cpu_slot(Role.PS, i, cluster.parameter_servers) for i in range(spec.ps_count)]
    if spec.mode == TrainingMode.ASYNC:
        chief = cpu_slot(Role.CHIEF, 0, cluster.chief)
        if cluster.chief.on_worker0:  # the study's setup: on worker 0's VM, billed there
            chief = replace(chief, spot=False, price_per_hour=0.0, on_demand_price_per_hour=0.0)
        slots.append(chief)
    batches = worker_batches(spec, cat)
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
                )
            )
            index += 1
    return slots


BOOT_DISK_GB = 50  # GceProvider's default boot disk (pd-balanced)


def stopped_disk_usd_per_hour(spec: JobSpec, catalog: Catalog) -> float:
    """With termination_action STOP a preempted VM keeps its boot disk (billed until deleted): the
    ledger bills every gce instance its disk on top. DELETE (the default) leaves no disk behind."""
    provider = spec.provider
    if not isinstance(provider, GceProvider) or provider.termination_action != "STOP":
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
