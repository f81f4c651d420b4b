"""The runtime and precision a job's steps are predicted under: what the step models, the local host model and
the split all key their figures by (a module of its own so that each can import it without a cycle)."""

from __future__ import annotations

from orchestrator.costmodel.compute import DEFAULT_RUNTIME, TORCHJOB_RUNTIME
from orchestrator.model.spec.training import BuiltinTraining, CommandTraining, RunTraining, payload_framework


def job_runtime(training: BuiltinTraining | CommandTraining | RunTraining) -> str:
    """The calibration runtime a job's steps are predicted under (its workers report the same label): the TF
    job's, the built-in PyTorch job's own, or eager PyTorch for a user's script."""
    if payload_framework(training) == "tensorflow":
        return DEFAULT_RUNTIME
    return TORCHJOB_RUNTIME if isinstance(training, BuiltinTraining) else "pytorch-eager"



def job_precision(training: BuiltinTraining | CommandTraining | RunTraining) -> str:
    """The precision a job's steps are predicted at: the spec's ``training.precision`` for a user's script; the
    built-in jobs train in FP32 (the PyTorch one with TF32 off)."""
    return str(getattr(training, "precision", "fp32"))
