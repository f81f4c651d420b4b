"""Compute model: a worker's step time from the layer profile and the GPU's specs (a per-layer roofline).

    step(m, g, b) = overhead_g + sum_l max( 3 * F_l * b / (eff_compute_g * peak_flops_g),
                                            bytes_l(b) / (eff_memory_g * bandwidth_g) )
    bytes_l(b)    = 3 * b * (read_l + write_l) + 3 * weight_l

``F_l`` is the layer's forward FLOPs per example; forward + backward is ~3x the forward work (the
backward pass computes the input and the weight gradients), for FLOPs and for activation traffic
alike; weights are read in the forward and the backward pass and their gradient is written once.
Peak FLOP/s is the datasheet FP32 figure (TensorFlow trains in FP32 by default); bandwidth is the
datasheet memory bandwidth. The efficiencies and the per-step overhead (input pipeline, kernel
launches, session run) are what calibration fits.

As a function of ``b`` each term is the maximum of two linear functions, so the step time is convex,
piecewise linear and strictly increasing in the batch: :class:`StepTimeFn` keeps it as sorted
breakpoints, which makes tables of step times over every batch size cheap (the batch split uses them).
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

from orchestrator.catalog import Catalog, Gpu, load_catalog
from orchestrator.costmodel.profiles import get_profile

FloatArray = npt.NDArray[np.float64]

TRAINING_FACTOR = 3.0  # forward + backward ~= 3x forward (FLOPs and activation traffic)
WEIGHT_TRAFFIC_FACTOR = 3.0  # weights read forward and backward, gradient written once


@dataclass(frozen=True)
class Efficiency:
    """Fraction of the datasheet peak reached, and a fixed per-step overhead, for one GPU family."""

    eff_compute: float
    eff_memory: float
    overhead_s: float

    def __post_init__(self) -> None:
        if not (0 < self.eff_compute <= 1.5 and 0 < self.eff_memory <= 1.5 and self.overhead_s >= 0):
            raise ValueError(f"implausible efficiency {self}: efficiencies in (0, 1.5], overhead >= 0")

    def to_dict(self) -> dict[str, float]:
        return {"eff_compute": self.eff_compute, "eff_memory": self.eff_memory, "overhead_s": self.overhead_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Efficiency:
        return cls(float(d["eff_compute"]), float(d["eff_memory"]), float(d["overhead_s"]))


# ASSUMPTION, used when no measurements exist: TensorFlow FP32 training of small CNNs reaches about a
# third of the datasheet FLOP/s and ~60% of the memory bandwidth, plus ~5 ms of per-step overhead.
DEFAULT_EFFICIENCY = Efficiency(eff_compute=0.35, eff_memory=0.6, overhead_s=0.005)


@dataclass(frozen=True)
class NetParams:
    """Communication-model constants (see ``comm.py``); calibrated from cluster measurements if given.

    ASSUMPTIONS (defaults): gRPC reaches 70% of a NIC's nominal egress; each push or pull round trip
    costs a worker 0.5 ms; the PS spends 20 us of CPU per variable per request (TF sends one tensor per
    RPC); every additional concurrent worker costs the PS 1% of its network efficiency (incast). A round
    trip between zones adds 0.5 ms, between regions of one continent 25 ms, between continents 100 ms.
    """

    net_efficiency: float = 0.7
    request_latency_s: float = 0.5e-3
    ps_cpu_per_variable_s: float = 20e-6
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
    """Efficiencies per GPU family where measurements exist, and a shared default for the others."""

    default: Efficiency = DEFAULT_EFFICIENCY
    per_gpu: Mapping[str, Efficiency] = field(default_factory=dict)
    net: NetParams = field(default_factory=NetParams)
    name: str = "builtin-default"
    source: str = "assumed defaults (eff_compute 0.35, eff_memory 0.6, overhead 5 ms); no measurements"
    mape: float | None = None  # leave-one-GPU-out validation error of the fit, if known

    def for_gpu(self, gpu: str) -> Efficiency:
        return self.per_gpu.get(gpu.lower(), self.default)

    def with_meta(
        self, name: str | None = None, source: str | None = None, mape: float | None = None
    ) -> Calibration:
        return replace(
            self,
            name=name or self.name,
            source=source or self.source,
            mape=self.mape if mape is None else mape,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "mape": self.mape,
            "default": self.default.to_dict(),
            "per_gpu": {k: v.to_dict() for k, v in sorted(self.per_gpu.items())},
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
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        return cls.from_dict(json.loads(text))

    def save(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")


DEFAULT_CALIBRATION = Calibration()


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


@functools.cache
def layer_arrays(model: str) -> LayerArrays:
    prof = get_profile(model)
    return LayerArrays(
        flops=np.array([layer.flops for layer in prof.layers], dtype=np.float64),
        act_bytes=np.array([layer.read_bytes + layer.write_bytes for layer in prof.layers], dtype=np.float64),
        weight_bytes=np.array([layer.weight_bytes for layer in prof.layers], dtype=np.float64),
    )


@dataclass(frozen=True)
class StepTimeFn:
    """t(b) = overhead + sum_l max(c_l b, m_l b + w_l) as sorted breakpoints (vectorised, exact)."""

    overhead_s: float
    breakpoints: FloatArray  # sorted; layer k is compute-bound for b >= breakpoints[k]
    slope_after: FloatArray  # len = len(breakpoints) + 1: total slope with the first j layers compute-bound
    intercept_after: FloatArray

    def __call__(self, batch: npt.ArrayLike) -> FloatArray:
        b = np.asarray(batch, dtype=np.float64)
        j = np.searchsorted(self.breakpoints, b, side="right")
        return np.asarray(
            self.overhead_s + self.slope_after[j] * b + self.intercept_after[j], dtype=np.float64
        )

    def at(self, batch: float) -> float:
        return float(self(batch))

    def table(self, max_batch: int) -> FloatArray:
        """Step times for batches 1..max_batch (index i holds batch i + 1)."""
        return self(np.arange(1, max_batch + 1, dtype=np.float64))


def build_step_fn(arrays: LayerArrays, gpu: Gpu, eff: Efficiency) -> StepTimeFn:
    peak = eff.eff_compute * gpu.fp32_tflops * 1e12
    bw = eff.eff_memory * gpu.memory_bw_gbs * 1e9
    c = TRAINING_FACTOR * arrays.flops / peak
    m = TRAINING_FACTOR * arrays.act_bytes / bw
    w = WEIGHT_TRAFFIC_FACTOR * arrays.weight_bytes / bw
    # max(c b, m b + w): memory-bound below w / (c - m) when c > m, memory-bound for every b otherwise.
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(c > m, w / (c - m), np.inf)
    order = np.argsort(bp, kind="stable")
    bp, c, m, w = bp[order], c[order], m[order], w[order]
    n = len(bp)
    slope = np.empty(n + 1)
    intercept = np.empty(n + 1)
    c_prefix = np.concatenate([[0.0], np.cumsum(c)])
    m_suffix = np.concatenate([np.cumsum(m[::-1])[::-1], [0.0]])
    w_suffix = np.concatenate([np.cumsum(w[::-1])[::-1], [0.0]])
    slope[:] = c_prefix + m_suffix
    intercept[:] = w_suffix
    return StepTimeFn(eff.overhead_s, bp, slope, intercept)


def step_fn(
    model: str, gpu: str, calibration: Calibration | None = None, catalog: Catalog | None = None
) -> StepTimeFn:
    cat = catalog or load_catalog()
    g = cat.gpu(gpu)
    return build_step_fn(layer_arrays(model), g, (calibration or DEFAULT_CALIBRATION).for_gpu(g.key))


def step_time(
    model: str, gpu: str, batch: int, calibration: Calibration | None = None, catalog: Catalog | None = None
) -> float:
    """Compute-only step time in seconds (no parameter-server or all-reduce traffic)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return step_fn(model, gpu, calibration, catalog).at(float(batch))


def layer_times(
    model: str, gpu: str, batch: int, calibration: Calibration | None = None, catalog: Catalog | None = None
) -> tuple[FloatArray, FloatArray]:
    """Per-layer (compute seconds, memory seconds) of one training step, in profile order."""
    cat = catalog or load_catalog()
    g = cat.gpu(gpu)
    eff = (calibration or DEFAULT_CALIBRATION).for_gpu(g.key)
    a = layer_arrays(model)
    comp = TRAINING_FACTOR * a.flops * batch / (eff.eff_compute * g.fp32_tflops * 1e12)
    mem = (TRAINING_FACTOR * a.act_bytes * batch + WEIGHT_TRAFFIC_FACTOR * a.weight_bytes) / (
        eff.eff_memory * g.memory_bw_gbs * 1e9
    )
    return comp, mem
