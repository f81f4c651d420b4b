"""Per-machine calibration of ``model predict --torch``: each GPU x precision's host time and GPU-time
scales, fitted on the measured steps of OTHER models in the user's measurements file.

A PyTorch eager step at a small batch is often host-bound: every kernel's launch, dispatch and autograd
bookkeeping costs the machine's CPU and software stack (0.1-0.2 ms a layer on 2019-20 machines, 3-5x the
runtime prior), and that cost belongs to the machine, not to the GPU's datasheet. Only other models
measured on that machine can teach it, so per GPU x precision (the runtime key of ``calibration.py``):

    step = overhead_s + per_kernel_s x kernels
           + compute_scale x compute + memory_scale x memory + depthwise_scale x depthwise

(``smooth_max`` with ``OVERLAP``; 1 = a sum.) ``compute`` / ``memory``: the model's GPU seconds in its
compute- / memory-bound layers, ``depthwise`` in its depthwise convolutions (``crossgpu.gpu_parts``, the
committed efficiencies). Depthwise convolutions have kernels of their own whose speed against the roofline
varies by machine far more than the other layers': on the torchvision table, a Titan Xp running 16-bit
tensors (Pascal: no fast fp16) takes 1.4-2.2x its fp32 step on MNASNet and MobileNet-v2, 1.0-1.3x on the
CNNs without depthwise layers. Least squares in log time, each parameter pulled towards its prior (the
runtime's ``RUNTIME_PRIORS`` host; scales 1; the depthwise scale towards the machine's memory scale, so a
machine whose rows hold no depthwise layer scales those layers as its other memory-bound ones, as before)
with ``calibration.PRIOR_WEIGHT``, as ``calibration._fit_joint`` does; a machine with fewer than
``MIN_POINTS`` rows keeps the priors.
Held out on 32 torchvision CNNs x 4 GPUs (bench/cross_gpu_torchvision.py, "calibrated"): the model held out,
8.1% mean and every GPU pair x precision under 15% (8.9% and 19 of 24 before the depthwise scale).

A GPU with no rows of its own (``fit_for``) takes the fit of a measured GPU of the same architecture at that
precision: the architecture's efficiencies and the software's host time are what a fit corrects, and they carry.
With none of its architecture, it takes the measured machines' host time (geometric mean) and the committed GPU
efficiencies: the runtime prior's host is further from any real machine than another machine is. Held out:
bench/hopper_transfer.py (fitted on an H100's CIFAR ResNets, the H200's torchvision steps at fp32 / bf16: 27.8%
mean error, 43.4% with the prior) and bench/cross_gpu_torchvision.py "calibrated B" (the target GPU's rows out:
20.6% mean, 52.8% with the prior).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.core.costmodel.calibration import PRIOR_WEIGHT
from orchestrator.core.costmodel.compute import Efficiency
from orchestrator.core.costmodel.crossgpu import ClassWork, Efficiencies, FloatArray, arch_gpu, gpu_parts, smooth_max

MIN_POINTS = 3  # rows of other models on one machine before its host is fitted
# Smooth-max exponent of host and GPU time: 1 = they add. Held out on the torchvision table, adding beats
# the runtime prior's near-max (8): 9.4% vs 12.5% (model held out), 13.2% vs 18.7% (sub-family held out);
# eager PyTorch at a small batch waits on the GPU between its host phases more than it overlaps them.
OVERLAP = 1.0
# Bounds of (overhead_s, per_kernel_s, compute_scale, memory_scale, depthwise_scale).
_LO = np.log(np.array([1e-6, 1e-8, 0.05, 0.05, 0.05]))
_HI = np.log(np.array([10.0, 1e-2, 20.0, 20.0, 20.0]))


@dataclass(frozen=True)
class Sample:
    """One measured step of some model on one machine, with the model's features there."""

    gpu: str  # crossgpu arch key
    precision: str  # crossgpu precision
    kernels: float  # kernels a step launches (compute.LayerArrays.kernel_count)
    compute_s: float
    memory_s: float
    step_s: float
    depthwise_s: float = 0.0


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


Fits = Mapping[tuple[str, str], MachineFit]


def sample(work: ClassWork, kernels: float, gpu: str, precision: str, batch: int, step_s: float,
           eff: Efficiencies | None = None) -> Sample:
    c, m, d = gpu_parts(work, gpu, precision, batch, eff)
    return Sample(gpu, precision, kernels, c, m, step_s, d)


def _fit_one(rows: Sequence[Sample], prior: Efficiency) -> MachineFit:
    from scipy.optimize import least_squares  # lazy: SciPy only to fit, never for the CLI to start

    k = np.array([r.kernels for r in rows])
    c = np.array([r.compute_s for r in rows])
    m = np.array([r.memory_s for r in rows])
    d = np.array([r.depthwise_s for r in rows])
    t = np.array([r.step_s for r in rows])
    x0 = np.clip(np.log([max(prior.overhead_s, 1e-6), max(prior.overhead_per_kernel_s, 1e-8), 1.0, 1.0, 1.0]),
                 _LO + 1e-9, _HI - 1e-9)

    def fun(x: FloatArray) -> FloatArray:
        o, pk, cs, ms, ds = np.exp(x)
        host, g = o + pk * k, cs * c + ms * m + ds * d
        pred = (host**OVERLAP + g**OVERLAP) ** (1 / OVERLAP)
        # the depthwise scale is pulled towards the machine's memory scale: without depthwise rows, those
        # layers scale as its other memory-bound ones
        pull = np.concatenate([x[:4] - x0[:4], x[4:] - x[3:4]])
        return np.concatenate([np.log(pred / t), PRIOR_WEIGHT * pull])

    # two starts: the prior, and a host-bound machine (the cost surface bends where host and GPU cross)
    starts = [x0, np.clip(x0 + np.log([1.0, 5.0, 1.0, 1.0, 1.0]), _LO + 1e-9, _HI - 1e-9)]
    best = min((least_squares(fun, s, bounds=(_LO, _HI)) for s in starts), key=lambda sol: float(sol.cost))
    o, pk, cs, ms, ds = (float(v) for v in np.exp(best.x))
    return MachineFit(o, pk, cs, ms, len(rows), ds)


def fit_machines(samples: Sequence[Sample], prior: Efficiency) -> dict[tuple[str, str], MachineFit]:
    """One fit per GPU x precision with ``MIN_POINTS`` rows or more."""
    by: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        by.setdefault((s.gpu, s.precision), []).append(s)
    return {key: _fit_one(rows, prior) for key, rows in sorted(by.items()) if len(rows) >= MIN_POINTS}


def fit_for(fits: Fits, gpu: str, precision: str) -> MachineFit | None:
    """This GPU x precision's fit; else that of the measured GPU of the same architecture with the most rows;
    else the measured machines' host at the precision with the committed GPU efficiencies; else None."""
    own = fits.get((gpu, precision))
    if own is not None:
        return own
    arch = arch_gpu(gpu).arch
    same = [f for (g, p), f in sorted(fits.items()) if p == precision and arch_gpu(g).arch == arch]
    if same:
        return max(same, key=lambda f: f.points)
    others = [f for (g, p), f in sorted(fits.items()) if p == precision]
    if not others:
        return None
    # no machine of its architecture: the measured machines' host time (geometric mean), the GPU's committed
    # efficiencies (scales 1)
    o = float(np.exp(np.mean([np.log(f.overhead_s) for f in others])))
    k = float(np.exp(np.mean([np.log(f.per_kernel_s) for f in others])))
    return MachineFit(o, k, 1.0, 1.0, 0)


def machine_step_s(work: ClassWork, kernels: float, gpu: str, precision: str, batch: int, fits: Fits,
                   prior: Efficiency, eff: Efficiencies | None = None) -> float:
    """The model's step on one machine: its fit (or its architecture's, ``fit_for``) where there is one, else the
    runtime prior's host and the committed GPU time (what ``model predict --torch`` computes without other
    models' rows)."""
    c, m, d = gpu_parts(work, gpu, precision, batch, eff)
    f = fit_for(fits, gpu, precision)
    return f.step_s(kernels, c, m, d) if f else smooth_max(prior.host_s(kernels), c + m + d)


def machine_host_share(work: ClassWork, kernels: float, gpu: str, precision: str, batch: int, fits: Fits,
                       prior: Efficiency, eff: Efficiencies | None = None) -> float:
    """The host's share of ``machine_step_s`` (its log-derivative in the host time): what
    ``crossgpu.transfer_weight`` weighs a measured step's departure from the model by."""
    c, m, d = gpu_parts(work, gpu, precision, batch, eff)
    f = fit_for(fits, gpu, precision)
    if f is None:
        host, g, p = prior.host_s(kernels), c + m + d, 8.0  # crossgpu.smooth_max's default
    else:
        host, g, p = f.host_s(kernels), f.compute_scale * c + f.memory_scale * m + f.depthwise_scale * d, OVERLAP
    return float(host**p / (host**p + g**p)) if host + g > 0 else 1.0

