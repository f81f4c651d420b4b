"""Compute model: one worker's step time from the layer profile, the GPU's specs and the runtime.

Real GPUs show two regimes (data/measurements: eager ResNet-32 on an H100 takes ~13 ms a step from
batch 32 to 512, then 20.6 ms at 1024 and 38.5 ms at 2048):

    host(m,r)  = overhead_s + overhead_per_kernel_s * kernels_r(m)          # framework: launches, dispatch
    gpu(m,g,b) = sum_l (b + h_l) * max(c_l, m_l) + w_l                      # occupancy-limited roofline
    c_l = 3 F_l / (eff_compute * peak_g),  m_l = 3 A_l / (eff_memory * bw_g),  w_l = 3 W_l / (eff_memory * bw_g)
    h_l = half_batch * REFERENCE_ELEMENTS / elements_l
    step       = (host^P + gpu^P)^(1/P)                                     # P: how far host and GPU overlap

* ``host``: the per-step runtime overhead: a fixed part (session run / Python step, the optimizer's
  multi-tensor launches) and a part per launched kernel. ``kernels_r(m)`` is counted from the layer
  kinds (``KERNELS``: a training step launches forward and backward kernels, e.g. 3 for a convolution:
  forward, data gradient, weight gradient; 2 for a batch norm or a ReLU), so a deeper model pays for
  every block it adds; a fusing runtime (``FUSING_RUNTIMES``: XLA, torch.compile) folds ReLUs and adds
  into their neighbours (no launch, no extra pass over memory). Host costs depend on the framework and
  runtime (TF1 graph, Keras/XLA, PyTorch eager, torch.compile), which is why the runtime is a
  calibration dimension.
* per-example work that saturates with occupancy: a layer at batch ``b`` runs at ``b / (b + h_l)`` of
  its roofline rate, where ``h_l`` is the batch that half-fills the GPU for that layer. A layer with
  fewer output elements per example (the 64-channel 8x8 stage of a CIFAR ResNet has a quarter of the
  16-channel 32x32 stage's) needs a proportionally bigger batch: ``h_l = half_batch x
  REFERENCE_ELEMENTS / elements_l``; ``half_batch`` (the batch that half-fills the GPU for a 32x32x16
  layer) is a GPU property, prior ``HALF_BATCH_PER_TFLOP x`` its FP32 TFLOP/s (bigger GPUs need bigger
  batches). At small batch every layer costs ``h_l max(c_l, m_l)``: about the same for every
  memory-bound layer, i.e. a per-kernel floor on the GPU.
* the roofline per layer: arithmetic (``c_l``) or memory traffic (``m_l``: batch norm, ReLU, adds, and
  the activations every convolution reads and writes), whichever is slower. FP32 convolutions run on
  TF32 tensor cores on Ampere and later GPUs (``TF32_GPUS``; the frameworks' default), so their compute
  peak is the TF32 one; 16-bit precisions use the FP16/BF16 tensor peak and move half the bytes.
  Forward + backward is ~3x the forward work for FLOPs and traffic alike.
* the two overlap (the host enqueues kernels asynchronously), so the step is a smooth maximum; the
  exponent ``P`` (``Efficiency.overlap``, prior 8: within ~9% of a hard max where the two are equal)
  is a runtime property, fitted where a batch curve has a middle point (``calibration._has_curve``):
  P = 1 means host and GPU time add (a runtime that waits for the GPU between its host phases).

Efficiencies are fractions of the datasheet (``<= 1``, enforced); ``eff_compute``, ``eff_memory`` and
``half_batch`` belong to the GPU (the same cuDNN kernels under every runtime) and are fitted jointly
over a GPU's runtimes; the overheads and ``P`` belong to the runtime. Communication (PS / all-reduce)
is in ``comm.py``; memory in ``memory.py``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from orchestrator.costmodel.crossgpu import PrecisionError, arch_gpu, check_precision
from orchestrator.costmodel.machine_fit import Fits, MachineFit, fit_for, gpu_precision
from orchestrator.costmodel.profiles import (
    BYTES_PER_VALUE,
    ModelProfile,
    UnknownModelError,
    get_profile,
    resnet_cifar,
)
from orchestrator.costmodel.profiles.user import is_user_model
from orchestrator.model.catalog import Gpu
from orchestrator.model.paths import data_dir

FloatArray = npt.NDArray[np.float64]

TRAINING_FACTOR = 3.0  # forward + backward ~= 3x forward (FLOPs and activation traffic)
WEIGHT_TRAFFIC_FACTOR = 3.0  # weights read forward and backward, gradient written once
SMOOTH_MAX_P = 8.0
PRIOR_WEIGHT = 0.15  # a fit's pull of each parameter towards its prior, per log unit (calibration, host_fit)
# ASSUMPTION (prior): the parallel work that half-fills a GPU grows with its peak (cores x clock): a
# layer of REFERENCE_ELEMENTS output elements per example (32x32x16) half-fills it at a batch of
# HALF_BATCH_PER_TFLOP x its FP32 TFLOP/s, i.e. about one element per resident thread (H100: 132 SMs x
# 2048 threads = 270k = 16.75 x 16384; K80 die: 13 SMX x 2048 = 27k, the prior 1.1 x 16384 = 18k).
HALF_BATCH_PER_TFLOP = 0.25
REFERENCE_ELEMENTS = 32 * 32 * 16
DEFAULT_RUNTIME = "tf1-graph"  # the project's TensorFlow PS job
RUNTIMES = ("tf1-graph", "keras-xla", "pytorch-eager", "torch-compile")
FUSING_RUNTIMES = frozenset({"keras-xla", "torch-compile"})  # element-wise layers fused into neighbours
# The built-in PyTorch payload's label (jobs/torchjob/train.py RUNTIME): eager PyTorch with that job's own
# per-step costs (a control all-reduce, a host sync); a GPU without points of it uses eager PyTorch's fits.
TORCHJOB_RUNTIME = "pytorch-eager+torchjob"
SIXTEEN_BIT_LABELS = frozenset({"bf16", "amp", "fp16"})  # the precision part of a runtime key
# Kernels a training step launches per layer kind (forward + backward): a convolution or dense layer
# runs forward, data gradient and weight gradient; batch norm and layer norm one kernel each way; a
# ReLU forward and its mask backward; a residual add forward and the gradient accumulation of the
# branching input; softmax with cross-entropy two each way; an embedding a gather and a scatter-add.
# The optimizer's multi-tensor launches are in the per-step overhead.
KERNELS: dict[str, int] = {
    "conv": 3, "dense": 3, "matmul": 3, "batchnorm": 2, "layernorm": 2, "relu": 2, "add": 2,
    "avgpool": 2, "maxpool": 2, "softmax": 4, "embedding": 2,
}
FUSED_KINDS = frozenset({"relu", "add"})  # what a fusing runtime folds into the neighbouring kernel
# 16-bit autocast casts each FP32 weight of a convolution / dense / matmul to 16 bits every forward and
# the weight gradient back to FP32 (PyTorch autocast, Keras mixed precision): two more kernels each.
CAST_KINDS = frozenset({"conv", "dense", "matmul"})
CAST_KERNELS = 2
KERNELS_PER_LAYER = 2.3  # a CIFAR ResNet's kernels per profile layer (only for per-layer displays)


def runtime_key(runtime: str, precision: str = "fp32") -> str:
    """Calibration key of a runtime and precision: ``pytorch-eager`` or ``pytorch-eager+bf16``."""
    p = precision.lower().split("-")[0]
    return runtime if p in ("", "fp32", "tf32") else f"{runtime}+{p}"


def base_runtime_key(key: str) -> str:
    """The key without its payload or variant labels, precision kept: ``pytorch-eager+torchjob+bf16`` ->
    ``pytorch-eager+bf16``; the key itself where it has none."""
    head, *labels = key.split("+")
    return "+".join([head, *(x for x in labels if x in SIXTEEN_BIT_LABELS)])


@dataclass(frozen=True)
class Efficiency:
    """Fitted constants of one GPU x runtime: fractions of the datasheet peaks, the GPU's half-occupancy
    batch, and the runtime's host overhead and overlap."""

    eff_compute: float
    eff_memory: float
    overhead_s: float
    overhead_per_kernel_s: float = 0.0
    half_batch: float | None = None  # None: the prior, HALF_BATCH_PER_TFLOP x the GPU's FP32 TFLOP/s
    overlap: float = SMOOTH_MAX_P  # blend exponent of host and GPU time: 1 = they add, large = they overlap

    def __post_init__(self) -> None:
        if not (0 < self.eff_compute <= 1 and 0 < self.eff_memory <= 1):
            raise ValueError(f"implausible efficiency {self}: efficiencies must be in (0, 1]")
        if not 1.0 <= self.overlap <= 64.0:
            raise ValueError(f"implausible efficiency {self}: overlap must be in [1, 64]")
        if self.overhead_s < 0 or self.overhead_per_kernel_s < 0 or (self.half_batch or 0) < 0:
            raise ValueError(f"implausible efficiency {self}: overheads and half_batch must be >= 0")

    def half_batch_for(self, gpu: Gpu) -> float:
        return HALF_BATCH_PER_TFLOP * gpu.fp32_tflops if self.half_batch is None else self.half_batch

    def host_s(self, kernels: float) -> float:
        return self.overhead_s + self.overhead_per_kernel_s * kernels

    def to_dict(self) -> dict[str, float | None]:
        return {
            "eff_compute": self.eff_compute,
            "eff_memory": self.eff_memory,
            "overhead_s": self.overhead_s,
            "overhead_per_kernel_s": self.overhead_per_kernel_s,
            "half_batch": self.half_batch,
            "overlap": self.overlap,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Efficiency:
        hb = d.get("half_batch")
        per_kernel = d.get("overhead_per_kernel_s")
        if per_kernel is None:  # files written before kernels were counted: a per-layer figure
            per_kernel = float(d.get("overhead_per_layer_s") or 0.0) / KERNELS_PER_LAYER
        return cls(
            float(d["eff_compute"]),
            float(d["eff_memory"]),
            float(d["overhead_s"]),
            float(per_kernel),
            None if hb is None else float(hb),
            float(d.get("overlap") or SMOOTH_MAX_P),
        )


# PRIORS, used where no measurement constrains a parameter. Physical reasoning, not fits: a CUDA
# kernel launch costs ~5 us of host time and eager PyTorch's dispatch, autograd bookkeeping and Python
# module calls roughly as much again (~20 us a kernel); TorchInductor's generated Python wrapper
# launches each Triton kernel through Triton's Python launcher (~30 us) and a compiled step's fixed
# cost is its guard check plus the eager optimizer's few multi-tensor launches (~1 ms); TF1's executor
# dispatches ops at ~15 us each on a 2019 4-8 vCPU VM and runs a session call (feed, fetch) of a few
# ms; XLA launches whole fused clusters (~5 us); FP32 training of small CNNs reaches ~40% of the
# datasheet FLOP/s and ~60% of the bandwidth. TF 1.x moves more bytes than the profile counts: its
# default NHWC layout is transposed to and from cuDNN's NCHW around every convolution (TensorFlow
# performance guide: "NCHW is the optimal format for cuDNN") and its batch norm, ReLU and adds run
# unfused, ~2.5x the profile's traffic, hence 0.6 / 2.5 = 0.25 of the bandwidth. (Which of compute and
# memory dominates decides how a GPU's step time scales with its datasheet; leave-one-GPU-out on the
# ICAC'19 K80 / P100 / V100 runs is within 3% for any memory prior from 0.1 to 0.3, and off by up to
# 23% with 0.6: the P100's step time follows its bandwidth, not its FP32 FLOP/s.)
RUNTIME_PRIORS: dict[str, Efficiency] = {
    "tf1-graph": Efficiency(0.4, 0.25, 0.005, 15e-6),
    "keras-xla": Efficiency(0.4, 0.6, 0.002, 5e-6),
    "pytorch-eager": Efficiency(0.4, 0.6, 0.002, 20e-6),
    "torch-compile": Efficiency(0.4, 0.6, 0.001, 30e-6),
}
DEFAULT_EFFICIENCY = RUNTIME_PRIORS[DEFAULT_RUNTIME]


def prior_for(key: str) -> Efficiency:
    """The prior of a runtime key (``+bf16`` variants start from their FP32 runtime's)."""
    return RUNTIME_PRIORS.get(key.split("+")[0], DEFAULT_EFFICIENCY)


@dataclass(frozen=True)
class NetParams:
    """Communication-model constants (see ``comm.py``); calibrated from cluster measurements if given.

    Defaults: gRPC reaches 70% of a NIC's nominal egress; each push or pull round trip costs a worker
    0.5 ms; the PS spends 49 us of CPU per variable per request (TF sends one tensor per RPC; fitted to
    the ICAC'19 study's measured 1-PS ceiling of ~45 steps/s for ResNet-32, data/measurements); every
    additional concurrent worker costs the PS 1% of its network efficiency (incast). A round trip
    between zones adds 0.5 ms, between regions of one continent 25 ms, between continents 100 ms.
    """

    net_efficiency: float = 0.7
    request_latency_s: float = 0.5e-3
    ps_cpu_per_variable_s: float = 49e-6
    incast_penalty: float = 0.01
    cross_zone_rtt_s: float = 0.5e-3
    cross_region_rtt_s: float = 0.025
    cross_continent_rtt_s: float = 0.1

    def to_dict(self) -> dict[str, float]:
        return {
            "net_efficiency": self.net_efficiency,
            "request_latency_s": self.request_latency_s,
            "ps_cpu_per_variable_s": self.ps_cpu_per_variable_s,
            "incast_penalty": self.incast_penalty,
            "cross_zone_rtt_s": self.cross_zone_rtt_s,
            "cross_region_rtt_s": self.cross_region_rtt_s,
            "cross_continent_rtt_s": self.cross_continent_rtt_s,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NetParams:
        base = cls()
        return cls(**{k: float(d.get(k, getattr(base, k))) for k in base.to_dict()})


@dataclass(frozen=True)
class Calibration:
    """Fitted efficiencies by key, most specific first: ``gpu/runtime/model``, ``gpu/runtime``,
    ``*/runtime``, ``gpu`` (older files), then the runtime's prior (``default`` for the TF job)."""

    default: Efficiency = DEFAULT_EFFICIENCY
    per_gpu: Mapping[str, Efficiency] = field(default_factory=dict)
    net: NetParams = field(default_factory=NetParams)
    name: str = "builtin-priors"
    source: str = "runtime priors (no measurements): see orchestrator/costmodel/compute.py RUNTIME_PRIORS"
    mape: float | None = None  # held-out error of the fit, if known
    points: Mapping[str, int] = field(default_factory=dict)  # measured points behind each key
    emulated: bool = False  # fitted on the local provider's emulated GPUs: never used for real ones
    local_host: Mapping[str, float] = field(default_factory=dict)  # this host's figures fitted on local jobs
    # per runtime label (pytorch-eager, pytorch-eager+torchjob): host_fit's fits per GPU x precision, what a
    # user's model (no point of its own) is predicted with, as `model predict --torch` does
    machines: Mapping[str, Fits] = field(default_factory=dict)
    measured: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # probes' points: costmodel/measured

    def lookup(self, gpu: str, runtime: str = DEFAULT_RUNTIME, model: str | None = None) -> tuple[str, Efficiency]:
        """A payload's own key (``pytorch-eager+torchjob``) first, then its runtime's (``pytorch-eager``): a
        GPU measured in eager PyTorch but never with that payload is still a measured GPU."""
        g = gpu.lower()
        runtimes = list(dict.fromkeys([runtime, base_runtime_key(runtime)]))
        keys = [k for rt in runtimes for k in ([f"{g}/{rt}/{model}"] if model else []) + [f"{g}/{rt}"]]
        keys += [f"*/{rt}" for rt in runtimes]
        if runtime == DEFAULT_RUNTIME:
            keys.append(g)
        for k in keys:
            if k in self.per_gpu:
                return k, self.per_gpu[k]
        if runtime == DEFAULT_RUNTIME:
            return "default", self.default
        return f"prior:{runtime}", prior_for(runtime)

    def machine_fits(self, runtime: str) -> Fits:
        """The runtime's machine fits, else those of its base runtime (a payload's: eager PyTorch's); a runtime
        key's precision label is dropped (machine fits are keyed by GPU x precision within a runtime)."""
        bare = "+".join(x for x in runtime.split("+") if x not in SIXTEEN_BIT_LABELS)
        return self.machines.get(bare) or self.machines.get(base_runtime_key(bare)) or {}

    def machine_fit(self, gpu: str, runtime: str, precision: str) -> tuple[str, MachineFit] | None:
        """The machine fit a user's model takes on ``gpu`` (``machine_fit.fit_for``: its own, its architecture's,
        or the measured machines' host), with where it comes from; None where no machine of this runtime was
        fitted or the GPU has no architecture row."""
        fits = self.machine_fits(runtime)
        if not fits:
            return None
        try:
            key, prec = arch_gpu(gpu).key, check_precision(precision)
        except (KeyError, PrecisionError):
            return None
        fit = fit_for(fits, key, prec)
        if fit is None:
            return None
        rt = next(rt for rt, f in self.machines.items() if f is fits)
        src = next((f"{g}/{p}" for (g, p), f in fits.items() if f is fit), None)
        if src is None:  # fit_for's host of the measured machines: at this precision, else at any
            src = "host of " + ", ".join(f"{g}/{p}" for g, p in fits if p == prec or prec not in {q for _, q in fits})
        return f"machine fit {src} ({rt})", fit

    def for_gpu(self, gpu: str, runtime: str = DEFAULT_RUNTIME, model: str | None = None) -> Efficiency:
        return self.lookup(gpu, runtime, model)[1]

    def describe(self, gpu: str, runtime: str = DEFAULT_RUNTIME, model: str | None = None,
                 precision: str = "fp32") -> str:
        key, _ = self.lookup(gpu, runtime, model)
        machine = self.machine_fit(gpu, runtime, precision) if model and is_user_model(model) else None
        if machine is not None and not key.endswith(f"/{model}"):  # what step_fn uses for this model
            return f"{self.name}, {machine[0]}"
        n = self.points.get(key)
        return f"{self.name}, key {key}" + (f" ({n} measured points)" if n else " (priors, no measured point)")

    def with_meta(
        self, name: str | None = None, source: str | None = None, mape: float | None = None
    ) -> Calibration:
        return replace(
            self, name=name or self.name, source=source or self.source, mape=self.mape if mape is None else mape
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "mape": self.mape,
            "emulated": self.emulated,
            "default": self.default.to_dict(),
            "per_gpu": {k: v.to_dict() for k, v in sorted(self.per_gpu.items())},
            "points": dict(sorted(self.points.items())),
            "local_host": dict(self.local_host),
            "net": self.net.to_dict(),
            "machines": {rt: {f"{g}/{p}": f.to_dict() for (g, p), f in sorted(fits.items())}
                         for rt, fits in sorted(self.machines.items())},
            **({"measured": dict(sorted(self.measured.items()))} if self.measured else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        per_gpu = d.get("per_gpu") or {}
        mape = d.get("mape")
        return cls(
            default=Efficiency.from_dict(d["default"]) if "default" in d else DEFAULT_EFFICIENCY,
            per_gpu={str(k).lower(): Efficiency.from_dict(v) for k, v in per_gpu.items()},
            net=NetParams.from_dict(d.get("net") or {}),
            name=str(d.get("name", "unnamed")),
            source=str(d.get("source", "")),
            mape=None if mape is None else float(mape),
            points={str(k): int(v) for k, v in (d.get("points") or {}).items()},
            emulated=bool(d.get("emulated", False)),
            local_host={str(k): float(v) for k, v in (d.get("local_host") or {}).items()},
            machines={str(rt): {gpu_precision(k): MachineFit.from_dict(v) for k, v in fits.items()}
                      for rt, fits in (d.get("machines") or {}).items()},
            measured={str(k): dict(v) for k, v in (d.get("measured") or {}).items()},
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        d = json.loads(text)
        if not isinstance(d, dict) or not {"default", "per_gpu"} & d.keys():  # another JSON file, not a typo's luck
            raise ValueError("it is not a JSON object with 'default' or 'per_gpu' (as `model calibrate --out` writes)")
        return cls.from_dict(d)

    def save(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")


PRIORS_ONLY = Calibration()


def _default_calibration() -> Calibration:
    """data/calibration.json: the fit to every real point in data/measurements (regenerate with
    ``orchestrator model calibrate data/measurements --name measured --out data/calibration.json``);
    the runtime priors if it is missing or unreadable."""
    try:
        return Calibration.from_json((data_dir() / "calibration.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return PRIORS_ONLY


DEFAULT_CALIBRATION = _default_calibration()


def load_calibration(path: str | Path) -> Calibration:
    """A calibration written by ``Calibration.save`` / ``orchestrator model calibrate --out``."""
    p = Path(path)
    try:
        return Calibration.from_json(p.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read calibration {p}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{p} is not a calibration file: {exc}") from None


# ---------------------------------------------------------------- per-layer arrays


def model_profile(model: str) -> ModelProfile:
    """The model's profile; a CIFAR ResNet of any depth 6n+2 (``resnet_cifar_44``) is built on demand."""
    try:
        return get_profile(model)
    except UnknownModelError:
        prefix, _, depth = model.rpartition("_")
        if prefix == "resnet_cifar" and depth.isdigit() and int(depth) >= 8 and (int(depth) - 2) % 6 == 0:
            n = (int(depth) - 2) // 6
            return _resnet_of_depth(model, n)
        raise


@functools.cache
def _resnet_of_depth(model: str, n: int) -> ModelProfile:
    return resnet_cifar(model, (n, n, n), (16, 32, 64))


@dataclass(frozen=True)
class LayerArrays:
    """Per-layer totals of a profile as arrays (per example, forward)."""

    flops: FloatArray
    act_bytes: FloatArray  # read + write
    weight_bytes: FloatArray
    conv: FloatArray  # 1.0 for convolutions (tensor cores at TF32 on GPUs that have them), else 0.0
    elements: FloatArray  # parallel work: elements the layer reads or writes, whichever is more
    kernels: FloatArray  # kernels a training step launches for the layer (KERNELS)
    fusable: FloatArray  # 1.0 for layers a fusing runtime folds into their neighbours (FUSED_KINDS)
    castable: FloatArray  # 1.0 for layers whose weights 16-bit autocast casts every step (CAST_KINDS)

    @property
    def layers(self) -> int:
        return len(self.flops)

    def kernel_count(self, runtime: str = DEFAULT_RUNTIME, precision: str = "fp32") -> float:
        """Kernels launched per training step (without the optimizer's, which are per step)."""
        fused = runtime.split("+")[0] in FUSING_RUNTIMES
        n = float(np.sum(self.kernels * (1.0 - self.fusable) if fused else self.kernels))
        if _sixteen_bit(precision):
            n += CAST_KERNELS * float(np.sum(self.castable))
        return n


@functools.cache
def layer_arrays(model: str) -> LayerArrays:
    prof = model_profile(model)
    ls = prof.layers
    return LayerArrays(
        flops=np.array([layer.flops for layer in ls], dtype=np.float64),
        act_bytes=np.array([layer.read_bytes + layer.write_bytes for layer in ls], dtype=np.float64),
        weight_bytes=np.array([layer.weight_bytes for layer in ls], dtype=np.float64),
        conv=np.array([float(layer.kind == "conv") for layer in ls], dtype=np.float64),
        elements=np.array(
            [max(layer.read_bytes, layer.write_bytes, BYTES_PER_VALUE) / BYTES_PER_VALUE for layer in ls],
            dtype=np.float64,
        ),
        kernels=np.array([float(KERNELS.get(layer.kind, 2)) for layer in ls], dtype=np.float64),
        fusable=np.array([float(layer.kind in FUSED_KINDS) for layer in ls], dtype=np.float64),
        castable=np.array([float(layer.kind in CAST_KINDS) for layer in ls], dtype=np.float64),
    )


def _sixteen_bit(precision: str) -> bool:
    return precision.lower().startswith(("bf16", "fp16"))


# GPUs whose tensor cores run FP32 convolutions as TF32, which cuDNN does by default in PyTorch
# (torch.backends.cudnn.allow_tf32) and TensorFlow >= 2.4: Ampere and later. Their dense TF32 peak is
# half the dense FP16 tensor peak (A100: 156 vs 312 TFLOP/s; H100 SXM: 495 vs 989).
TF32_GPUS = frozenset({"a100", "a100-80gb", "h100", "h200", "l4", "b200", "rtx-pro-6000"})


def _peaks(gpu: Gpu, precision: str, conv: FloatArray) -> tuple[FloatArray, float]:
    """(per-layer FLOP/s, bytes/s scale) of a precision: 16-bit uses the tensor peak and moves half the
    bytes; FP32 convolutions use the TF32 tensor peak where the GPU has one."""
    fp32 = gpu.fp32_tflops * 1e12
    if _sixteen_bit(precision) and gpu.fp16_tflops > 0:
        return np.full_like(conv, gpu.fp16_tflops * 1e12), 2.0
    if gpu.key in TF32_GPUS and gpu.fp16_tflops > 0:
        return np.where(conv > 0, max(fp32, gpu.fp16_tflops * 1e12 / 2), fp32), 1.0
    return np.full_like(conv, fp32), 1.0


@dataclass(frozen=True)
class StepTimeFn:
    """t(b) = smooth max(host, sum_l (b + h_l) max(c_l, m_l) + w_l), vectorised over batches."""

    host_s: float
    c: FloatArray
    m: FloatArray
    w: FloatArray
    h: FloatArray  # per-layer half-occupancy batch
    overlap: float = SMOOTH_MAX_P

    @functools.cached_property
    def _slope(self) -> FloatArray:
        return np.asarray(np.maximum(self.c, self.m), dtype=np.float64)

    def gpu_s(self, batch: npt.ArrayLike) -> FloatArray:
        b = np.atleast_1d(np.asarray(batch, dtype=np.float64))
        per_example = float(self._slope.sum())
        fixed = float((self._slope * self.h).sum() + self.w.sum())
        return np.asarray(b * per_example + fixed, dtype=np.float64)

    def __call__(self, batch: npt.ArrayLike) -> FloatArray:
        g = self.gpu_s(batch)
        p = self.overlap
        return np.asarray((self.host_s**p + g**p) ** (1 / p), dtype=np.float64)

    def at(self, batch: float) -> float:
        return float(self(batch)[0])

    def table(self, max_batch: int) -> FloatArray:
        """Step times for batches 1..max_batch (index i holds batch i + 1)."""
        return self(np.arange(1, max_batch + 1, dtype=np.float64))

    def layer_s(self, batch: float) -> tuple[FloatArray, FloatArray]:
        """Per-layer (compute seconds, memory seconds) of one step at this batch."""
        occ = batch + self.h
        return self.c * occ, self.m * occ + self.w


@dataclass(frozen=True)
class StepBasis:
    """Everything of a step's time but the efficiencies: the network, the GPU's peaks at a precision, the runtime's
    fusion and kernel count. A calibration fit evaluates thousands of efficiencies on each measured row's basis."""

    arrays: LayerArrays
    gpu: Gpu
    flops: FloatArray  # per-layer FLOP/s peak (_peaks)
    byte_scale: float
    act: FloatArray  # activation bytes a step moves (fused layers' taken out)
    kernels: float

    def with_eff(self, eff: Efficiency) -> StepTimeFn:
        bw = eff.eff_memory * self.gpu.memory_bw_gbs * 1e9 * self.byte_scale
        c = TRAINING_FACTOR * self.arrays.flops / (eff.eff_compute * self.flops)
        m = TRAINING_FACTOR * self.act / bw
        w = WEIGHT_TRAFFIC_FACTOR * self.arrays.weight_bytes / bw
        h = eff.half_batch_for(self.gpu) * REFERENCE_ELEMENTS / self.arrays.elements
        return StepTimeFn(eff.host_s(self.kernels), c, m, w, h, eff.overlap)


def step_basis(arrays: LayerArrays, gpu: Gpu, precision: str = "fp32", runtime: str = DEFAULT_RUNTIME) -> StepBasis:
    flops, byte_scale = _peaks(gpu, precision, arrays.conv)
    fused = runtime.split("+")[0] in FUSING_RUNTIMES
    act = arrays.act_bytes * (1.0 - arrays.fusable) if fused else arrays.act_bytes
    return StepBasis(arrays, gpu, flops, byte_scale, act, arrays.kernel_count(runtime, precision))


def build_step_fn(
    arrays: LayerArrays, gpu: Gpu, eff: Efficiency, precision: str = "fp32", runtime: str = DEFAULT_RUNTIME
) -> StepTimeFn:
    return step_basis(arrays, gpu, precision, runtime).with_eff(eff)
