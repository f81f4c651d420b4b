"""Batch split: integer per-worker batches that sum to the global batch and minimise the slowest worker.

Each worker ``i`` has a step time ``t_i(b)`` that is strictly increasing in its batch ``b`` and a
memory cap ``c_i``. The optimum ``T* = min max_i t_i(b_i)`` over ``sum b_i = B, 1 <= b_i <= c_i`` is one
of the values ``t_i(b)``: for a time ``T`` each worker can take at most ``m_i(T) = #{b <= c_i : t_i(b) <= T}``
examples, and ``T`` is feasible iff ``sum_i m_i(T) >= B``. We tabulate ``t_i`` over ``1..c_i`` (one table
per GPU type), binary-search the smallest feasible table value, take ``b_i = m_i(T*)`` and hand the
surplus back from the workers whose step is slowest. Exact (tests compare with brute force).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from orchestrator.costmodel.compute import DEFAULT_RUNTIME, Calibration, FloatArray
from orchestrator.costmodel.memory import max_batch
from orchestrator.costmodel.stepmodel import step_fn
from orchestrator.model.catalog import load_catalog


class SplitError(ValueError):
    """No split exists: the global batch is below one per worker or above what memory allows."""


def min_max_split(tables: Sequence[FloatArray], total: int) -> list[int]:
    """``tables[i][k]`` is worker i's step time at batch k + 1 (strictly increasing; its length is the cap).

    Workers that share a table object (same GPU type) are handled together, so pass the same array for
    identical workers.
    """
    n = len(tables)
    if n == 0:
        raise SplitError("no workers")
    if total < n:
        raise SplitError(f"global batch {total} is smaller than the {n} workers; give each at least 1")
    caps = [len(t) for t in tables]
    if min(caps) < 1:
        raise SplitError("a worker cannot fit even a batch of 1 in its GPU memory")
    if sum(caps) < total:
        raise SplitError(
            f"global batch {total} does not fit the workers' memory (at most {sum(caps)} in total)"
        )

    # Group identical tables: the feasibility count is sum over groups of multiplicity * m(T).
    groups: dict[int, tuple[FloatArray, int]] = {}
    for t in tables:
        arr, k = groups.get(id(t), (t, 0))
        groups[id(t)] = (arr, k + 1)
    uniq = list(groups.values())

    def capacity(limit: float) -> int:
        return sum(k * int(np.searchsorted(arr, limit, side="right")) for arr, k in uniq)

    floor = max(float(arr[0]) for arr, _ in uniq)  # every worker takes at least one example
    values = np.unique(np.concatenate([arr[arr >= floor] for arr, _ in uniq]))
    lo, hi = 0, len(values) - 1  # values[hi] is feasible (every worker at its cap)
    while lo < hi:
        mid = (lo + hi) // 2
        if capacity(float(values[mid])) >= total:
            hi = mid
        else:
            lo = mid + 1
    limit = float(values[lo])
    batches = [int(np.searchsorted(t, limit, side="right")) for t in tables]
    surplus = sum(batches) - total
    # Hand the surplus back from the slowest workers first (ties: the highest index), keeping b_i >= 1.
    heap = [(-float(t[b - 1]), -i) for i, (t, b) in enumerate(zip(tables, batches, strict=True))]
    heapq.heapify(heap)
    while surplus > 0:
        _, neg_i = heapq.heappop(heap)
        i = -neg_i
        if batches[i] <= 1:
            continue
        batches[i] -= 1
        surplus -= 1
        heapq.heappush(heap, (-float(tables[i][batches[i] - 1]), -i))
    return batches


def max_step_time(tables: Sequence[FloatArray], batches: Sequence[int]) -> float:
    return max(float(t[b - 1]) for t, b in zip(tables, batches, strict=True))


def split_batch(
    model: str, gpus: list[str], global_batch: int, calibration: Calibration | None = None,
    runtime: str = DEFAULT_RUNTIME, precision: str = "fp32",
) -> list[int]:
    """Integer per-worker batches summing to ``global_batch`` that minimise the slowest worker's step time
    within each GPU's memory cap. Raises :class:`SplitError` if no split exists."""
    cat = load_catalog()
    n = len(gpus)
    longest = max(1, global_batch - n + 1)
    tables = {}
    for g in dict.fromkeys(gpus):
        cap = max_batch(model, g, cat)
        tables[g] = step_fn(model, g, calibration, cat, runtime, precision).table(max(0, min(cap, longest)))
    return min_max_split([tables[g] for g in gpus], global_batch)
