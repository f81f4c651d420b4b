"""One step-model interface: a worker's step time, its interval and its memory, from one source of physics.

``StepModel.step(profile, gpu, batch, precision, runtime) -> StepTime(mean_s, interval_s, memory_gb)``, and
``curve`` for the vectorised step the batch split searches over. One implementation per source, chosen by
:func:`cost_step_model` from the model's source:

* :class:`CalibratedStep`: a built-in profile, the layer roofline with the calibration's fitted efficiencies
  (``compute.build_step_fn``);
* :class:`OpClassStep`: a user's model by op class (``crossgpu``'s roofline, the runtime's host overhead and the
  GPU's occupancy: :func:`arch_step_fn`);
* :class:`MachineFitStep`: a user's model through a machine fit (``host_fit``: host time and GPU-time scales
  fitted on other models' steps: :func:`machine_step_fn`); ``model predict --torch`` and ``plan`` both call it;
* ``providers.local.step_model.EmulatedStep``: the local provider's emulated GPUs (measured step curves,
  ``providers.local.emulation``, never this cost model), wrapping one of these for the step and memory it
  does not emulate. It lives with the local provider; the cost model never imports it.

Which one stands for a job is chosen once, above the cost model (``providers.local.step_model.step_model_for``,
called by the planning layer, the simulator and the controller), and handed down: the cost model asks the step
model it was given (``wall_clock``, ``time_scale``, ``sleep_s``, ``emulated_s``, ``split_speeds``) instead of
asking the spec's provider. Not given one, the cost model's functions take the cost model's physics
(:data:`COST_STEPS`), as for a cloud job.

A user's model that the calibration measured on a GPU takes the calibrated step there (its own figure beats any
transfer); a user's model with a machine fit falls back to its op-class step on a GPU no fit covers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from orchestrator.costmodel.compute import (
    DEFAULT_CALIBRATION,
    DEFAULT_RUNTIME,
    REFERENCE_ELEMENTS,
    Calibration,
    Efficiency,
    FloatArray,
    LayerArrays,
    StepTimeFn,
    build_step_fn,
    layer_arrays,
    model_profile,
    runtime_key,
)
from orchestrator.costmodel.crossgpu import (
    ClassWork,
    Efficiencies,
    PrecisionError,
    arch_gpu,
    check_precision,
    class_work,
    layer_seconds,
    load_efficiencies,
    none_interval,
)
from orchestrator.costmodel.machine_fit import OVERLAP, Fits, MachineFit, fit_for
from orchestrator.costmodel.measured import measured_points, probed_gpus, through_measured, through_probed
from orchestrator.costmodel.memory import DEFAULT_MEMORY, MemoryParams, memory_bytes
from orchestrator.costmodel.profiles import ModelProfile
from orchestrator.costmodel.profiles.user import is_user_model
from orchestrator.model.catalog import Catalog, Gpu, load_catalog


@dataclass(frozen=True)
class StepTime:
    mean_s: float
    interval_s: tuple[float, float]  # the held-out error of this kind of question around the mean
    memory_gb: float  # one worker's memory at this batch (weights, gradients, optimizer state, activations)


class StepModel(Protocol):
    @property
    def source(self) -> str: ...  # "calibrated", "op-class", "machine-fit", "local-emulation"

    @property
    def calibration(self) -> Calibration: ...

    @property
    def wall_clock(self) -> bool:
        """The figures are wall seconds on this host (the local provider's emulated GPUs: the host's CPU step
        plus the emulated sleep, its measured start-up, boot / ``time_scale``), not a cloud's."""

    @property
    def time_scale(self) -> float:
        """Cloud seconds per wall second of the run (1 on real machines)."""

    def curve(self, profile: str, gpu: str, precision: str, runtime: str) -> StepTimeFn: ...

    def step(self, profile: str, gpu: str, batch: float, precision: str, runtime: str) -> StepTime: ...

    def sleep_s(self, gpu: str | None, batch: int) -> float:
        """The extra seconds a worker of ``gpu`` sleeps a step at ``batch`` (an emulated GPU; 0: none, a CPU role)."""

    def emulated_s(self, gpu: str, batch: float) -> float:
        """The emulated GPU's step at ``batch``, unrounded (a pipeline stage's share of it); 0 on real GPUs."""

    def split_speeds(self, gpus: Sequence[str]) -> list[float] | None:
        """Relative speeds to split a global batch by, in proportion; None: by the step curves (min-max)."""


def question_kind(model: str, gpu: str, runtime: str, calibration: Calibration) -> str:
    """Which held-out error stands for this step (``crossgpu`` interval): measured on this GPU, on another
    GPU, nothing measured. A probe's point of the model counts as measured on its GPU; a GPU predicted through
    the probes of other GPUs (:func:`transfers`) is a question of another GPU."""
    if measured_points(calibration, gpu, runtime, model):
        return "same-gpu"
    kind = _calibrated_kind(model, gpu, runtime, calibration)
    if kind != "same-gpu" and transfers(calibration) and probed_gpus(calibration, runtime, model):
        return "other-gpu"
    return kind


def transfers(calibration: Calibration | None) -> bool:
    """Whether a probe of one GPU moves the prediction of another: not on emulated GPUs, whose step is the host's
    CPU work and a known sleep (``accounting.local_worker_steps``), not a ratio of two GPUs."""
    return calibration is not None and not calibration.emulated


def _calibrated_kind(model: str, gpu: str, runtime: str, calibration: Calibration) -> str:
    key, _ = calibration.lookup(gpu, runtime, model)
    measured = bool(calibration.points.get(key))
    if key.endswith(f"/{model}") and measured:
        return "same-gpu"
    if not is_user_model(model):  # a built-in model: the calibration's points stand for its family
        return "same-gpu" if measured else "other-gpu"
    return "other-gpu" if any(k.endswith(f"/{model}") for k in calibration.points) else "none"


@dataclass(frozen=True)
class CostSteps:
    """What the cost model's implementations share: the step from ``curve``, and the cloud's run around it."""

    calibration: Calibration = DEFAULT_CALIBRATION
    catalog: Catalog | None = None
    memory: MemoryParams = DEFAULT_MEMORY
    source = "cost-model"
    wall_clock = False  # a cloud's seconds: no emulation
    time_scale = 1.0

    def sleep_s(self, gpu: str | None, batch: int) -> float:
        return 0.0

    def emulated_s(self, gpu: str, batch: float) -> float:
        return 0.0

    def split_speeds(self, gpus: Sequence[str]) -> list[float] | None:
        return None

    def gpu(self, gpu: str) -> Gpu:
        return (self.catalog or load_catalog()).gpu(gpu)

    def curve(self, profile: str, gpu: str, precision: str, runtime: str) -> StepTimeFn:
        raise NotImplementedError

    def step(self, profile: str, gpu: str, batch: float, precision: str, runtime: str) -> StepTime:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        mean = self.curve(profile, gpu, precision, runtime).at(float(batch))
        eff = load_efficiencies()
        kind = question_kind(profile, self.gpu(gpu).key, runtime_key(runtime, precision), self.calibration)
        rel = none_interval(eff) if kind == "none" else float(eff.interval[kind])
        memory_gb = memory_bytes(profile, int(batch), self.memory) / 1e9
        return StepTime(mean, (mean / (1 + rel), mean * (1 + rel)), memory_gb)


@dataclass(frozen=True)
class CalibratedStep(CostSteps):
    """A built-in profile (or a user's model measured on this GPU): the calibration's fitted roofline."""

    source = "calibrated"

    def efficiency(self, profile: str, gpu: str, precision: str, runtime: str) -> tuple[str, Efficiency]:
        return self.calibration.lookup(self.gpu(gpu).key, runtime_key(runtime, precision), profile)

    def curve(self, profile: str, gpu: str, precision: str, runtime: str) -> StepTimeFn:
        _, eff = self.efficiency(profile, gpu, precision, runtime)
        return build_step_fn(layer_arrays(profile), self.gpu(gpu), eff, precision, runtime)


@dataclass(frozen=True)
class OpClassStep(CalibratedStep):
    """A user's model by op class, where the calibration has no figure of its own on the GPU."""

    source = "op-class"

    def curve(self, profile: str, gpu: str, precision: str, runtime: str) -> StepTimeFn:
        key, eff = self.efficiency(profile, gpu, precision, runtime)
        if key.endswith(f"/{profile}"):  # measured on this GPU: its own figure
            return super().curve(profile, gpu, precision, runtime)
        return arch_step_fn(model_profile(profile), layer_arrays(profile), self.gpu(gpu), eff, precision, runtime)


@dataclass(frozen=True)
class MachineFitStep(OpClassStep):
    """A user's model through a machine fit: ``fits`` given (``model predict --torch``: fitted on the file's other
    models), else the calibration's at the runtime; the op-class step on a GPU no fit covers."""

    fits: Fits | None = field(default=None)
    source = "machine-fit"

    def machine(self, gpu: str, precision: str, runtime: str) -> MachineFit | None:
        """``machine_fit.fit_for``: the GPU's own fit, its architecture's, or the measured machines' host."""
        fits = self.fits if self.fits is not None else self.calibration.machine_fits(runtime)
        try:
            return fit_for(fits, arch_gpu(gpu).key, check_precision(precision)) if fits else None
        except (KeyError, PrecisionError):
            return None

    def curve(self, profile: str, gpu: str, precision: str, runtime: str) -> StepTimeFn:
        if self.fits is None:  # the calibration's: a GPU of the catalog, which may hold the model's own figure
            key, _ = self.efficiency(profile, gpu, precision, runtime)
            fit = None if key.endswith(f"/{profile}") else self.machine(self.gpu(gpu).key, precision, runtime)
        else:  # given fits (model predict --torch): any GPU with an architecture row
            fit = self.machine(gpu, precision, runtime)
        if fit is None:
            return super().curve(profile, gpu, precision, runtime)
        return machine_step_fn(model_profile(profile), layer_arrays(profile), arch_gpu(gpu).key, fit, precision,
                               runtime)


def cost_step_model(model: str, calibration: Calibration | None = None, catalog: Catalog | None = None,
                    memory: MemoryParams = DEFAULT_MEMORY, runtime: str = DEFAULT_RUNTIME) -> CostSteps:
    """The cost model's implementation for a model: its source decides (a built-in profile, a user's model with a
    machine fit at this runtime, a user's model by op class)."""
    calib = calibration or DEFAULT_CALIBRATION
    if not is_user_model(model):
        return CalibratedStep(calib, catalog, memory)
    if calib.machine_fits(runtime):
        return MachineFitStep(calib, catalog, memory)
    return OpClassStep(calib, catalog, memory)


COST_STEPS: StepModel = CalibratedStep()  # what a cost-model function takes when handed no step model: no emulation


def arch_step_fn(
    profile: ModelProfile, arrays: LayerArrays, gpu: Gpu, eff: Efficiency, precision: str, runtime: str
) -> StepTimeFn:
    """A user's model (its op-class split measured by the profiler) on a GPU from its architecture
    (``crossgpu``: op-class roofline, efficiencies fitted on public measurements); the runtime's host
    overhead and the GPU's occupancy as in ``build_step_fn``."""
    c, m, w = layer_seconds(class_work(profile), arch_gpu(gpu.key), check_precision(precision))
    h = eff.half_batch_for(gpu) * REFERENCE_ELEMENTS / arrays.elements
    return StepTimeFn(eff.host_s(arrays.kernel_count(runtime, precision)), c, m, w, h, eff.overlap)


def machine_step_fn(
    profile: ModelProfile, arrays: LayerArrays, gpu: str, fit: MachineFit, precision: str, runtime: str
) -> StepTimeFn:
    """A user's model on a GPU (an architecture key) through a machine fit (``host_fit``: fitted on other models'
    measured steps): :func:`machine_curve` of its op-class work and its kernels at the runtime."""
    return machine_curve(class_work(profile), arrays.kernel_count(runtime, precision), gpu, fit, precision)


def machine_curve(work: ClassWork, kernels: float, gpu: str, fit: MachineFit, precision: str,
                  eff: Efficiencies | None = None) -> StepTimeFn:
    """The one assembly of a machine-fitted step (the planner's, ``model predict --torch``'s and the fits' own,
    ``host_fit.machine_step_s``): each layer's roofline time scaled by the fit's compute, memory or depthwise scale
    (``crossgpu.gpu_parts``' split), the weights' passes by its memory scale, host and GPU time added
    (``machine_fit.OVERLAP``); no occupancy term, as the fit has none."""
    c, m, w = layer_seconds(work, arch_gpu(gpu), check_precision(precision), eff)
    dw = work.depthwise.astype(bool) if work.depthwise is not None else np.zeros(len(c), dtype=bool)
    scale = np.where(dw, fit.depthwise_scale, np.where(c >= m, fit.compute_scale, fit.memory_scale))
    per_example = scale * np.maximum(c, m)
    zero = np.zeros_like(per_example)
    return StepTimeFn(fit.host_s(kernels), per_example, zero, fit.memory_scale * w, zero, OVERLAP)


def step_fn(
    model: str,
    gpu: str,
    calibration: Calibration | None = None,
    catalog: Catalog | None = None,
    runtime: str = DEFAULT_RUNTIME,
    precision: str = "fp32",
) -> StepTimeFn:
    """The model's step curve on ``gpu`` from its cost-model step model (:func:`cost_step_model`), through a
    probe's measured points where the calibration has any on this GPU (``costmodel.measured``); else, where the
    curve is a prediction (no figure of the model's own here) and other GPUs were probed, through theirs
    (``measured.through_probed``: the model's measured speed replaces the profile's guess)."""
    return probed_step_fn(model, gpu, calibration, catalog, runtime, precision)[0]


def probed_step_fn(
    model: str,
    gpu: str,
    calibration: Calibration | None = None,
    catalog: Catalog | None = None,
    runtime: str = DEFAULT_RUNTIME,
    precision: str = "fp32",
) -> tuple[StepTimeFn, tuple[str, ...]]:
    """:func:`step_fn` with the probed GPUs it was predicted through (() where none: measured here, or nothing
    measured elsewhere)."""
    chosen = cost_step_model(model, calibration, catalog, runtime=runtime)
    fn = chosen.curve(model, gpu, precision, runtime)
    key, rt = chosen.gpu(gpu).key, runtime_key(runtime, precision)
    if calibration is None or measured_points(calibration, key, rt, model) or not transfers(calibration) \
            or _calibrated_kind(model, key, rt, calibration) == "same-gpu":
        return through_measured(fn, calibration, key, rt, model), ()

    def curve_of(other: str) -> StepTimeFn | None:
        try:
            return chosen.curve(model, other, precision, runtime)
        except KeyError:  # a GPU this catalog (or data/gpu_arch.csv) does not know: it does not vote
            return None

    return through_probed(fn, calibration, key, rt, model, curve_of)


def probe_interval(model: str, gpu: str, batch: int, calibration: Calibration | None, runtime: str,
                   eff: Efficiencies | None = None) -> float | None:
    """The half-width of a step predicted through other GPUs' probes (:func:`probed_step_fn`): the cross-GPU
    model's held-out width of another GPU at the same precision (data/crossgpu_intervals.csv), at the batch
    distance of the nearest probed batch. None where the step is not predicted through probes."""
    if calibration is None or not transfers(calibration) or measured_points(calibration, gpu, runtime, model):
        return None
    if _calibrated_kind(model, gpu, runtime, calibration) == "same-gpu":
        return None
    probed = [b for g, points in probed_gpus(calibration, runtime, model).items() if g != gpu.lower()
              for b in points if b > 0]
    if not probed:
        return None
    e = eff or load_efficiencies()
    return e.width("other-gpu", min(abs(math.log2(b / batch)) for b in probed if b > 0))


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
    return step_fn(model, g.key, calibration, cat).layer_s(float(batch))
