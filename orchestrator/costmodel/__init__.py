"""Cost model: step times, parameter-server capacity, memory caps, batch splits, and the planner.

Other parts of the orchestrator code against the functions below (signatures are stable):

* :func:`predict_step_time`: compute-only seconds per step of a model on a GPU at a batch
* :func:`ps_capacity_steps_per_s`: most global steps/s a set of parameter servers can serve
* :func:`cluster_steps_per_s`: global steps/s of a cluster (async PS or sync all-reduce)
* :func:`split_batch`: per-worker batches that sum to a global batch with the slowest worker fastest
* :func:`relative_speed`: how much faster a GPU steps than a reference one (the local provider emulates
  GPU speeds with it)
* :class:`Calibration`, :func:`fit_calibration`, :func:`load_calibration`, :func:`plan`, :class:`PlanResult`

See ``docs/costmodel.md`` for the equations. No TensorFlow is imported here.
"""

from __future__ import annotations

from orchestrator.costmodel.calibration import (
    Measurement,
    Validation,
    fit_calibration,
    leave_one_gpu_out,
    load_measurements,
)
from orchestrator.costmodel.cluster import cluster_rate
from orchestrator.costmodel.comm import ps_capacity
from orchestrator.costmodel.compute import (
    DEFAULT_CALIBRATION,
    DEFAULT_RUNTIME,
    Calibration,
    Efficiency,
    NetParams,
    load_calibration,
)
from orchestrator.costmodel.memory import max_batch
from orchestrator.costmodel.planner import plan
from orchestrator.costmodel.planner.candidates import Candidate, PlanResult
from orchestrator.costmodel.planner.scoring import AnalyticScorer, Score, Scorer
from orchestrator.costmodel.profiles import MODEL_NAMES, ModelProfile, UnknownModelError, get_profile
from orchestrator.costmodel.split import SplitError, split_batch
from orchestrator.costmodel.stepmodel import step_time


def predict_step_time(model: str, gpu: str, batch: int, calibration: Calibration | None = None,
                      runtime: str = DEFAULT_RUNTIME, precision: str = "fp32") -> float:
    """Seconds per training step of one worker, compute only (no PS or all-reduce traffic)."""
    return step_time(model, gpu, batch, calibration, runtime=runtime, precision=precision)


def ps_capacity_steps_per_s(model: str, ps_count: int, ps_machine_type: str, workers: int) -> float:
    """Most global steps per second ``ps_count`` parameter servers of this machine type can serve to
    ``workers`` workers (greedy variable sharding, default network constants)."""
    return ps_capacity(model, ps_count, ps_machine_type, workers, DEFAULT_CALIBRATION.net)


def cluster_steps_per_s(
    model: str,
    gpus: list[str],
    batches: list[int],
    ps_count: int,
    ps_machine_type: str,
    mode: str,
    calibration: Calibration | None = None,
) -> float:
    """Global steps per second: async = min(sum of worker rates, PS capacity); sync = 1 / (slowest
    worker + ring all-reduce). ``ps_count`` and ``ps_machine_type`` are ignored in sync mode."""
    return cluster_rate(model, gpus, batches, ps_count, ps_machine_type, mode, calibration)


def relative_speed(model: str, gpu: str, batch: int, reference: str = "k80") -> float:
    """Reference step time / this GPU's step time (default calibration); 2.0 = twice the reference's speed."""
    return step_time(model, reference, batch) / step_time(model, gpu, batch)


__all__ = [
    "DEFAULT_CALIBRATION",
    "MODEL_NAMES",
    "AnalyticScorer",
    "Calibration",
    "Candidate",
    "Efficiency",
    "Measurement",
    "ModelProfile",
    "NetParams",
    "PlanResult",
    "Score",
    "Scorer",
    "SplitError",
    "UnknownModelError",
    "Validation",
    "cluster_steps_per_s",
    "fit_calibration",
    "get_profile",
    "leave_one_gpu_out",
    "load_calibration",
    "load_measurements",
    "max_batch",
    "plan",
    "predict_step_time",
    "ps_capacity_steps_per_s",
    "relative_speed",
    "split_batch",
]
