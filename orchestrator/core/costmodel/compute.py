"""Compute model: one worker's step time from the layer profile, the GPU's specs and the runtime.

Real GPUs show two regimes (data/measurements: eager ResNet-32 on an H100 takes ~13 ms a step from
batch 32 to 512, then 20.6 ms at 1024 and 38.5 ms at 2048):

    host(m)    = overhead_s + overhead_per_layer_s * layers(m)          # framework / kernel launches
    gpu(m,g,b) = sum_l max( c_l * (b + half_batch),  m_l * b + w_l )    # occupancy-limited roofline
    c_l = 3 F_l / (eff_compute * peak_g),  m_l = 3 A_l / (eff_memory * bw_g),  w_l = 3 W_l / (eff_memory * bw_g)
    step       = (host^P + gpu^P)^(1/P)                                  # P: how far host and GPU overlap

* ``host``: the per-step runtime overhead: a fixed part (session run / Python step, optimizer launch)
  and a part per layer (each layer launches kernels forward and backward). It depends on the framework
  and runtime (TF1 graph, Keras/XLA, PyTorch eager, torch.compile), which is why the runtime is a
  calibration dimension.
* per-example compute that saturates with occupancy: a layer's arithmetic at batch ``b`` runs at
  ``eff_compute * peak * b / (b + half_batch)``, i.e. a small batch leaves most of the GPU idle;
  ``half_batch`` is the batch at which half the GPU is busy (bigger GPUs need bigger batches).
* FP32 convolutions run on TF32 tensor cores on Ampere and later GPUs (``TF32_GPUS``; the frameworks'
  default), so their compute peak is the TF32 one; 16-bit precisions use the FP16/BF16 tensor peak.
* memory-bound layers (batch norm, ReLU, adds) move their activations and weights at ``eff_memory`` of
  the datasheet bandwidth; forward + backward is ~3x the forward work for FLOPs and traffic alike.
* the two overlap (the host enqueues kernels asynchronously), so the step is a smooth maximum; the
  exponent ``P`` (``Efficiency.overlap``, prior 8: within ~9% of a hard max where the two are equal)
  is a runtime property, fitted where a batch curve has a middle point (``calibration._has_curve``):
  P = 1 means host and GPU time add (a runtime that waits for the GPU between its host phases).

Efficiencies are fractions of the datasheet (``<= 1``, enforced); calibration fits them per GPU x
runtime (x model, for jobs). Communication (PS / all-reduce) is in ``comm.py``; memory in ``memory.py``.
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

from orchestrator.core.catalog import Catalog, Gpu, load_catalog
from orchestrator.core.costmodel.profiles import get_profile

FloatArray = npt.NDArray[np.float64]

TRAINING_FACTOR = 3.0  # forward + backward ~= 3x forward (FLOPs and activation traffic)
WEIGHT_TRAFFIC_FACTOR = 3.0  # weights read forward and backward, gradient written once
SMOOTH_MAX_P = 8.0
HALF_BATCH_PER_TFLOP = 2.5  # ASSUMPTION (prior): parallel work needed to fill a GPU grows with its peak
DEFAULT_RUNTIME = "tf1-graph"  # the project's TensorFlow PS job
RUNTIMES = ("tf1-graph", "keras-xla", "pytorch-eager", "torch-compile")


def runtime_key(runtime: str, precision: str = "fp32") -> str:
    """Calibration key of a runtime and precision: ``pytorch-eager`` or ``pytorch-eager+bf16``."""
    p = precision.lower().split("-")[0]
    return runtime if p in ("", "fp32", "tf32") else f"{runtime}+{p}"


@dataclass(frozen=True)
class Efficiency:
    """Fitted constants of one GPU x runtime: fractions of the datasheet peaks, and the host overhead."""

    eff_compute: float
    eff_memory: float
    overhead_s: float
    overhead_per_layer_s: float = 0.0
    half_batch: float | None = None  # None: the prior, HALF_BATCH_PER_TFLOP x the GPU's FP32 TFLOP/s
    overlap: float = SMOOTH_MAX_P  # blend exponent of host and GPU time: 1 = they add, large = they overlap

    def __post_init__(self) -> None:
        if not (0 < self.eff_compute <= 1 and 0 < self.eff_memory <= 1):
            raise ValueError(f"implausible efficiency {self}: efficiencies must be in (0, 1]")
        if not 1.0 <= self.overlap <= 64.0:
            raise ValueError(f"implausible efficiency {self}: overlap must be in [1, 64]")
        if self.overhead_s < 0 or self.overhead_per_layer_s < 0 or (self.half_batch or 0) < 0:
            raise ValueError(f"implausible efficiency {self}: overheads and half_batch must be >= 0")

    def half_batch_for(self, gpu: Gpu) -> float:
        return HALF_BATCH_PER_TFLOP * gpu.fp32_tflops if self.half_batch is None else self.half_batch

    def host_s(self, layers: int) -> float:
        return self.overhead_s + self.overhead_per_layer_s * layers

    def to_dict(self) -> dict[str, float | None]:
        return {
            "eff_compute": self.eff_compute,
            "eff_memory": self.eff_memory,
            "overhead_s": self.overhead_s,
            "overhead_per_layer_s": self.overhead_per_layer_s,
            "half_batch": self.half_batch,
            "overlap": self.overlap,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Efficiency:
        hb = d.get("half_batch")
        return cls(
            float(d["eff_compute"]),
            float(d["eff_memory"]),
            float(d["overhead_s"]),
            float(d.get("overhead_per_layer_s") or 0.0),
            None if hb is None else float(hb),
            float(d.get("overlap") or SMOOTH_MAX_P),
        )


# PRIORS, used where no measurement constrains a parameter. Physical reasoning, not fits: a kernel
# launch costs ~5-10 us of host time and a training step launches ~8 kernels a layer (forward,
# backward, optimizer) in eager PyTorch; TF1's executor dispatches ops at ~10 us each but runs a
# session call (feed, fetch, PS round trips) of a few ms; XLA fuses most element-wise layers; FP32
# training of small CNNs reaches ~40% of the datasheet FLOP/s and ~60% of the bandwidth.
RUNTIME_PRIORS: dict[str, Efficiency] = {
    "tf1-graph": Efficiency(0.4, 0.6, 0.005, 40e-6),
    "keras-xla": Efficiency(0.4, 0.6, 0.002, 10e-6),
    "pytorch-eager": Efficiency(0.4, 0.6, 0.002, 80e-6),
    "torch-compile": Efficiency(0.4, 0.6, 0.004, 80e-6),
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
    source: str = "runtime priors (no measurements): see orchestrator/core/costmodel/compute.py RUNTIME_PRIORS"
    mape: float | None = None  # held-out error of the fit, if known
    points: Mapping[str, int] = field(default_factory=dict)  # measured points behind each key
    emulated: bool = False  # fitted on the local provider's emulated GPUs: never used for real ones
    local_host: Mapping[str, float] = field(default_factory=dict)  # this host's figures fitted on local jobs

    def lookup(self, gpu: str, runtime: str = DEFAULT_RUNTIME, model: str | None = None) -> tuple[str, Efficiency]:
        g = gpu.lower()
        keys = ([f"{g}/{runtime}/{model}"] if model else []) + [f"{g}/{runtime}", f"*/{runtime}"]
        if runtime == DEFAULT_RUNTIME:
            keys.append(g)
        for k in keys:
            if k in self.per_gpu:
                return k, self.per_gpu[k]
        if runtime == DEFAULT_RUNTIME:
            return "default", self.default
        return f"prior:{runtime}", prior_for(runtime)

    def for_gpu(self, gpu: str, runtime: str = DEFAULT_RUNTIME, model: str | None = None) -> Efficiency:
        return self.lookup(gpu, runtime, model)[1]

    def describe(self, gpu: str, runtime: str = DEFAULT_RUNTIME, model: str | None = None) -> str:
        key, _ = self.lookup(gpu, runtime, model)
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
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        return cls.from_dict(json.loads(text))

    def save(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")


PRIORS_ONLY = Calibration()


def _default_calibration() -> Calibration:
    """data/calibration.json: the fit to every real point in data/measurements (regenerate with
    ``orchestrator model calibrate data/measurements --name measured --out data/calibration.json``);
    the runtime priors if it is missing or unreadable."""
    from orchestrator.core.paths import data_dir

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


@dataclass(frozen=True)
class LayerArrays:
    """Per-layer totals of a profile as arrays (per example, forward)."""

    flops: FloatArray
    act_bytes: FloatArray  # read + write
    weight_bytes: FloatArray
    conv: FloatArray  # 1.0 for convolutions (tensor cores at TF32 on GPUs that have them), else 0.0

    @property
    def layers(self) -> int:
        return len(self.flops)


@functools.cache
def layer_arrays(model: str) -> LayerArrays:
    prof = get_profile(model)
    return LayerArrays(
        flops=np.array([layer.flops for layer in prof.layers], dtype=np.float64),
        act_bytes=np.array([layer.read_bytes + layer.write_bytes for layer in prof.layers], dtype=np.float64),
        weight_bytes=np.array([layer.weight_bytes for layer in prof.layers], dtype=np.float64),
        conv=np.array([float(layer.kind == "conv") for layer in prof.layers], dtype=np.float64),
    )


# GPUs whose tensor cores run FP32 convolutions as TF32, which cuDNN does by default in PyTorch
# (torch.backends.cudnn.allow_tf32) and TensorFlow >= 2.4: Ampere and later. Their dense TF32 peak is
# half the dense FP16 tensor peak (A100: 156 vs 312 TFLOP/s; H100 SXM: 495 vs 989).
TF32_GPUS = frozenset({"a100", "a100-80gb", "h100", "h200", "l4", "b200", "rtx-pro-6000"})


def _peaks(gpu: Gpu, precision: str, conv: FloatArray) -> tuple[FloatArray, float]:
    """(per-layer FLOP/s, bytes/s scale) of a precision: 16-bit uses the tensor peak and moves half the
    bytes; FP32 convolutions use the TF32 tensor peak where the GPU has one."""
    fp32 = gpu.fp32_tflops * 1e12
    if precision.lower().startswith(("bf16", "fp16")) and gpu.fp16_tflops > 0:
        return np.full_like(conv, gpu.fp16_tflops * 1e12), 2.0
    if gpu.key in TF32_GPUS and gpu.fp16_tflops > 0:
        return np.where(conv > 0, max(fp32, gpu.fp16_tflops * 1e12 / 2), fp32), 1.0
    return np.full_like(conv, fp32), 1.0


@dataclass(frozen=True)
class StepTimeFn:
    """t(b) = smooth max(host, sum_l max(c_l (b + h), m_l b + w_l)), vectorised over batches."""

    host_s: float
    c: FloatArray
    m: FloatArray
    w: FloatArray
    half_batch: float
    overlap: float = SMOOTH_MAX_P

    def gpu_s(self, batch: npt.ArrayLike) -> FloatArray:
        b = np.atleast_1d(np.asarray(batch, dtype=np.float64))
        comp = np.outer(b + self.half_batch, self.c)
        mem = np.outer(b, self.m) + self.w
        return np.asarray(np.maximum(comp, mem).sum(axis=1), dtype=np.float64)

    def __call__(self, batch: npt.ArrayLike) -> FloatArray:
        g = self.gpu_s(batch)
        p = self.overlap
        return np.asarray((self.host_s**p + g**p) ** (1 / p), dtype=np.float64)

    def at(self, batch: float) -> float:
        return float(self(batch)[0])

    def table(self, max_batch: int) -> FloatArray:
        """Step times for batches 1..max_batch (index i holds batch i + 1)."""
        return self(np.arange(1, max_batch + 1, dtype=np.float64))


def build_step_fn(arrays: LayerArrays, gpu: Gpu, eff: Efficiency, precision: str = "fp32") -> StepTimeFn:
    flops, byte_scale = _peaks(gpu, precision, arrays.conv)
    bw = eff.eff_memory * gpu.memory_bw_gbs * 1e9 * byte_scale
    c = TRAINING_FACTOR * arrays.flops / (eff.eff_compute * flops)
    m = TRAINING_FACTOR * arrays.act_bytes / bw
    w = WEIGHT_TRAFFIC_FACTOR * arrays.weight_bytes / bw
    return StepTimeFn(eff.host_s(arrays.layers), c, m, w, eff.half_batch_for(gpu), eff.overlap)


def step_fn(
    model: str,
    gpu: str,
    calibration: Calibration | None = None,
    catalog: Catalog | None = None,
    runtime: str = DEFAULT_RUNTIME,
    precision: str = "fp32",
) -> StepTimeFn:
    cat = catalog or load_catalog()
    g = cat.gpu(gpu)
    eff = (calibration or DEFAULT_CALIBRATION).for_gpu(g.key, runtime_key(runtime, precision), model)
    return build_step_fn(layer_arrays(model), g, eff, precision)


def step_time(
    model: str,
    gpu: str,
    batch: int,
    calibration: Calibration | None = None,
    catalog: Catalog | None = None,
    runtime: str = DEFAULT_RUNTIME,
    precision: str = "fp32",
) -> float:
    """Compute-only step time in seconds (no parameter-server or all-reduce traffic)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return step_fn(model, gpu, calibration, catalog, runtime, precision).at(float(batch))


def layer_times(
    model: str, gpu: str, batch: int, calibration: Calibration | None = None, catalog: Catalog | None = None
) -> tuple[FloatArray, FloatArray]:
    """Per-layer (compute seconds, memory seconds) of one training step, in profile order."""
    cat = catalog or load_catalog()
    g = cat.gpu(gpu)
    fn = step_fn(model, g.key, calibration, cat)
    return fn.c * (batch + fn.half_batch), fn.m * batch + fn.w
