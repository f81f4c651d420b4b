"""Measured step times (probes, `orchestrator probe`): a point is one model's step on one GPU under one runtime x
precision label at one batch, as a short run of the job itself measured it. A calibration carries them beside its
fitted efficiencies (``Calibration.measured``) and the planner prefers them: a GPU with a measured point of this
model is predicted through it (the fitted curve scaled to pass through the measurement, so the batch split and
other batches keep the curve's shape), and its interval is the measurement's own spread. A GPU not probed is
predicted through the GPUs that were (``probed_ratio``: the model's measured speed over the cost model's, carried
to it by the cost model's ratio of the two GPUs), with the cross-GPU model's held-out width of that question."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
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


def probed_gpus(calibration: Calibration | None, runtime_key: str, model: str) -> dict[str, dict[int, MeasuredStep]]:
    """Every GPU with a measured point of this model under this label, with its measured batches."""
    if calibration is None or not calibration.measured:
        return {}
    tail = f"/{runtime_key}/{model}"
    out: dict[str, dict[int, MeasuredStep]] = {}
    for key, value in calibration.measured.items():
        parts = _split(key)
        if parts is None or not parts[0].endswith(tail) or "/" in (gpu := parts[0][: -len(tail)]) or not gpu:
            continue
        out.setdefault(gpu, {})[parts[1]] = MeasuredStep.from_dict(value)
    return out


def _geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def measured_ratio(points: Mapping[int, MeasuredStep], predicted: Callable[[int], float | None]) -> float | None:
    """The geometric mean of measured / predicted over one GPU's measured batches; None where none is usable."""
    pairs = [(p.step_s, predicted(b)) for b, p in sorted(points.items())]
    ratios = [m / q for m, q in pairs if m > 0 and q is not None and q > 0]
    return _geomean(ratios) if ratios else None


def probed_ratio(calibration: Calibration | None, runtime_key: str, model: str,
                 predicted: Callable[[str, int], float | None],
                 skip: str = "") -> tuple[float, dict[str, dict[int, MeasuredStep]]] | None:
    """How far the model's own measured speed sits from the cost model's, over the GPUs probed (``skip`` left
    out): per probed GPU A the geometric mean over its batches of measured(A) / predicted(A, batch), then the
    geometric mean over the GPUs, each GPU one vote. A GPU B not probed is predicted as model(B) x this ratio:
    with one probed GPU, measured(A) x model(B) / model(A), the cross-GPU transfer (``crossgpu.predict``); with
    several, its geometric mean over them. ``predicted(gpu, batch)``: the model's step there (None: no
    prediction of that GPU, which then does not vote). Returns (ratio, the points used), or None where no other
    GPU was probed. Pure: bench/probe_transfer.py calls it on the public tables' rows."""
    per_gpu: dict[str, float] = {}
    used: dict[str, dict[int, MeasuredStep]] = {}
    for gpu, points in sorted(probed_gpus(calibration, runtime_key, model).items()):
        if gpu == skip.lower():
            continue
        r = measured_ratio(points, functools.partial(predicted, gpu))
        if r is not None:
            per_gpu[gpu], used[gpu] = r, points
    return (_geomean(list(per_gpu.values())), used) if per_gpu else None


def scaled(fn: StepFn, k: float) -> StepFn:
    """The curve ``k`` times slower at every batch (t is homogeneous in its host and GPU parts)."""
    f: Any = fn
    out: StepFn = replace(f, host_s=f.host_s * k, c=f.c * k, m=f.m * k, w=f.w * k)
    return out


def through_two(fn: StepFn, points: Mapping[int, MeasuredStep]) -> StepFn | None:
    """``fn`` with its host time and its GPU part refitted to two or more measured batches: the curve is
    ``t(b)^p = host^p + (k g(b))^p`` (``compute.StepTimeFn``'s smooth max, g the predicted GPU part), linear in
    (host^p, k^p), so two batches give host and k exactly (more: least squares) and the batch keeps the GPU
    part's shape (its per-example and fixed parts) at the measured speed. None where fewer than two distinct
    batches were measured or the fit is not a curve (no GPU part growing with the batch, or a negative host)."""
    f: Any = fn
    usable = sorted((b, p.step_s) for b, p in points.items() if b > 0 and p.step_s > 0)
    if len(usable) < 2:
        return None
    pw = float(f.overlap)
    xs = [float(f.gpu_s(float(b))[0]) ** pw for b, _ in usable]
    ys = [t ** pw for _, t in usable]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    host = my - slope * mx
    if slope <= 0 or host < 0:
        return None
    k = slope ** (1 / pw)
    out: StepFn = replace(f, host_s=host ** (1 / pw), c=f.c * k, m=f.m * k, w=f.w * k)
    return out


def through_measured(fn: StepFn, calibration: Calibration | None, gpu: str, runtime_key: str,
                     model: str) -> StepFn:
    """``fn`` through this GPU's measured batches: through two or more, its host time and GPU part refitted to
    them (``through_two``: the batch split and the memory-capped batch choice read the measured curve); through
    one (or where that fit fails), scaled by the geometric mean of measured / predicted, so the curve passes
    through a single point exactly and keeps its shape in the batch; ``fn`` itself where nothing was measured."""
    f: Any = fn
    points = measured_points(calibration, gpu, runtime_key, model)
    fitted = through_two(fn, points)
    if fitted is not None:
        return fitted
    k = measured_ratio(points, lambda b: float(f.at(float(b))))
    return fn if k is None else scaled(fn, k)


def through_probed(fn: StepFn, calibration: Calibration | None, gpu: str, runtime_key: str, model: str,
                   curve_of: Callable[[str], StepFn | None]) -> tuple[StepFn, tuple[str, ...]]:
    """``fn`` (this GPU's predicted curve) through the model's points measured on OTHER GPUs (``probed_ratio``),
    with the GPUs it went through; ``fn`` and () where no other GPU was probed. ``curve_of(gpu)``: that GPU's
    predicted curve, before any measurement (None: not predictable here)."""

    def predicted(g: str, b: int) -> float | None:
        c: Any = curve_of(g)
        return None if c is None else float(c.at(float(b)))

    found = probed_ratio(calibration, runtime_key, model, predicted, skip=gpu)
    return (fn, ()) if found is None else (scaled(fn, found[0]), tuple(found[1]))


def with_points(calibration: CalibT, points: Mapping[str, MeasuredStep], name: str,
                source: str, emulated: bool) -> CalibT:
    """The calibration with these points added (a point measured again replaces the older one)."""
    c: Any = calibration
    merged = {**c.measured, **{k: v.to_dict() for k, v in points.items()}}
    out: CalibT = replace(c, measured=merged, name=name, source=source, emulated=c.emulated or emulated)
    return out
