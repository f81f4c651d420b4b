"""Step time on any GPU from its architecture: an op-class roofline per layer, with efficiencies fitted on
public measurements (bench/cross_gpu.py -> data/crossgpu_fit.json) and an interval on every prediction.

Per layer ``l`` of a profile (per example, forward + backward, ``OpWork``):

    compute_l = gemm_flops_l / (eff_tensor[arch, precision] x tensor_peak_g,p)
              + conv_flops_l / (eff_tensor x conv[arch, precision] x tensor_peak_g,p) + vector_flops_l / fp32_peak_g
    memory_l  = bytes_l x byte_scale_p / (eff_memory[arch, precision] x bandwidth_g)
    weights_l = weight_bytes_l x WEIGHT_PASSES / (eff_memory x bandwidth_g) + ops_l x kernel_s   # per step
    time_l(b) = b x max(compute_l, memory_l) + weights_l

``tensor_peak`` is the datasheet peak of the precision (``data/gpu_arch.csv``): FP32 CUDA cores for
``fp32``, TF32 tensor cores for ``tf32`` (FP32 where a GPU has none), FP16 / BF16 tensor cores with FP32
accumulation for ``amp`` / ``bf16``; 16-bit moves half the bytes. ``eff_tensor`` is a fraction of that
peak and may exceed 1.0: cuDNN's Winograd and FFT convolutions do fewer multiplications than the naive
FLOP count this profile holds; ``conv`` is how much faster (or slower) convolutions run than matmuls of
the same FLOPs on that architecture (1 where no convolutional model was measured). Efficiencies belong
to an architecture (``arch``: the same kernels run on every GPU of one), so a GPU never measured is
predicted from its datasheet and its architecture's efficiencies (an architecture never measured: the
mean over the measured ones); a GPU with public rows also has its own tensor and memory deviation
(``Efficiencies.gpu``), as clocks, power limits and half-rate accumulation keep some off their datasheet.

With a measured step of the same model (``Point``), the prediction is that step scaled by the model's
ratio (target / measured): what the model gets wrong in absolute terms (framework, data loader, the
software of that table) cancels. The interval's half-width is the 80th percentile of the held-out error
of that kind of question (same GPU at another batch, other GPU, other GPU and precision, nothing
measured) and of its distance in batch (doublings), measured by ``bench/cross_gpu.py --write`` on model
families left out of the fit and stored in ``data/crossgpu_intervals.csv``.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from orchestrator.costmodel.profiles.model import BYTES_PER_VALUE, ModelProfile
from orchestrator.model.paths import data_dir

FloatArray = npt.NDArray[np.float64]

PRECISIONS = ("fp32", "tf32", "amp", "bf16")
TENSOR_KINDS = frozenset({"conv", "dense", "matmul"})
ANALYTIC_KERNELS = {"conv": 3, "dense": 3, "matmul": 3, "softmax": 4}  # else 2 (compute.KERNELS' counts)
# Weights per step: read forward and backward, gradient written, SGD with momentum reads weight,
# gradient and momentum and writes weight and momentum (5): 8 passes over the weights.
WEIGHT_PASSES = 8.0
BATCH_WIDEN_PER_DOUBLING = 0.05  # interval widening per doubling of batch away from the measured one
FIT_FILE = "crossgpu_fit.json"
INTERVALS_FILE = "crossgpu_intervals.csv"
INTERVAL_KINDS = ("same-gpu", "other-gpu", "other-gpu-precision", "none")
# Another GPU at the same precision, both machines fitted on other models' rows (host_fit, `model predict --torch
# --measurements`): its width is bench/cross_gpu_torchvision.py --write's (held out there), the batch distance
# widening it as it widens "other-gpu"
FITTED_KIND = "other-gpu-fitted"


class PrecisionError(ValueError):
    """A precision name outside PRECISIONS."""


def check_precision(precision: str) -> str:
    p = precision.lower()
    if p == "fp16":
        return "amp"
    if p not in PRECISIONS:
        raise PrecisionError(f"precision '{precision}' is not one of {', '.join(PRECISIONS)}")
    return p


def precision_class(precision: str) -> str:
    """What runs the tensor ops: ``fp32`` CUDA cores, ``tf32`` or 16-bit (``fp16``) tensor cores."""
    p = check_precision(precision)
    return "fp16" if p in ("amp", "bf16") else p


@dataclass(frozen=True)
class GpuArch:
    """Datasheet facts of one GPU (``data/gpu_arch.csv``); TFLOP/s dense, 0 = not supported."""

    key: str
    public_name: str
    name: str
    arch: str
    fp32_tflops: float
    tf32_tflops: float
    fp16_tflops: float
    bf16_tflops: float
    memory_bw_gbs: float
    sms: int
    l2_mb: float
    source_url: str

    def tensor_peak(self, precision: str) -> float:
        """FLOP/s of matmuls and convolutions at this precision (FP32 where the GPU lacks the unit)."""
        p = check_precision(precision)
        peak = {"fp32": self.fp32_tflops, "tf32": self.tf32_tflops, "amp": self.fp16_tflops,
                "bf16": self.bf16_tflops}[p]
        return max(peak, self.fp32_tflops) * 1e12

    def byte_scale(self, precision: str) -> float:
        """16-bit activations are half the bytes, where the GPU computes in 16 bits at all."""
        p = check_precision(precision)
        native = (p == "amp" and self.fp16_tflops > 0) or (p == "bf16" and self.bf16_tflops > 0)
        return 0.5 if native else 1.0


@functools.cache
def load_arch() -> dict[str, GpuArch]:
    out = {}
    with (data_dir() / "gpu_arch.csv").open(newline="") as fh:
        for r in csv.DictReader(fh):
            out[r["key"]] = GpuArch(
                r["key"], r["public_name"], r["name"], r["arch"], float(r["fp32_tflops"]), float(r["tf32_tflops"]),
                float(r["fp16_tflops"]), float(r["bf16_tflops"]), float(r["memory_bw_gbs"]), int(r["sms"]),
                float(r["l2_mb"]), r["source_url"],
            )
    return out


def arch_gpu(name: str) -> GpuArch:
    """A GPU by catalog key (``a100``) or public-table name (``A100-40GB-SXM``), case-insensitive."""
    n = name.lower()
    for g in load_arch().values():
        if n in (g.key, g.public_name.lower()):
            return g
    raise KeyError(f"no architecture facts for GPU '{name}' (data/gpu_arch.csv); known: {', '.join(load_arch())}")


@dataclass(frozen=True)
class ClassWork:
    """Per-layer arrays of a profile: per example (forward + backward) and, for weights, per step."""

    tensor_flops: FloatArray
    conv_flops: FloatArray  # the part of tensor_flops in convolutions
    vector_flops: FloatArray
    bytes: FloatArray
    weight_bytes: FloatArray
    names: tuple[str, ...]
    ops: FloatArray  # ATen ops (kernels) per step
    depthwise: FloatArray | None = None  # 1.0 at each depthwise convolution (Layer.depthwise); None: none


@functools.cache
def _class_work_cached(profile: ModelProfile) -> ClassWork:
    t, v, b, n, cv = [], [], [], [], []
    for layer in profile.layers:
        n.append(float(sum(w.ops for w in layer.train_ops)) if layer.train_ops else float(
            ANALYTIC_KERNELS.get(layer.kind, 2)))
        if layer.train_ops:  # measured by the profiler
            t.append(float(sum(w.flops for w in layer.train_ops if w.op_class == "tensor")))
            v.append(float(sum(w.flops for w in layer.train_ops if w.op_class != "tensor")))
            b.append(float(sum(w.bytes for w in layer.train_ops)))
        else:  # analytic profile: backward ~ 2x forward
            f = 3.0 * layer.flops
            t.append(f if layer.kind in TENSOR_KINDS else 0.0)
            v.append(0.0 if layer.kind in TENSOR_KINDS else f)
            b.append(3.0 * (layer.read_bytes + layer.write_bytes))
        cv.append(t[-1] if layer.kind == "conv" else 0.0)
    arr = functools.partial(np.array, dtype=np.float64)
    dw = [float(x.depthwise) for x in profile.layers]
    return ClassWork(arr(t), arr(cv), arr(v), arr(b), arr([float(x.weight_bytes) for x in profile.layers]),
                     tuple(x.name for x in profile.layers), arr(n), arr(dw) if any(dw) else None)


def class_work(profile: ModelProfile) -> ClassWork:
    return _class_work_cached(profile)


@dataclass(frozen=True)
class Efficiencies:
    """Fitted fractions of the datasheet per architecture x precision class (tensor may exceed 1)."""

    tensor: Mapping[str, float] = field(default_factory=dict)  # "arch/pclass" -> fraction of tensor_peak
    memory: Mapping[str, float] = field(default_factory=dict)  # "arch/pclass" -> fraction of bandwidth
    default_tensor: Mapping[str, float] = field(default_factory=lambda: {"fp32": 0.6, "tf32": 0.3, "fp16": 0.3})
    default_memory: float = 0.6
    interval: Mapping[str, float] = field(default_factory=lambda: {
        "same-gpu": 0.05, "other-gpu": 0.15, "other-gpu-precision": 0.25, "none": 0.6})
    held_out: Mapping[str, Any] = field(default_factory=dict)  # the bench's summary (what was held out)
    kernel_s: float = 0.0  # GPU time per kernel whatever its work (launch, ramp-up, tail); off: bench/cross_gpu.py
    conv: Mapping[str, float] = field(default_factory=dict)  # "arch/pclass" -> conv speed / matmul speed
    # "gpu/pclass/tensor|memory" -> this GPU's deviation from its architecture's efficiency, fitted on its
    # public rows (a GPU whose clocks or power limit keep it off its datasheet, e.g. the RTX 3090's TF32)
    gpu: Mapping[str, float] = field(default_factory=dict)
    # "kind/doublings" -> interval half-width (data/crossgpu_intervals.csv); empty: ``interval`` alone
    widths: Mapping[str, float] = field(default_factory=dict)

    def gpu_tensor(self, gpu: str, precision: str) -> float:
        return self.gpu.get(f"{gpu}/{precision_class(precision)}/tensor") or 1.0

    def gpu_memory(self, gpu: str, precision: str) -> float:
        return self.gpu.get(f"{gpu}/{precision_class(precision)}/memory") or 1.0

    def conv_ratio(self, arch: str, precision: str) -> float:
        return self.conv.get(f"{arch}/{precision_class(precision)}") or 1.0

    def width(self, kind: str, doublings: float) -> float:
        """Half-width for a question of ``kind`` whose batch is ``doublings`` away from the measured one:
        the held-out width of the nearest batch distance the bench measured, else ``interval``."""
        measured = sorted((int(k.split("/")[1]), v) for k, v in self.widths.items() if k.split("/")[0] == kind)
        if not measured:
            return float(self.interval[kind]) + BATCH_WIDEN_PER_DOUBLING * doublings
        # the widest band at or below this distance (never narrower for a farther batch); a distance
        # nearer than any the bench measured takes the nearest band
        near = max(round(doublings), measured[0][0])
        return max(v for d, v in measured if d <= near)

    def measured(self, kind: str) -> bool:
        """Whether a bench measured this kind's width (data/crossgpu_intervals.csv has a row of it)."""
        return any(k.split("/")[0] == kind for k in self.widths)

    def tensor_eff(self, arch: str, precision: str) -> float:
        pc = precision_class(precision)
        return self.tensor.get(f"{arch}/{pc}") or self.default_tensor.get(pc, 0.4)

    def memory_eff(self, arch: str, precision: str) -> float:
        return self.memory.get(f"{arch}/{precision_class(precision)}") or self.default_memory

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": dict(sorted(self.tensor.items())), "memory": dict(sorted(self.memory.items())),
                "default_tensor": dict(self.default_tensor), "default_memory": self.default_memory,
                "interval": dict(self.interval), "held_out": dict(self.held_out), "kernel_s": self.kernel_s,
                "conv": dict(sorted(self.conv.items())), "gpu": dict(sorted(self.gpu.items()))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Efficiencies:
        base = cls()
        return cls({str(k): float(v) for k, v in (d.get("tensor") or {}).items()},
                   {str(k): float(v) for k, v in (d.get("memory") or {}).items()},
                   {str(k): float(v) for k, v in (d.get("default_tensor") or base.default_tensor).items()},
                   float(d.get("default_memory") or base.default_memory),
                   {str(k): float(v) for k, v in (d.get("interval") or base.interval).items()},
                   dict(d.get("held_out") or {}), float(d.get("kernel_s") or 0.0),
                   {str(k): float(v) for k, v in (d.get("conv") or {}).items()},
                   {str(k): float(v) for k, v in (d.get("gpu") or {}).items()})


@functools.cache
def load_efficiencies() -> Efficiencies:
    """data/crossgpu_fit.json and data/crossgpu_intervals.csv (``python bench/cross_gpu.py --write``);
    physical priors where they are missing."""
    try:
        eff = Efficiencies.from_dict(json.loads((data_dir() / FIT_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        eff = Efficiencies()
    widths = load_widths()
    if not widths:
        return eff
    eff = replace(eff, widths=widths)
    # the plan's width of each kind: the held-out width at the measured batch (the nearest band measured)
    kinds = {k.split("/")[0] for k in widths}
    return replace(eff, interval={**eff.interval, **{k: eff.width(k, 0.0) for k in INTERVAL_KINDS if k in kinds}})


def load_widths() -> dict[str, float]:
    """``kind/doublings -> half-width`` rows of data/crossgpu_intervals.csv; empty where it is missing."""
    try:
        with (data_dir() / INTERVALS_FILE).open(newline="") as fh:
            return {f"{r['kind']}/{int(r['batch_doublings'])}": float(r["half_width"]) for r in csv.DictReader(fh)}
    except (OSError, ValueError, KeyError):
        return {}


def layer_seconds(
    work: ClassWork, gpu: GpuArch, precision: str, eff: Efficiencies | None = None
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per layer: (compute seconds per example, memory seconds per example, weight seconds per step)."""
    e = eff or load_efficiencies()
    bw = e.memory_eff(gpu.arch, precision) * e.gpu_memory(gpu.key, precision) * gpu.memory_bw_gbs * 1e9
    tensor = e.tensor_eff(gpu.arch, precision) * e.gpu_tensor(gpu.key, precision) * gpu.tensor_peak(precision)
    compute = ((work.tensor_flops - work.conv_flops) / tensor
               + work.conv_flops / (tensor * e.conv_ratio(gpu.arch, precision))
               + work.vector_flops / (gpu.fp32_tflops * 1e12))
    memory = work.bytes * gpu.byte_scale(precision) / bw
    weights = work.weight_bytes * WEIGHT_PASSES / bw + work.ops * e.kernel_s
    return compute, memory, weights


def layer_times(
    profile: ModelProfile, gpu: str, precision: str, batch: int, eff: Efficiencies | None = None
) -> list[float]:
    """Seconds each layer of ``profile`` takes in one training step (forward + backward + its share of the
    optimizer) on ``gpu`` at ``precision`` and ``batch`` (GPU time only: no host overhead, no
    communication). The pipeline partitioner's per-stage cost is the sum over a stage's layers."""
    c, m, w = layer_seconds(class_work(profile), arch_gpu(gpu), precision, eff)
    return [float(x) for x in batch * np.maximum(c, m) + w]


def layer_memory_bytes(profile: ModelProfile, batch: int, precision: str = "fp32") -> list[int]:
    """Bytes each layer holds during a step: its saved activations at ``batch`` and its weights,
    gradients and momentum (fp32 master copies; 16-bit halves the activations)."""
    scale = 0.5 if check_precision(precision) in ("amp", "bf16") else 1.0
    return [int(batch * layer.saved_bytes * scale) + 3 * layer.params * BYTES_PER_VALUE for layer in profile.layers]


def gpu_seconds(
    profile: ModelProfile, gpu: str, precision: str, batch: float, eff: Efficiencies | None = None
) -> float:
    c, m, w = layer_seconds(class_work(profile), arch_gpu(gpu), precision, eff)
    return float((batch * np.maximum(c, m) + w).sum())


def gpu_parts(
    work: ClassWork, gpu: str, precision: str, batch: float, eff: Efficiencies | None = None
) -> tuple[float, float, float]:
    """(seconds of the layers the roofline finds compute-bound, of the memory-bound ones and the weights'
    passes, of the depthwise convolutions) of one step: what ``host_fit`` scales per machine; their sum is
    :func:`gpu_seconds`. Depthwise layers count only in the third, whichever bound the roofline finds."""
    c, m, w = layer_seconds(work, arch_gpu(gpu), precision, eff)
    dw = work.depthwise.astype(bool) if work.depthwise is not None else np.zeros(len(c), dtype=bool)
    bound = np.maximum(c, m)
    return (float(batch * c[(c >= m) & ~dw].sum()), float(batch * m[(m > c) & ~dw].sum() + w.sum()),
            float(batch * bound[dw].sum()))


@dataclass(frozen=True)
class Point:
    """One measured step of the model: GPU (key or public name), batch, precision, milliseconds."""

    gpu: str
    batch: int
    precision: str
    step_ms: float


@dataclass(frozen=True)
class Prediction:
    step_ms: float
    low_ms: float
    high_ms: float
    relative: float  # half-width of the interval as a fraction of step_ms
    basis: str  # what the prediction stands on
    kind: str  # same-gpu | other-gpu | other-gpu-precision | none
    from_point: Point | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"step_ms": self.step_ms, "low_ms": self.low_ms, "high_ms": self.high_ms,
                "interval_relative": self.relative, "basis": self.basis, "kind": self.kind,
                "from_point": None if self.from_point is None else {
                    "gpu": self.from_point.gpu, "batch": self.from_point.batch,
                    "precision": self.from_point.precision, "step_ms": self.from_point.step_ms}}


def _kind(point: Point, gpu: GpuArch, precision: str) -> str:
    same_gpu = arch_gpu(point.gpu).key == gpu.key
    same_precision = check_precision(point.precision) == check_precision(precision)
    if same_gpu and same_precision:
        return "same-gpu"
    return "other-gpu" if same_precision else "other-gpu-precision"


def _rank(point: Point, gpu: GpuArch, precision: str, batch: int) -> tuple[int, float]:
    order = {"same-gpu": 0, "other-gpu": 1, "other-gpu-precision": 2}
    return order[_kind(point, gpu, precision)], abs(math.log(point.batch / batch))


def predict(
    profile: ModelProfile,
    gpu: str,
    batch: int,
    precision: str,
    points: Sequence[Point] = (),
    host_s: float = 0.0,
    eff: Efficiencies | None = None,
    model_s: Callable[[str, str, int], float] | None = None,
    fitted: Set[tuple[str, str]] = frozenset(),
    host_share: Callable[[str, str, int], float] | None = None,
) -> Prediction:
    """Step time of ``profile`` on ``gpu``: from the nearest measured point (same GPU and precision first,
    then the nearest batch) scaled by the model's ratio, or from the model alone; with its interval.
    ``model_s(gpu key, precision, batch)``: the model's seconds (default: ``host_s`` and the GPU time,
    smooth max; ``host_fit`` passes each machine's fitted host and GPU scales). ``fitted``: the (GPU key,
    precision) machines with a fit of their own; a question between two of them is ``FITTED_KIND``.
    ``host_share(gpu key, precision, batch)``: the host's share of the model's step there (``host_fit``);
    given, the measured point's departure from the model carries over as far as the two steps are made
    of the same parts (``transfer_weight``)."""
    e = eff or load_efficiencies()
    g = arch_gpu(gpu)

    def of(key: str, prec: str, b: int) -> float:
        return model_s(key, prec, b) if model_s else smooth_max(host_s, gpu_seconds(profile, key, prec, b, e))

    model_ms = 1e3 * of(g.key, precision, batch)
    if not points:
        rel = none_interval(e)
        how = "machine fits (host time, GPU scales)" if model_s else "the runtime's host prior"
        return Prediction(model_ms, model_ms / (1 + rel), model_ms * (1 + rel), rel,
                          f"no measured point of this model: datasheet x fitted efficiencies, with {how}", "none")
    p = min(points, key=lambda q: _rank(q, g, precision, batch))
    src = arch_gpu(p.gpu)
    src_prec, prec = check_precision(p.precision), check_precision(precision)
    src_ms = 1e3 * of(src.key, src_prec, p.batch)
    kind, doublings = _kind(p, g, precision), abs(math.log2(p.batch / batch))
    # tested where held-out data has it (bench/cross_gpu_torchvision.py, bench/h200_torchvision_heldout.py):
    # another GPU at the same precision; elsewhere the whole ratio, as before
    weight = 1.0 if host_share is None or kind != "other-gpu" else transfer_weight(
        host_share(src.key, src_prec, p.batch), host_share(g.key, prec, batch))
    step = model_ms * (p.step_ms / src_ms) ** weight
    rel = e.width(kind, doublings)
    if kind == "other-gpu" and {(src.key, prec), (g.key, prec)} <= fitted and e.measured(FITTED_KIND):
        kind, rel = FITTED_KIND, e.width(FITTED_KIND, 0.0) + rel - e.width("other-gpu", 0.0)
    basis = f"measured {p.step_ms:g} ms on {src.key} at batch {p.batch} {p.precision}, scaled by the model" + (
        " (both machines fitted on other models' rows)" if kind == FITTED_KIND else "") + (
        f"; {weight:.0%} of its departure from the model kept (host / GPU shares of the two steps)"
        if weight < 0.995 else "")
    return Prediction(step, step / (1 + rel), step * (1 + rel), rel, basis, kind, p)


def transfer_weight(host_from: float, host_to: float) -> float:
    """How much of a measured step's departure from the model (a log ratio) a prediction elsewhere keeps, from
    the host's share of each step (its log-derivative: h / (h + g) for an additive step). The departure is
    spread over host and GPU time in proportion to their shares (the least-norm split), then summed with the
    target's shares: 1 where the two steps are made alike, 0 from a step all GPU to one all host (the GPU's
    error does not slow a host-bound step), never more than 1. No constant is fitted."""
    sf = (host_from, 1.0 - host_from)
    st = (host_to, 1.0 - host_to)
    return min(1.0, max(0.0, (st[0] * sf[0] + st[1] * sf[1]) / (sf[0] ** 2 + sf[1] ** 2)))


def none_interval(eff: Efficiencies) -> float:
    """Nothing measured is never surer than a measurement on another GPU at another precision."""
    return max(eff.interval["none"], eff.interval["other-gpu-precision"])


def smooth_max(a: float, b: float, p: float = 8.0) -> float:
    return float((a**p + b**p) ** (1 / p))
