"""Memory model: does a batch fit a GPU?

    need(b) = P * (1 weights + 1 gradients + k optimizer slots)
              + b * (activations per example + 2 x the largest activation)   (gradient buffers in backward)
    usable  = usable_fraction * memory_gb - framework_reserve

``P`` is the bytes of every variable (weights and batch-norm statistics); ``k`` = 1 for SGD with momentum
(the job's optimizer). Counting the optimizer slot on the worker is conservative in async PS mode, where
the slot lives on the parameter server. ASSUMPTIONS: 0.5 GiB framework reserve (CUDA context,
cuDNN/cuBLAS handles and workspaces) and 92% of the rest usable (allocator fragmentation).

The default counts every layer output as kept (conservative, for planning). What autograd really keeps
(``MemoryParams.needed_only``) is a layer's output where the backward pass needs it: a ReLU or softmax
needs its own output, a convolution, dense layer, batch norm, layer norm or pooling needs its input
(the previous layer's output); a residual add needs nothing, and a batch norm whose output only feeds
a ReLU or an add is dropped. In a CIFAR ResNet block that is 4 of the 7 outputs (both convolutions'
and both ReLUs'), so kept activations grow with depth at ~4/7 of the profile's total (the H100 grid:
ResNet-44/56/110 keep 3.44 / 4.35 / 8.48 MB an example, the needed set is 3.39 / 4.31 / 8.44).
:func:`fit_memory` fits the kept share of that set and the allocator-visible workspace (the part of
the reserve that ``torch.cuda.max_memory_allocated`` sees) to measured peaks.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.costmodel.profiles import ModelProfile
from orchestrator.model.catalog import Catalog, load_catalog

SAVES_OUTPUT = frozenset({"relu", "softmax"})  # backward needs the layer's own output
NEEDS_INPUT = frozenset({"conv", "dense", "matmul", "batchnorm", "layernorm", "avgpool", "maxpool", "embedding"})

GIB = 2**30


@dataclass(frozen=True)
class MemoryParams:
    framework_reserve_bytes: float = 0.5 * GIB
    usable_fraction: float = 0.92
    optimizer_slots: int = 1  # momentum
    activation_fraction: float = 1.0  # share of the counted activations a runtime really keeps
    workspace_bytes: float = 0.0  # batch-independent allocations beyond the variables (cuDNN workspaces)
    needed_only: bool = False  # count only the outputs backward needs (see the module docstring)


DEFAULT_MEMORY = MemoryParams()


@dataclass(frozen=True)
class MemoryNeed:
    fixed_bytes: float  # weights, gradients, optimizer state
    per_example_bytes: float

    def at(self, batch: int) -> float:
        return self.fixed_bytes + batch * self.per_example_bytes


def _profile(model: str) -> ModelProfile:
    from orchestrator.costmodel.compute import model_profile  # local: compute imports nothing of ours

    return model_profile(model)


def needed_activation_bytes(prof: ModelProfile) -> int:
    """Activation bytes per example that backward needs: the input and each layer output that the layer
    itself (ReLU, softmax) or the next layer (convolution, batch norm, ...) differentiates with."""
    layers = prof.layers
    kept = prof.input_bytes
    for i, layer in enumerate(layers):
        nxt = layers[i + 1].kind if i + 1 < len(layers) else ""
        if layer.kind in SAVES_OUTPUT or nxt in NEEDS_INPUT:
            kept += layer.write_bytes
    return kept


def counted_activation_bytes(model: str, params: MemoryParams = DEFAULT_MEMORY) -> float:
    prof = _profile(model)
    return float(needed_activation_bytes(prof) if params.needed_only else prof.activation_bytes)


@functools.cache
def memory_need(model: str, params: MemoryParams = DEFAULT_MEMORY) -> MemoryNeed:
    prof = _profile(model)
    fixed = prof.param_bytes * (2 + params.optimizer_slots) + params.workspace_bytes
    per_example = params.activation_fraction * counted_activation_bytes(model, params) + 2 * prof.peak_layer_bytes
    return MemoryNeed(float(fixed), float(per_example))


def fit_activation_fraction(model: str, batch: int, measured_bytes: float, needed_only: bool = True) -> MemoryParams:
    """The activation fraction that makes one measured peak exact (in-place ops, fused ops and freed
    buffers keep less than counted); a measured point, not a constant."""
    base = memory_need(model, MemoryParams(activation_fraction=0.0, needed_only=needed_only))
    counted = counted_activation_bytes(model, MemoryParams(needed_only=needed_only))
    frac = (measured_bytes - base.at(batch)) / (batch * counted)
    return MemoryParams(activation_fraction=_bounded(model, frac, counted), needed_only=needed_only)


def _bounded(model: str, frac: float, counted: float) -> float:
    """Physical bounds of the kept share: at least 5%, at most every layer output (the profile's total)."""
    return min(_profile(model).activation_bytes / counted, max(0.05, frac))


def fit_memory(model: str, points: Sequence[tuple[int, float]], needed_only: bool = True) -> MemoryParams:
    """Activation fraction and workspace from two or more measured (batch, peak bytes) of one model:
    a straight line in the batch, its slope the kept activations and its intercept the workspace."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("fit_memory needs measured peaks at two or more batch sizes")
    base = memory_need(model, MemoryParams(activation_fraction=0.0, needed_only=needed_only))
    b = np.array([float(p[0]) for p in points])
    y = np.array([p[1] - base.at(p[0]) for p in points])
    slope, intercept = np.polyfit(b, y, 1)
    counted = counted_activation_bytes(model, MemoryParams(needed_only=needed_only))
    frac = _bounded(model, float(slope) / counted, counted)
    return MemoryParams(activation_fraction=frac, workspace_bytes=max(0.0, float(intercept)), needed_only=needed_only)


def usable_bytes(gpu: str, catalog: Catalog | None = None, params: MemoryParams = DEFAULT_MEMORY) -> float:
    g = (catalog or load_catalog()).gpu(gpu)
    return params.usable_fraction * g.memory_gb * 1e9 - params.framework_reserve_bytes


def memory_bytes(model: str, batch: int, params: MemoryParams = DEFAULT_MEMORY) -> float:
    """Predicted GPU memory a worker needs for this batch."""
    return memory_need(model, params).at(batch)


def fits(
    model: str, gpu: str, batch: int, catalog: Catalog | None = None, params: MemoryParams = DEFAULT_MEMORY
) -> bool:
    return memory_bytes(model, batch, params) <= usable_bytes(gpu, catalog, params)


def max_batch(
    model: str, gpu: str, catalog: Catalog | None = None, params: MemoryParams = DEFAULT_MEMORY
) -> int:
    """The largest per-worker batch that fits the GPU's memory (0: not even the weights fit)."""
    need = memory_need(model, params)
    free = usable_bytes(gpu, catalog, params) - need.fixed_bytes
    if free <= 0:
        return 0
    return int(free // need.per_example_bytes)
