"""Pipeline partitioning across unequal GPUs: contiguous stages of a model's layers, sized to each GPU.

A pipeline runs ``micro`` micro-batches through ``S`` stages; with 1F1B (or GPipe) scheduling a step takes

    (micro + S - 1) x max_k (stage_k + comm_k)

where ``stage_k`` is stage k's forward + backward time for one micro-batch on its GPU (the cost model's per-layer
times, ``compute.StepTimeFn``) and ``comm_k`` sends the activation at its cut forward and its gradient back over
the slower of the two VMs' links. The slowest stage sets the pace (the mini-max rule of the heterogeneous-GPU
performance model this project grew from), so the partitioner minimises the largest ``stage_k + comm_k`` over
contiguous cuts, exactly, by dynamic programming, for each order of the GPUs along the pipeline, subject to
each stage's memory: its parameters with their gradients and optimizer state, plus the activations of the
micro-batches in flight (1F1B: stage k holds ``min(micro, S - k)``).

Cuts fall between *units* (a residual block, a transformer block, the stem), where one tensor crosses: the
unit is the layer name's prefix before its first ``_`` (``s1b0_conv1`` -> ``s1b0``, ``h7_attn_query`` -> ``h7``), or
for a profiled PyTorch model the block of a numbered container (``layer1.0.conv1`` -> ``layer1.0``).

A *hybrid* stage is a group of equal GPUs that runs its layers data parallel: each replica takes
``micro / width`` of the micro-batch, and the stage all-reduces its gradients once a step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.costmodel.compute import DEFAULT_RUNTIME, SMOOTH_MAX_P, Calibration, StepTimeFn, layer_arrays
from orchestrator.costmodel.memory import DEFAULT_MEMORY, MemoryParams, usable_bytes
from orchestrator.costmodel.profiles import ModelProfile, get_profile
from orchestrator.costmodel.stepmodel import step_fn
from orchestrator.model.catalog import Catalog, load_catalog

GBIT = 1e9 / 8
MAX_ORDERS = 720  # GPU orders tried exhaustively; beyond, fast-first and slow-first only
NET_EFFICIENCY = 0.7  # share of a VM's egress one point-to-point activation transfer gets
LINK_LATENCY_S = 100e-6


@dataclass(frozen=True)
class StageDevice:
    """One pipeline stage's GPUs: ``width`` equal GPUs of type ``gpu`` (1: a plain stage)."""

    gpu: str
    machine_type: str
    width: int = 1
    egress_gbps: float = 16.0


@dataclass(frozen=True)
class Partition:
    """A pipeline plan: the devices in stage order, where each stage begins, and its predicted figures."""

    devices: tuple[StageDevice, ...]
    starts: tuple[int, ...]  # first layer index of each stage (profile order); starts[0] == 0
    layers: int
    micro_batch: int
    micro_batches: int
    stage_s: tuple[float, ...]  # forward + backward of one micro-batch
    comm_s: tuple[float, ...]  # activation + gradient transfer after each stage (0 for the last)
    allreduce_s: tuple[float, ...]  # per step, hybrid stages only
    memory_gb: tuple[float, ...]  # per GPU of each stage
    fits: bool

    @property
    def stages(self) -> int:
        return len(self.devices)

    @property
    def bottleneck_s(self) -> float:
        return max(s + c for s, c in zip(self.stage_s, self.comm_s, strict=True))

    @property
    def step_s(self) -> float:
        """Predicted seconds per training step (1F1B): one pass through every stage (the fill and drain, each stage
        at its own pace) plus the other micro-batches at the slowest pace. Equal stages give the textbook
        ``(micro-batches + stages - 1) x stage``; unequal ones fill faster than the bottleneck."""
        through = sum(s + c for s, c in zip(self.stage_s, self.comm_s, strict=True))
        return (self.micro_batches - 1) * self.bottleneck_s + through + max(self.allreduce_s, default=0.0)

    def layer_ranges(self) -> list[tuple[int, int]]:
        ends = [*self.starts[1:], self.layers]
        return list(zip(self.starts, ends, strict=True))


def units(profile: ModelProfile) -> list[int]:
    """Layer indices where a new unit begins (the allowed cuts), 0 first. The loss (``softmax_xent``) stays with
    the layer before it: no stage holds a loss alone."""
    layers = profile.layers
    names = [_unit(layer.name) for layer in layers]
    return [i for i, n in enumerate(names)
            if i == 0 or (n != names[i - 1] and layers[i].name != "softmax_xent")]


def _unit(name: str) -> str:
    """The unit a layer belongs to: ``s1b0_conv1`` -> ``s1b0``; a PyTorch module path ``layer1.0.conv1`` ->
    ``layer1.0`` (a block of a numbered container), ``fc`` -> ``fc``."""
    parts = name.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0].split("_", 1)[0]


@dataclass(frozen=True)
class _Costs:
    """Prefix sums over layers, per device: the O(1) cost of any contiguous stage."""

    gpu_s: np.ndarray  # cumulative GPU seconds at the device's per-replica micro-batch
    kernel_share: np.ndarray  # cumulative share of the step's host (kernel launch) time
    host_s: float
    overlap: float
    param_bytes: np.ndarray  # cumulative parameter bytes
    act_bytes: np.ndarray  # cumulative saved activation bytes per example
    out_bytes: np.ndarray  # each layer's output bytes per example (what crosses a cut after it)

    def stage(self, i: np.ndarray | int, j: int) -> np.ndarray:
        gpu = self.gpu_s[j] - self.gpu_s[i]
        host = self.host_s * (self.kernel_share[j] - self.kernel_share[i])
        p = self.overlap
        return np.asarray((np.power(host, p) + np.power(gpu, p)) ** (1 / p))


def _costs(model: str, fn: StepTimeFn, micro: float, given: np.ndarray | None = None) -> _Costs:
    prof = get_profile(model)
    arrays = layer_arrays(model)
    slope = np.maximum(fn.c, fn.m)
    per_layer = slope * (micro + fn.h) + fn.w if given is None else given
    kernels = arrays.kernels / max(float(arrays.kernels.sum()), 1.0)

    def cum(x: Sequence[float] | np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(np.asarray(x, dtype=np.float64))])

    return _Costs(cum(per_layer), cum(kernels), fn.host_s if given is None else 0.0, fn.overlap,
                  cum([sum(v.nbytes for v in layer.variables) for layer in prof.layers]),
                  cum([layer.saved_bytes for layer in prof.layers]),
                  np.array([layer.write_bytes for layer in prof.layers], dtype=np.float64))


class Partitioner:
    """Mini-max contiguous partitions of one model over given GPUs (cached per GPU type and micro-batch)."""

    def __init__(self, model: str, calibration: Calibration | None = None, catalog: Catalog | None = None,
                 memory: MemoryParams = DEFAULT_MEMORY,
                 layer_s: Callable[[str, float], np.ndarray] | None = None, runtime: str = DEFAULT_RUNTIME,
                 precision: str = "fp32") -> None:
        """``layer_s(gpu, micro_batch)``: each layer's forward + backward seconds from another source than the
        cost model (the local provider's emulated GPUs: ``local_layer_s``)."""
        self.model = model
        self.layer_s = layer_s
        self.runtime, self.precision = runtime, precision
        self.calibration = calibration
        self.catalog = catalog or load_catalog()
        self.memory = memory
        self.profile = get_profile(model)
        self.cuts = units(self.profile)
        self._costs: dict[tuple[str, float], _Costs] = {}

    def costs(self, gpu: str, micro: float) -> _Costs:
        key = (gpu, micro)
        if key not in self._costs:
            fn = step_fn(self.model, gpu, self.calibration, self.catalog, self.runtime, self.precision)
            self._costs[key] = _costs(self.model, fn, micro, None if self.layer_s is None else self.layer_s(gpu, micro))
        return self._costs[key]

    def best(self, devices: Sequence[StageDevice], global_batch: int, micro_batches: int | None = None,
             orders: bool = True) -> Partition | None:
        """The fastest feasible partition over every order of ``devices`` (None: no order fits in memory)."""
        stages = len(devices)
        micro_n = micro_batches or max(1, min(global_batch, 4 * stages))
        micro = max(1, global_batch // micro_n)
        found: Partition | None = None
        for order in (_orders(devices) if orders else [tuple(devices)]):
            p = self.solve(order, micro, micro_n)
            if p is not None and (found is None or p.step_s < found.step_s):
                found = p
        return found

    def equal_layers(self, devices: Sequence[StageDevice], global_batch: int, micro_batches: int | None = None
                     ) -> Partition:
        """The heterogeneity-blind baseline: as many units per stage as possible, in the given order."""
        stages = len(devices)
        micro_n = micro_batches or max(1, min(global_batch, 4 * stages))
        micro = max(1, global_batch // micro_n)
        n = len(self.cuts)
        starts = tuple(self.cuts[round(k * n / stages)] for k in range(stages))
        return self._describe(tuple(devices), starts, micro, micro_n)

    def solve(self, devices: tuple[StageDevice, ...], micro: int, micro_n: int) -> Partition | None:
        """Exact mini-max over contiguous unit-aligned cuts for one device order (dynamic programming)."""
        stages, cuts = len(devices), [*self.cuts, len(self.profile.layers)]
        n = len(cuts)
        if stages > n - 1:
            return None
        inf = math.inf
        best = np.full((stages, n), inf)  # best[k][j]: bottleneck of stages 0..k ending at cut j
        arg = np.zeros((stages, n), dtype=np.int64)
        bounds = np.array(cuts, dtype=np.int64)
        for k, dev in enumerate(devices):
            cap = usable_bytes(dev.gpu, self.catalog, self.memory)
            c = self.costs(dev.gpu, micro / dev.width)
            in_flight = min(micro_n, stages - k)
            last = k == stages - 1
            for jj in range(k + 1, n):
                if last and jj != n - 1:
                    continue
                j = int(bounds[jj])
                ii = np.arange(k, jj) if k > 0 else np.array([0])
                i = bounds[ii]
                mem = self._memory(c, i, j, in_flight, micro / dev.width)
                cost = c.stage(i, j) + (0.0 if last else self._comm(c, j, micro, dev, devices[k + 1]))
                prev = best[k - 1][ii] if k > 0 else np.zeros(1)
                val = np.where(mem <= cap, np.maximum(prev, cost), inf)
                m = int(np.argmin(val))
                best[k][jj], arg[k][jj] = val[m], ii[m]
        if not math.isfinite(best[stages - 1][n - 1]):
            return None
        starts, end = [], n - 1
        for k in range(stages - 1, -1, -1):
            begin = int(arg[k][end]) if k > 0 else 0
            starts.append(int(bounds[begin]))
            end = begin
        return self._describe(devices, tuple(reversed(starts)), micro, micro_n)

    def _memory(self, c: _Costs, i: np.ndarray | int, j: int, in_flight: int, micro: float) -> np.ndarray:
        params = c.param_bytes[j] - c.param_bytes[i]
        acts = self.memory.activation_fraction * (c.act_bytes[j] - c.act_bytes[i])
        fixed = params * (2 + self.memory.optimizer_slots) + self.memory.workspace_bytes
        return np.asarray(fixed + in_flight * micro * acts)

    def _comm(self, c: _Costs, j: int, micro: int, dev: StageDevice, nxt: StageDevice) -> float:
        link = NET_EFFICIENCY * min(dev.egress_gbps, nxt.egress_gbps) * GBIT
        return 2 * (micro * float(c.out_bytes[j - 1]) / link + LINK_LATENCY_S)

    def _describe(self, devices: tuple[StageDevice, ...], starts: tuple[int, ...], micro: int,
                  micro_n: int) -> Partition:
        layers = len(self.profile.layers)
        ends = [*starts[1:], layers]
        stage_s, comm_s, red, mem, fits = [], [], [], [], True
        for k, (dev, i, j) in enumerate(zip(devices, starts, ends, strict=True)):
            c = self.costs(dev.gpu, micro / dev.width)
            stage_s.append(float(c.stage(i, j)))
            comm_s.append(0.0 if k == len(devices) - 1 else self._comm(c, j, micro, dev, devices[k + 1]))
            grads = float(c.param_bytes[j] - c.param_bytes[i])
            link = NET_EFFICIENCY * dev.egress_gbps * GBIT
            red.append(2 * (dev.width - 1) / dev.width * grads / link if dev.width > 1 else 0.0)
            need = float(self._memory(c, i, j, min(micro_n, len(devices) - k), micro / dev.width))
            mem.append(need / 1e9)
            fits = fits and need <= usable_bytes(dev.gpu, self.catalog, self.memory)
        return Partition(devices, starts, layers, micro, micro_n, tuple(stage_s), tuple(comm_s), tuple(red),
                         tuple(mem), fits)


def flop_shares(model: str) -> np.ndarray:
    """Each layer's share of the model's forward FLOPs (a plain count, not the cost model's time)."""
    flops = layer_arrays(model).flops
    return np.asarray(flops / max(float(flops.sum()), 1.0))


def local_layer_s(model: str, emulated_s: Callable[[str, float], float], cpu_s: Callable[[float], float]
                  ) -> Callable[[str, float], np.ndarray]:
    """Per-layer seconds of a local-provider stage: the emulated GPU's step (measured curves, the local provider's
    step model's ``emulated_s``) and this host's CPU step (data/local_host.csv) at the micro-batch, each spread over
    the layers by FLOPs."""
    shares = flop_shares(model)

    def layer_s(gpu: str, micro: float) -> np.ndarray:
        return np.asarray(shares * (emulated_s(gpu, micro) + cpu_s(micro)))

    return layer_s


def _orders(devices: Sequence[StageDevice]) -> list[tuple[StageDevice, ...]]:
    """Distinct orders of the devices along the pipeline (equal devices are interchangeable)."""
    distinct = set(itertools.permutations(devices)) if math.factorial(len(devices)) <= MAX_ORDERS * 10 else set()
    if distinct and len(distinct) <= MAX_ORDERS:
        return sorted(distinct, key=lambda o: [d.gpu for d in o])
    by_name = sorted(devices, key=lambda d: d.gpu)
    return [tuple(by_name), tuple(reversed(by_name))]


__all__ = ["SMOOTH_MAX_P", "Partition", "Partitioner", "StageDevice", "flop_shares", "local_layer_s", "units"]
