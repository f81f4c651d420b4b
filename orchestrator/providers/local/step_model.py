"""The local provider's step model: its emulated GPUs, as one implementation of ``costmodel.stepmodel.StepModel``.

A local worker's GPU is a sleep per step from measured curves (``providers.local.emulation``, never the cost
model), on top of its real CPU work on this host; its figures are wall seconds of this host, its boot the
cloud's / ``time_scale``. :class:`EmulatedStep` answers the cost model's questions so (the sleep, the split
speeds, the wall clock) and wraps the cost model's own step for what it does not emulate (a worker's memory, the
step curve the memory caps are read against).

:func:`step_model_for` is the one choice of a job's step model: the emulation for a local spec, else the cost
model's implementation for the spec's model (``costmodel.stepmodel.cost_step_model``). The planning layer makes
it once per plan and hands it down (the simulator and the controller, which run what was planned, make the same
choice); the cost model never imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.costmodel.batches import job_runtime, memory_params
from orchestrator.costmodel.compute import Calibration, StepTimeFn
from orchestrator.costmodel.stepmodel import StepModel, StepTime, cost_step_model
from orchestrator.model.catalog import Catalog
from orchestrator.model.spec import JobSpec
from orchestrator.providers.local.emulation import REFERENCE_BATCH, emulated_step_s, reference_batch


@dataclass(frozen=True)
class EmulatedStep:
    """The emulated GPUs of a local spec: ``k80_s`` the K80's sleep at ``reference_batch`` (the spec's
    ``emulation_k80_step_s`` and per-worker batch, ``emulation.reference_batch``); ``inner`` the cost model's step
    model of the same job."""

    inner: StepModel
    k80_s: float
    reference_batch: float = float(REFERENCE_BATCH)
    time_scale: float = 1.0
    source = "local-emulation"
    wall_clock = True

    @property
    def calibration(self) -> Calibration:
        return self.inner.calibration

    def curve(self, profile: str, gpu: str, precision: str, runtime: str) -> StepTimeFn:
        return self.inner.curve(profile, gpu, precision, runtime)

    def step(self, profile: str, gpu: str, batch: float, precision: str, runtime: str) -> StepTime:
        return self.inner.step(profile, gpu, batch, precision, runtime)

    def sleep_s(self, gpu: str | None, batch: int) -> float:
        """As the worker sleeps it (``emulation.emulation_sleep``): rounded to 0.1 ms; 0 for a CPU role or with
        the emulation off (``emulation_k80_step_s: 0``)."""
        if gpu is None or self.k80_s == 0:
            return 0.0
        return round(self.emulated_s(gpu, batch), 4)

    def emulated_s(self, gpu: str, batch: float) -> float:
        return emulated_step_s(gpu, batch, self.k80_s, self.reference_batch)

    def split_speeds(self, gpus: Sequence[str]) -> list[float]:
        """The emulated GPUs' measured speeds at the study's batch (not the cost model's): a global batch is split
        in proportion to them."""
        return [1.0 / emulated_step_s(g, REFERENCE_BATCH, 1.0) for g in gpus]


def step_model_for(spec: JobSpec, calibration: Calibration | None = None,
                   catalog: Catalog | None = None) -> StepModel:
    """The job's step model: the local provider's emulation for a local spec (its K80 step, reference batch and
    time scale), else the cost model's implementation for the spec's model."""
    inner = cost_step_model(spec.training.profile_name, calibration, catalog, memory_params(spec),
                            job_runtime(spec.training))
    local = spec.provider.as_local()
    if local is None:
        return inner
    return EmulatedStep(inner, local.emulation_k80_step_s, reference_batch(spec), local.time_scale)


__all__ = ["EmulatedStep", "step_model_for"]
