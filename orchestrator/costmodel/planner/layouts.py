"""The clusters the planner evaluates: the pinned one, or every shape of ``spec.search``.

A shape is a worker set (one GPU type, or with ``search.mixed`` two or three types in every proportion),
a zone, spot or on-demand, a PS count, and how the workers are packed: one instance per GPU, or on gce
into each multi-GPU machine type whose fixed GPU count divides them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from orchestrator.model.blocks import BlockLike, blocked
from orchestrator.model.catalog import Catalog
from orchestrator.model.gce_rules import SPOT, STANDARD, load_gce_rules
from orchestrator.model.spec import LOCAL_ZONE, Chief, JobSpec, ParameterServers, TrainingMode


@dataclass(frozen=True)
class WorkerSlot:
    """One worker instance of a layout; ``None``: the GPU's default machine type, a batch to split."""

    gpu: str
    spot: bool
    zone: str | None
    machine_type: str | None
    batch: int | None
    flex_start: bool = False  # GCE Flex-start (DWS): not preempted, priced here at on-demand


@dataclass(frozen=True)
class Layout:
    """A cluster shape before evaluation."""

    workers: tuple[WorkerSlot, ...]
    ps_count: int
    ps_machine_type: str
    ps_spot: bool
    ps_zone: str | None
    chief_machine_type: str | None
    chief_spot: bool
    chief_zone: str | None
    pinned: bool = False


def _compositions(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """Ways to write n as an ordered sum of k positive integers."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(k))


def _worker_sets(gpus: Sequence[str], lo: int, hi: int, mixed: bool) -> list[tuple[str, ...]]:
    types = list(dict.fromkeys(gpus))
    out: list[tuple[str, ...]] = []
    for n in range(lo, hi + 1):
        out += [(g,) * n for g in types]
        if mixed:
            for k in (2, 3):
                for combo in itertools.combinations(types, k):
                    for parts in _compositions(n, k):
                        out.append(tuple(g for g, p in zip(combo, parts, strict=True) for _ in range(p)))
    return out


def _search_zones(spec: JobSpec, catalog: Catalog) -> list[str | None]:
    search = spec.search
    assert search is not None
    if search.zones:
        return list(search.zones)
    if spec.provider.is_cloud:
        if spec.provider.allowed_zones:
            return list(spec.provider.allowed_zones)
        zones: dict[str, None] = {}
        for g in search.gpus:
            zones.update(dict.fromkeys(catalog.zones_for(g)))
        return list(zones)
    return [None]


def _pinned_zone(spec: JobSpec, catalog: Catalog, zone: str | None, gpu: str | None,
                 blocks: Sequence[BlockLike] = ()) -> str | None:
    """Where the controller puts an instance the spec leaves unplaced: the first allowed zone offering it,
    one that no stockout or quota block rules out if there is such a zone."""
    if zone is not None or not spec.provider.is_cloud:
        return zone
    offered = catalog.zones_for(gpu) if gpu else catalog.all_zones()
    allowed = [z for z in spec.provider.allowed_zones if z in offered]
    return next((z for z in allowed if blocked(blocks, z, gpu) is None), allowed[0] if allowed else None)


def _offered(catalog: Catalog, gpus: set[str], zone: str | None) -> bool:
    return zone is None or zone == LOCAL_ZONE or all(zone in catalog.zones_for(g) for g in gpus)


def layouts(spec: JobSpec, catalog: Catalog, blocks: Sequence[BlockLike] = ()) -> Iterator[Layout]:
    """The pinned cluster, or every cluster ``spec.search`` allows, in a stable order; ``blocks`` (stockouts
    and quotas the cloud reported, still in force) steer placement away from where a create would fail."""
    if spec.cluster is not None:
        yield _pinned_layout(spec, catalog, blocks)
    else:
        yield from _searched_layouts(spec, catalog, blocks)


def blocked_in(blocks: Sequence[BlockLike], gpus: set[str], zone: str | None) -> str | None:
    """Why ``zone`` cannot take one of ``gpus`` now (a persisted block), or None."""
    if zone is None or not blocks:
        return None
    return next((why for g in sorted(gpus) if (why := blocked(blocks, zone, g)) is not None), None)


def _pinned_layout(spec: JobSpec, catalog: Catalog, blocks: Sequence[BlockLike]) -> Layout:
    cluster = spec.pinned
    slots = tuple(
        WorkerSlot(g.gpu, g.spot, _pinned_zone(spec, catalog, g.zone, g.gpu, blocks), g.machine_type, g.batch,
                   flex_start=g.provisioning == "flex_start")
        for g in cluster.workers
        for _ in range(g.count)
    )
    ps, ch = cluster.parameter_servers, cluster.chief
    is_async = spec.mode == TrainingMode.ASYNC
    return Layout(
        slots,
        spec.ps_count,
        ps.machine_type,
        ps.spot,
        _pinned_zone(spec, catalog, ps.zone, None),
        ch.machine_type if is_async and not ch.on_worker0 else None,
        ch.spot,
        _pinned_zone(spec, catalog, ch.zone, None),
        pinned=True,
    )


def _searched_layouts(spec: JobSpec, catalog: Catalog, blocks: Sequence[BlockLike]) -> Iterator[Layout]:
    search = spec.search
    assert search is not None
    is_async = spec.mode == TrainingMode.ASYNC
    ps_default, chief_default = ParameterServers(), Chief()
    ps_counts = range(1, search.max_ps + 1) if is_async else range(0, 1)
    chief_machine = chief_default.machine_type if is_async else None
    zones = _search_zones(spec, catalog)
    for worker_set in _worker_sets(search.gpus, search.min_workers, search.max_workers, search.mixed):
        types = set(worker_set)
        for zone in zones:
            if not _offered(catalog, types, zone) or blocked_in(blocks, types, zone) is not None:
                continue
            for slots in _shapes(spec, catalog, worker_set, zone, search.spot):
                for n_ps in ps_counts:
                    yield Layout(slots, n_ps, ps_default.machine_type, ps_default.spot, zone,
                                 chief_machine, chief_default.spot, zone)


def _shapes(
    spec: JobSpec, catalog: Catalog, worker_set: tuple[str, ...], zone: str | None, spots: Sequence[bool]
) -> Iterator[tuple[WorkerSlot, ...]]:
    """The workers as one instance per GPU (the GPU's default type) and, on gce, packed into each
    accelerator-optimized type whose fixed GPU count divides them (8 x H100 = 4 x a3-highgpu-2g)."""
    packings: list[tuple[str | None, int]] = [(None, 1)]
    if spec.provider.is_cloud and len(set(worker_set)) == 1:
        gpu = worker_set[0]
        default = catalog.gpu(gpu).default_machine_type
        packings += [(m.name, m.gpu_count) for m in catalog.machine_types_for(gpu)
                     if m.name != default and m.gpu_count > 1 and len(worker_set) % m.gpu_count == 0]
    rules = load_gce_rules() if spec.provider.as_gce() is not None else None
    for spot in spots:
        for machine, k in packings:
            # Never propose what GCE refuses (data/gce_rules.csv): e.g. an on-demand a3-highgpu-2g or H200.
            if rules is not None and not all(
                    rules.allows(machine or catalog.gpu(g).default_machine_type, SPOT if spot else STANDARD)
                    for g in set(worker_set)):
                continue
            yield tuple(WorkerSlot(g, spot, zone, machine, None) for g in worker_set[::k])

