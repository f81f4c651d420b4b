"""Cluster throughput: the workers' compute (compute.py) combined with their communication (comm.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.costmodel.comm import (
    Sharding,
    allreduce_time,
    async_shares,
    ps_capacity,
    worker_ps_comm_time,
    zone_rtt_s,
)
from orchestrator.costmodel.compute import DEFAULT_CALIBRATION, Calibration
from orchestrator.costmodel.stepmodel import step_fn
from orchestrator.model.catalog import Catalog, load_catalog


def _mode(mode: str) -> str:
    m = str(mode).lower()
    if m not in ("async", "sync"):
        raise ValueError(f"mode must be 'async' or 'sync', got {mode!r}")
    return m


@dataclass(frozen=True)
class ClusterEstimate:
    mode: str
    compute_s: tuple[float, ...]  # per worker, compute only
    comm_s: tuple[float, ...]  # per worker: PS push/pull (async) or the all-reduce (sync)
    worker_steps_per_s: tuple[float, ...]  # per worker, as it would run unhindered by the PS (async)
    steps_per_s: float  # global steps per second
    ps_capacity: float  # steps/s the PS can serve (inf in sync mode)
    shares: tuple[float, ...]  # each worker's share of the global steps

    @property
    def ps_load(self) -> float:
        """Demand / PS capacity; above 1 the parameter servers are the bottleneck (0 in sync mode)."""
        if self.mode != "async" or self.ps_capacity == float("inf"):
            return 0.0
        return sum(self.worker_steps_per_s) / self.ps_capacity

    @property
    def bottleneck(self) -> str:
        if self.mode == "sync":
            slowest = max(self.compute_s)
            return "all-reduce" if self.comm_s and self.comm_s[0] > slowest else "slowest worker"
        return "parameter servers" if self.ps_load >= 1.0 else "workers"

    def without_worker(self, i: int) -> float:
        """Global steps/s while worker ``i`` is missing (being replaced)."""
        if self.mode == "sync":
            return 0.0  # a synchronous step needs every worker
        rest = sum(self.worker_steps_per_s) - self.worker_steps_per_s[i]
        return min(rest, self.ps_capacity)


def estimate_from_compute(
    model: str,
    compute_s: Sequence[float],
    worker_machine_types: Sequence[str],
    ps_count: int,
    ps_machine_type: str,
    mode: str,
    calibration: Calibration,
    catalog: Catalog,
    strategy: Sharding | str = Sharding.GREEDY,
    worker_zones: Sequence[str | None] | None = None,
    ps_zone: str | None = None,
) -> ClusterEstimate:
    """``worker_zones`` / ``ps_zone`` add the round trips between zones, regions and continents."""
    m = _mode(mode)
    n = len(compute_s)
    if n == 0:
        raise ValueError("a cluster needs at least one worker")
    if m == "sync":
        ar = allreduce_time(model, worker_machine_types, calibration.net, catalog, worker_zones)
        step = max(compute_s) + ar
        rate = 1.0 / step
        return ClusterEstimate(
            m,
            tuple(compute_s),
            tuple(ar for _ in compute_s),
            tuple(rate for _ in compute_s),
            rate,
            float("inf"),
            tuple(1.0 / n for _ in compute_s),
        )
    if ps_count < 1:
        raise ValueError("asynchronous training needs at least one parameter server")
    comm_cache: dict[str, float] = {}
    comm = []
    for wm in worker_machine_types:
        if wm not in comm_cache:
            comm_cache[wm] = worker_ps_comm_time(
                model, wm, ps_count, ps_machine_type, calibration.net, strategy, catalog
            )
        comm.append(comm_cache[wm])
    if worker_zones is not None:
        net = calibration.net
        comm = [x + 2 * zone_rtt_s(z, ps_zone, net) for x, z in zip(comm, worker_zones, strict=True)]
    rates = tuple(1.0 / (c + x) for c, x in zip(compute_s, comm, strict=True))
    cap = ps_capacity(model, ps_count, ps_machine_type, n, calibration.net, strategy, catalog)
    return ClusterEstimate(
        m, tuple(compute_s), tuple(comm), rates, min(sum(rates), cap), cap, tuple(async_shares(rates))
    )


def estimate_cluster(
    model: str,
    gpus: Sequence[str],
    batches: Sequence[int],
    ps_count: int,
    ps_machine_type: str,
    mode: str,
    calibration: Calibration | None = None,
    catalog: Catalog | None = None,
    worker_machine_types: Sequence[str] | None = None,
    strategy: Sharding | str = Sharding.GREEDY,
) -> ClusterEstimate:
    """Throughput of workers with these GPUs and per-worker batches (hosts: the GPUs' default machines)."""
    cat = catalog or load_catalog()
    calib = calibration or DEFAULT_CALIBRATION
    if len(gpus) != len(batches):
        raise ValueError(f"{len(gpus)} GPUs but {len(batches)} batches; give one batch per worker")
    fns = {g: step_fn(model, g, calib, cat) for g in set(gpus)}
    compute_s = [fns[g].at(float(b)) for g, b in zip(gpus, batches, strict=True)]
    machines = (
        list(worker_machine_types)
        if worker_machine_types
        else [cat.gpu(g).default_machine_type for g in gpus]
    )
    return estimate_from_compute(
        model, compute_s, machines, ps_count, ps_machine_type, mode, calib, cat, strategy
    )


def cluster_rate(
    model: str,
    gpus: Sequence[str],
    batches: Sequence[int],
    ps_count: int,
    ps_machine_type: str,
    mode: str,
    calibration: Calibration | None = None,
    catalog: Catalog | None = None,
) -> float:
    return estimate_cluster(
        model, gpus, batches, ps_count, ps_machine_type, mode, calibration, catalog
    ).steps_per_s
