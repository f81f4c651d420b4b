"""One machine's fitted step of eager PyTorch: host time plus GPU-time scales over the committed efficiencies.

What ``host_fit`` fits per GPU x precision on other models' measured steps, and what both ``model predict
--torch`` and ``plan`` (a user's model, through ``Calibration.machine_fit``) apply:

    step = overhead_s + per_kernel_s x kernels
           + compute_scale x compute + memory_scale x memory + depthwise_scale x depthwise

(``smooth_max`` with ``OVERLAP``; 1 = a sum), ``compute`` / ``memory`` / ``depthwise``: ``crossgpu.gpu_parts``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from orchestrator.costmodel.crossgpu import arch_gpu, smooth_max

# Smooth-max exponent of host and GPU time: 1 = they add. Held out on the torchvision table, adding beats
# the runtime prior's near-max (8): 9.4% vs 12.5% (model held out), 13.2% vs 18.7% (sub-family held out);
# eager PyTorch at a small batch waits on the GPU between its host phases more than it overlaps them.
OVERLAP = 1.0


@dataclass(frozen=True)
class MachineFit:
    overhead_s: float
    per_kernel_s: float
    compute_scale: float
    memory_scale: float
    points: int
    depthwise_scale: float = 1.0

    def host_s(self, kernels: float) -> float:
        return self.overhead_s + self.per_kernel_s * kernels

    def step_s(self, kernels: float, compute_s: float, memory_s: float, depthwise_s: float = 0.0) -> float:
        gpu = self.compute_scale * compute_s + self.memory_scale * memory_s + self.depthwise_scale * depthwise_s
        return smooth_max(self.host_s(kernels), gpu, OVERLAP)

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MachineFit:
        return cls(float(d["overhead_s"]), float(d["per_kernel_s"]), float(d["compute_scale"]),
                   float(d["memory_scale"]), int(d.get("points", 0)), float(d.get("depthwise_scale", 1.0)))


Fits = Mapping[tuple[str, str], MachineFit]


def gpu_precision(key: str) -> tuple[str, str]:
    """``h100/fp32`` -> ("h100", "fp32"): a machine fit's key as a calibration file writes it."""
    gpu, _, precision = str(key).partition("/")
    return gpu, precision


def fit_for(fits: Fits, gpu: str, precision: str) -> MachineFit | None:
    """This GPU x precision's fit; else that of the measured GPU of the same architecture with the most rows;
    else the measured machines' host at the precision with the committed GPU efficiencies; else their host at
    the other precisions (its architecture's machines first); None without any fit.

    The last level: a machine's host time is its CPU's and software's, whatever the tensors' precision. Held
    out (bench/plan_user_model.py, fits of an H100 at fp32 / bf16 only): tf32 / amp steps of torchvision CNNs
    on an A100 and an H200, 25.8% / 35.0% / 14.7% / 12.9% mean error, against 34.7% / 54.7% / 19.6% / 54.2%
    with the runtime's fitted overhead."""
    own = fits.get((gpu, precision))
    if own is not None:
        return own
    arch = arch_gpu(gpu).arch
    same = [f for (g, p), f in sorted(fits.items()) if p == precision and arch_gpu(g).arch == arch]
    if same:
        return max(same, key=lambda f: f.points)
    others = [f for (g, p), f in sorted(fits.items()) if p == precision]
    if not others:
        others = [f for (g, _), f in sorted(fits.items()) if arch_gpu(g).arch == arch] or list(fits.values())
    if not others:
        return None
    # no machine of its architecture: the measured machines' host time (geometric mean), the GPU's committed
    # efficiencies (scales 1)
    o = float(np.exp(np.mean([np.log(f.overhead_s) for f in others])))
    k = float(np.exp(np.mean([np.log(f.per_kernel_s) for f in others])))
    return MachineFit(o, k, 1.0, 1.0, 0)
