"""Communication model: parameter servers (async) and ring all-reduce (sync).

Parameter servers. Every variable lives on one PS. Per worker step a worker pulls every variable and
pushes a gradient (or, for batch-norm statistics, an update) for each: ``2 x bytes`` through each PS's
NIC for the variables it holds, plus one request per variable and direction. PS ``j`` therefore spends

    s_j = 2 * bytes_j / (net_efficiency / (1 + incast * (workers - 1)) * egress_j)
          + 2 * n_vars_j * ps_cpu_per_variable_s

seconds per worker step, and the cluster can do at most ``min_j 1 / s_j`` steps/s however many
workers it has (the busiest PS is the bottleneck). Variables are assigned to PS either greedily
(largest first to the least-loaded PS: balanced) or round-robin in creation order (TensorFlow's
default placement, which can leave one PS with most of the bytes).

A worker's own step, unloaded, is its compute time plus its transfer time (its share over its own
NIC or the busiest PS's NIC, whichever is slower; transfers are assumed not to overlap compute) plus
two request latencies. Asynchronous cluster throughput is then

    R = min( sum_i 1 / (compute_i + comm_i),  PS capacity ).

Synchronous training (all-reduce): each step waits for the slowest worker, then a ring all-reduce of
the gradients moves ``2 (n-1)/n x bytes`` over the slowest worker NIC with ``2 (n-1)`` latencies:

    step = max_i compute_i + 2 (n-1)/n * bytes / (net_efficiency * min_i egress_i) + 2 (n-1) * latency.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.costmodel.compute import NetParams
from orchestrator.costmodel.profiles import get_profile
from orchestrator.model.catalog import Catalog, load_catalog

GBIT = 1e9 / 8  # bytes per second in one Gb/s


class Sharding(StrEnum):
    GREEDY = "greedy"
    ROUND_ROBIN = "round_robin"


@dataclass(frozen=True)
class ShardPlan:
    """Which PS holds which variable, and the resulting per-PS load."""

    assignment: tuple[int, ...]  # PS index of each variable, in profile order
    bytes_per_ps: tuple[int, ...]
    vars_per_ps: tuple[int, ...]

    @property
    def imbalance(self) -> float:
        """Busiest PS bytes / mean PS bytes (1.0 = perfectly balanced)."""
        mean = sum(self.bytes_per_ps) / len(self.bytes_per_ps)
        return max(self.bytes_per_ps) / mean if mean > 0 else 1.0


def shard_sizes(sizes: Sequence[int], ps_count: int, strategy: Sharding | str = Sharding.GREEDY) -> ShardPlan:
    """Assign variables of these byte sizes to ``ps_count`` parameter servers."""
    if ps_count < 1:
        raise ValueError("ps_count must be >= 1")
    strategy = Sharding(strategy)
    load = [0] * ps_count
    count = [0] * ps_count
    assignment = [0] * len(sizes)
    if strategy is Sharding.ROUND_ROBIN:
        order: Sequence[int] = range(len(sizes))
    else:
        order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    for k, i in enumerate(order):
        j = k % ps_count if strategy is Sharding.ROUND_ROBIN else min(range(ps_count), key=lambda p: (load[p], p))
        assignment[i] = j
        load[j] += sizes[i]
        count[j] += 1
    return ShardPlan(tuple(assignment), tuple(load), tuple(count))


@functools.cache
def shard_model(model: str, ps_count: int, strategy: Sharding | str = Sharding.GREEDY) -> ShardPlan:
    return shard_sizes([v.nbytes for v in get_profile(model).variables], ps_count, strategy)


def _egress_bytes_per_s(machine_type: str, catalog: Catalog) -> float:
    return catalog.machine_type(machine_type).egress_gbps * GBIT


def ps_service_times(
    model: str,
    ps_count: int,
    ps_machine_type: str,
    workers: int,
    net: NetParams | None = None,
    strategy: Sharding | str = Sharding.GREEDY,
    catalog: Catalog | None = None,
) -> tuple[float, ...]:
    """Seconds of PS ``j`` busy time per worker step, for each PS."""
    net = net or NetParams()
    cat = catalog or load_catalog()
    shards = shard_model(model, ps_count, strategy)
    eff = net.net_efficiency / (1.0 + net.incast_penalty * max(workers - 1, 0))
    bw = eff * _egress_bytes_per_s(ps_machine_type, cat)
    return tuple(
        2 * b / bw + 2 * n * net.ps_cpu_per_variable_s
        for b, n in zip(shards.bytes_per_ps, shards.vars_per_ps, strict=True)
    )


def ps_capacity(
    model: str,
    ps_count: int,
    ps_machine_type: str,
    workers: int,
    net: NetParams | None = None,
    strategy: Sharding | str = Sharding.GREEDY,
    catalog: Catalog | None = None,
) -> float:
    """Most worker steps per second the parameter servers can serve (the busiest PS decides)."""
    times = ps_service_times(model, ps_count, ps_machine_type, workers, net, strategy, catalog)
    busiest = max(times)
    return float("inf") if busiest <= 0 else 1.0 / busiest


def worker_ps_comm_time(
    model: str,
    worker_machine_type: str,
    ps_count: int,
    ps_machine_type: str,
    net: NetParams | None = None,
    strategy: Sharding | str = Sharding.GREEDY,
    catalog: Catalog | None = None,
) -> float:
    """Seconds a worker spends pushing and pulling per step when the PS are not saturated."""
    net = net or NetParams()
    cat = catalog or load_catalog()
    prof = get_profile(model)
    shards = shard_model(model, ps_count, strategy)
    own = 2 * prof.param_bytes / (net.net_efficiency * _egress_bytes_per_s(worker_machine_type, cat))
    busiest_ps = (
        2 * max(shards.bytes_per_ps) / (net.net_efficiency * _egress_bytes_per_s(ps_machine_type, cat))
    )
    return max(own, busiest_ps) + 2 * net.request_latency_s


def allreduce_time(
    model: str,
    worker_machine_types: Sequence[str],
    net: NetParams | None = None,
    catalog: Catalog | None = None,
    worker_zones: Sequence[str | None] | None = None,
) -> float:
    """Ring all-reduce of every trainable variable's gradient across the workers."""
    n = len(worker_machine_types)
    if n <= 1:
        return 0.0
    net = net or NetParams()
    cat = catalog or load_catalog()
    slowest = min(_egress_bytes_per_s(m, cat) for m in worker_machine_types)
    data = get_profile(model).trainable_bytes
    zones = list(worker_zones or [])
    hop = max((zone_rtt_s(x, y, net) for x in zones for y in zones), default=0.0)  # the ring's slowest hop
    return 2 * (n - 1) / n * data / (net.net_efficiency * slowest) + 2 * (n - 1) * (
        net.request_latency_s + hop
    )


def zone_rtt_s(a: str | None, b: str | None, net: NetParams | None = None) -> float:
    """Extra round-trip time between two zones (0 within a zone or when either is unknown / local)."""
    if a is None or b is None or a == b or "local" in (a, b):
        return 0.0
    net = net or NetParams()
    region_a, region_b = a.rsplit("-", 1)[0], b.rsplit("-", 1)[0]
    if region_a == region_b:
        return net.cross_zone_rtt_s
    if region_a.split("-", 1)[0] == region_b.split("-", 1)[0]:  # us-*, europe-*, asia-*
        return net.cross_region_rtt_s
    return net.cross_continent_rtt_s


def async_throughput(worker_rates: Sequence[float], capacity: float) -> float:
    """Cluster steps/s: the workers' own rates, capped by what the parameter servers can serve."""
    return min(sum(worker_rates), capacity)


def async_shares(worker_rates: Sequence[float]) -> list[float]:
    """Each worker's expected share of the global steps (PS saturation slows every worker alike)."""
    total = sum(worker_rates)
    return [r / total for r in worker_rates] if total > 0 else [0.0 for _ in worker_rates]
