"""Weighing how a synchronous job uses a cluster: data parallel, a pipeline of layer stages, or a hybrid.

- ``data``: every worker holds the whole model and the global batch is split (``evaluate.py``); it does not
  fit when a worker's memory cannot hold the weights, gradients, optimizer state and its batch's activations.
- ``pipeline``: one stage per GPU, contiguous layers sized to each GPU's speed and memory (``partition.py``,
  mini-max over every GPU order).
- ``hybrid``: one stage per GPU type, each stage data parallel over its equal GPUs (only where some type has
  two or more GPUs).

``training.parallelism`` picks one (``data`` / ``pipeline``: the better of pipeline and hybrid) or lets the
planner choose (``auto``: the fastest that fits; on one cluster the hourly price is the same, so the fastest is
also the cheapest).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.catalog import Catalog
from orchestrator.core.costmodel.partition import Partition, Partitioner, StageDevice

DATA, PIPELINE, HYBRID = "data", "pipeline", "hybrid"


@dataclass(frozen=True)
class Strategy:
    name: str  # data | pipeline | hybrid
    step_s: float
    memory_gb_per_gpu: float  # the most any one GPU needs
    usd: float  # the run at this strategy's pace and the cluster's hourly price
    fits: bool
    detail: str = ""
    partition: Partition | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "step_s": _num(self.step_s),
                               "memory_gb_per_gpu": round(self.memory_gb_per_gpu, 3), "usd": _num(self.usd),
                               "fits": self.fits, "detail": self.detail}
        if self.partition is not None:
            p = self.partition
            out["stages"] = [{"gpu": d.gpu, "width": d.width, "layers": [i, j], "stage_s": s, "comm_s": c,
                              "memory_gb": m}
                             for d, (i, j), s, c, m in zip(p.devices, p.layer_ranges(), p.stage_s, p.comm_s,
                                                            p.memory_gb, strict=True)]
            out["micro_batch"], out["micro_batches"] = p.micro_batch, p.micro_batches
        return out


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def pipeline_strategies(partitioner: Partitioner, catalog: Catalog, gpus: Sequence[str],
                        machines: Sequence[str], global_batch: int) -> list[tuple[str, Partition | None]]:
    """The best pipeline (a stage per GPU) and, where a GPU type repeats, the best hybrid (a stage per type)."""
    egress = [catalog.machine_type(m).egress_gbps if m in catalog.machine_types else 16.0 for m in machines]
    devices = [StageDevice(g, m, 1, e) for g, m, e in zip(gpus, machines, egress, strict=True)]
    out: list[tuple[str, Partition | None]] = [(PIPELINE, partitioner.best(devices, global_batch))]
    counts = Counter(gpus)
    if len(counts) < len(gpus) and len(counts) > 1:
        groups = [StageDevice(g, next(d.machine_type for d in devices if d.gpu == g), n,
                              min(d.egress_gbps for d in devices if d.gpu == g)) for g, n in counts.items()]
        out.append((HYBRID, partitioner.best(groups, global_batch)))
    return out


def choose(parallelism: str, strategies: Sequence[Strategy]) -> Strategy:
    """The strategy to run: the one asked for (pipeline: the faster of pipeline and hybrid), or the fastest that
    fits; when nothing fits, the asked-for (or data) one, whose reason the candidate carries."""
    def rank(s: Strategy) -> tuple[bool, float]:
        return (not s.fits, s.step_s)

    allowed = [s for s in strategies if parallelism == "auto" or s.name == parallelism
               or (parallelism == PIPELINE and s.name == HYBRID)]
    return min(allowed or list(strategies), key=rank)


def why_not(chosen: Strategy, other: Strategy) -> str:
    """One line: why the runner-up strategy was not chosen."""
    if not other.fits:
        return f"{other.name}: does not fit ({other.detail})"
    ratio = other.step_s / chosen.step_s if chosen.step_s > 0 else math.inf
    return f"{other.name}: {other.step_s:.3g} s a step, {ratio:.2f}x the {chosen.name} step"
