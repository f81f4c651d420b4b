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
with ``compute.PRIOR_WEIGHT``, as ``calibration._fit_joint`` does; a machine with fewer than
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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.costmodel.compute import PRIOR_WEIGHT, Efficiency, layer_arrays, model_profile, prior_for
from orchestrator.costmodel.crossgpu import (
    ClassWork,
    Efficiencies,
    FloatArray,
    PrecisionError,
    arch_gpu,
    check_precision,
    class_work,
    gpu_parts,
    smooth_max,
)
from orchestrator.costmodel.machine_fit import OVERLAP, Fits, MachineFit, fit_for
from orchestrator.costmodel.profiles import UnknownModelError
from orchestrator.costmodel.stepmodel import machine_curve

__all__ = ["MIN_POINTS", "OVERLAP", "Fits", "MachineFit", "Sample", "fit_for", "fit_machines", "fit_runtimes",
           "machine_host_share", "machine_step_s", "sample"]

MIN_POINTS = 3  # rows of other models on one machine before its host is fitted
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


def fit_runtimes(rows: Sequence[tuple[str, str, str, str, int, float]]
                 ) -> dict[str, dict[tuple[str, str], MachineFit]]:
    """Machine fits per runtime label of measured steps ``(model, gpu, runtime, precision, batch, step_s)``
    of eager PyTorch (the form was fitted and held out on eager steps only); a row whose model has no profile
    here, whose GPU has no architecture row or whose precision the roofline does not know is skipped."""
    samples: dict[str, list[Sample]] = {}
    for model, gpu, runtime, precision, batch, step_s in rows:
        if runtime.split("+")[0] != "pytorch-eager":
            continue
        try:
            prec, key = check_precision(precision), arch_gpu(gpu).key
            kernels = layer_arrays(model).kernel_count(runtime, prec)
            work = class_work(model_profile(model))
        except (KeyError, PrecisionError, UnknownModelError):
            continue
        samples.setdefault(runtime, []).append(sample(work, kernels, key, prec, batch, step_s))
    out = {rt: fit_machines(s, prior_for(rt)) for rt, s in sorted(samples.items())}
    return {rt: fits for rt, fits in out.items() if fits}


def machine_step_s(work: ClassWork, kernels: float, gpu: str, precision: str, batch: int, fits: Fits,
                   prior: Efficiency, eff: Efficiencies | None = None) -> float:
    """The model's step on one machine: its fit (or its architecture's, ``fit_for``) where there is one
    (``stepmodel.machine_curve``, the planner's assembly), else the runtime prior's host and the committed GPU
    time. The fits' held-out form, on a model's work without a profile; ``model predict --torch`` takes
    ``stepmodel.MachineFitStep``, as ``plan`` does."""
    f = fit_for(fits, gpu, precision)
    if f is not None:
        return machine_curve(work, kernels, gpu, f, precision, eff).at(float(batch))
    c, m, d = gpu_parts(work, gpu, precision, batch, eff)
    return smooth_max(prior.host_s(kernels), c + m + d)


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

