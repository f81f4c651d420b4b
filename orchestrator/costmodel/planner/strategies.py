"""Weighing how a synchronous job uses a cluster: data parallel, a pipeline of layer stages, or a hybrid.

- ``data``: every worker holds the whole model and the global batch is split (``evaluate.py``); it does not
  fit when a worker's memory cannot hold the weights, gradients, optimizer state and its batch's activations.
- ``pipeline``: one stage per GPU, contiguous layers sized to each GPU's speed and memory (``partition.py``,
  mini-max over every GPU order).
- ``hybrid``: one stage per GPU type, each stage data parallel over its equal GPUs (only where some type has
  two or more GPUs).

``training.parallelism`` picks one (``data`` / ``pipeline``: the better of pipeline and hybrid) or lets the
planner choose (``auto``: the fastest that fits, by its expected time under revocations where the workers are spot;
on one cluster the hourly price is the same, so the fastest is also the cheapest).

Revocations weigh the strategies differently (``Revocations``, the simulator's model in ``sim.engine``): a data
parallel world pauses while it re-forms and its survivors train on while the replacement boots, but a pipeline
needs every stage, so a lost stage stops it until the replacement is up and every stage has restored; its idle
survivors are billed all the while. A pipeline faster without revocations can so lose to data parallel on spot VMs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.costmodel.partition import Partition, Partitioner, StageDevice
from orchestrator.model.catalog import Catalog

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
    expected_s: float = math.nan  # the whole run under revocations (nan: not weighed, e.g. a local run)
    expected_usd: float = math.nan

    @property
    def pace_s(self) -> float:
        """What ``auto`` ranks by: the expected run under revocations where known, else the step."""
        return self.step_s if math.isnan(self.expected_s) else self.expected_s

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "step_s": _num(self.step_s),
                               "memory_gb_per_gpu": round(self.memory_gb_per_gpu, 3), "usd": _num(self.usd),
                               "fits": self.fits, "detail": self.detail,
                               "expected_hours": _num(self.expected_s / 3600.0),
                               "expected_usd": _num(self.expected_usd)}
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


@dataclass(frozen=True)
class Revocations:
    """What revocations cost a synchronous job's run, per strategy, as the simulator plays them (``sim.engine``
    with ``stage_loss: wait``, what the pipeline job does): each spot GPU-worker is revoked at its constant hazard
    (``risk.py``); a replacement takes ``replacement_s`` (boot and start-up) and every rank restores in
    ``restore_s`` when the world re-forms; the revoked VM's notice is ``notice_s``."""

    hazards: tuple[float, ...]  # per GPU-worker, per second (0: on-demand)
    replacement_s: float
    restore_s: float
    notice_s: float

    def loss_s(self, name: str, share: float) -> float:
        """Seconds of full-pace progress one revocation of a worker holding ``share`` of the batch costs."""
        if name == DATA:  # pause to shrink; the survivors train while the replacement boots; pause to grow
            booting = max(0.0, self.replacement_s - self.notice_s - self.restore_s)
            return self.notice_s + 2 * self.restore_s + booting * share
        return self.replacement_s + self.restore_s  # no step until the stage is back and every stage restored

    def expected_s(self, name: str, base_s: float, shares: Sequence[float]) -> float:
        """``T = T0 / (1 - L)``, with ``L`` the progress lost per second (as the planner's analytic scorer)."""
        lost = sum(h * self.loss_s(name, s) for h, s in zip(self.hazards, shares, strict=True))
        return base_s / (1.0 - lost) if lost < 1.0 and math.isfinite(base_s) else math.inf


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
    fits (by the expected run under revocations, where weighed); when nothing fits, the asked-for (or data) one,
    whose reason the candidate carries."""
    def rank(s: Strategy) -> tuple[bool, float, float]:
        return (not s.fits, s.pace_s, s.step_s)

    allowed = [s for s in strategies if parallelism == "auto" or s.name == parallelism
               or (parallelism == PIPELINE and s.name == HYBRID)]
    return min(allowed or list(strategies), key=rank)


def why_not(chosen: Strategy, other: Strategy) -> str:
    """One line: why the runner-up strategy was not chosen."""
    if not other.fits:
        return f"{other.name}: does not fit ({other.detail})"
    ratio = other.step_s / chosen.step_s if chosen.step_s > 0 else math.inf
    line = f"{other.name}: {other.step_s:.3g} s a step, {ratio:.2f}x the {chosen.name} step"
    if math.isfinite(other.expected_s) and math.isfinite(chosen.expected_s):
        line += (f"; under revocations {other.expected_s / 3600:.3g} h, ${other.expected_usd:,.2f} against "
                 f"{chosen.expected_s / 3600:.3g} h, ${chosen.expected_usd:,.2f}")
    return line
