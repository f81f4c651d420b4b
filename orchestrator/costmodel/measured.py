"""Measured step times (probes, `orchestrator probe`): a point is one model's step on one GPU under one runtime x
precision label at one batch, as a short run of the job itself measured it. A calibration carries them beside its
fitted efficiencies (``Calibration.measured``) and the planner prefers them: a GPU with a measured point of this
model is predicted through it (the fitted curve scaled to pass through the measurement, so the batch split and
other batches keep the curve's shape), and its interval is the measurement's own spread."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

# compute.step_fn calls this module: it names compute's types by what it reads of them, not by import (no cycle)


class _HasPoints(Protocol):
    @property
    def measured(self) -> Mapping[str, Mapping[str, Any]]: ...


Calibration = _HasPoints
StepFn = TypeVar("StepFn")  # compute.StepTimeFn
CalibT = TypeVar("CalibT", bound=_HasPoints)  # compute.Calibration


@dataclass(frozen=True)
class MeasuredStep:
    """One probed point: the median step of its timed windows and their spread (low .. high)."""

    step_s: float
    low_s: float
    high_s: float
    samples: int
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"step_s": self.step_s, "low_s": self.low_s, "high_s": self.high_s, "samples": self.samples,
                "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MeasuredStep:
        step = float(d["step_s"])
        return cls(step, float(d.get("low_s", step)), float(d.get("high_s", step)), int(d.get("samples", 1)),
                   str(d.get("source", "")))

    @property
    def spread(self) -> tuple[float, float]:
        """(low / step, high / step): the interval of a figure taken from this point."""
        return (self.low_s / self.step_s, self.high_s / self.step_s) if self.step_s > 0 else (1.0, 1.0)


def point_key(gpu: str, runtime_key: str, model: str, batch: int) -> str:
    """``gpu/runtime[+precision]/model@batch``: the probe's labels, as the calibration keys its points."""
    return f"{gpu.lower()}/{runtime_key}/{model}@{int(batch)}"


def _split(key: str) -> tuple[str, int] | None:
    head, sep, batch = key.rpartition("@")
    return (head, int(batch)) if sep and batch.isdigit() else None


def measured_at(calibration: Calibration | None, gpu: str, runtime_key: str, model: str,
                batch: int) -> MeasuredStep | None:
    """The measured point of exactly these labels, else None."""
    if calibration is None or not calibration.measured:
        return None
    found = calibration.measured.get(point_key(gpu, runtime_key, model, batch))
    return MeasuredStep.from_dict(found) if found is not None else None


def measured_points(calibration: Calibration | None, gpu: str, runtime_key: str,
                    model: str) -> dict[int, MeasuredStep]:
    """Every measured batch of this model on this GPU under this label."""
    if calibration is None or not calibration.measured:
        return {}
    head = f"{gpu.lower()}/{runtime_key}/{model}"
    out: dict[int, MeasuredStep] = {}
    for key, value in calibration.measured.items():
        parts = _split(key)
        if parts is not None and parts[0] == head:
            out[parts[1]] = MeasuredStep.from_dict(value)
    return out


def through_measured(fn: StepFn, calibration: Calibration | None, gpu: str, runtime_key: str,
                     model: str) -> StepFn:
    """``fn`` scaled by the geometric mean of measured / predicted over this GPU's measured batches: the curve
    passes through a single measured point exactly (t is homogeneous in its host and GPU parts), keeps its shape
    in the batch, and is ``fn`` itself where nothing was measured."""
    points = measured_points(calibration, gpu, runtime_key, model)
    f: Any = fn
    ratios = [p.step_s / f.at(float(b)) for b, p in points.items() if p.step_s > 0 and f.at(float(b)) > 0]
    if not ratios:
        return fn
    k = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    scaled: StepFn = replace(f, host_s=f.host_s * k, c=f.c * k, m=f.m * k, w=f.w * k)
    return scaled


def with_points(calibration: CalibT, points: Mapping[str, MeasuredStep], name: str,
                source: str, emulated: bool) -> CalibT:
    """The calibration with these points added (a point measured again replaces the older one)."""
    c: Any = calibration
    merged = {**c.measured, **{k: v.to_dict() for k, v in points.items()}}
    out: CalibT = replace(c, measured=merged, name=name, source=source, emulated=c.emulated or emulated)
    return out
