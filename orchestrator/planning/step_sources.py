"""Where each worker group's step time comes from: a probe's measurement of the point (``measured``, its interval
the measurement's own spread) or the cost model (``predicted``, the plan's interval). `plan --format json` marks
each group of the chosen cluster so; a predicted group on a GPU not probed, where other GPUs were, is predicted
through them (``predicted_through`` names them) with the cross-GPU model's held-out width of that question. A
plan whose every group is measured takes the widest measured spread as its interval (kind ``measured``) instead
of the cross-GPU model's held-out error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.costmodel import Calibration, PlanResult
from orchestrator.costmodel.batches import job_precision, job_runtime
from orchestrator.costmodel.compute import runtime_key
from orchestrator.costmodel.measured import measured_at, probed_gpus
from orchestrator.costmodel.stepmodel import probe_interval
from orchestrator.model.spec import JobSpec


@dataclass(frozen=True)
class StepSource:
    """One worker group of the chosen cluster: its step time, where it comes from, and its interval."""

    gpu: str
    machine_type: str
    batch: int
    count: int
    step_s: float
    step_source: str  # measured | predicted
    step_low_s: float
    step_high_s: float
    measured_step_s: float | None = None  # the probe's own figure (one worker alone); None: predicted
    samples: int = 0
    through: tuple[str, ...] = ()  # predicted through these probed GPUs (``stepmodel.probed_step_fn``)

    def to_dict(self) -> dict[str, Any]:
        """``predicted_through`` only where there is one: a plan with no probe reads as before."""
        return {"gpu": self.gpu, "machine_type": self.machine_type, "batch": self.batch, "count": self.count,
                "step_s": self.step_s, "step_source": self.step_source, "step_low_s": self.step_low_s,
                "step_high_s": self.step_high_s, "measured_step_s": self.measured_step_s, "samples": self.samples,
                **({"predicted_through": list(self.through)} if self.through else {})}


def step_sources(spec: JobSpec, result: PlanResult, calibration: Calibration | None,
                 relative: float) -> tuple[StepSource, ...]:
    """Each worker group (GPU, machine type, batch) of the chosen cluster, marked measured or predicted."""
    chosen = result.chosen
    if chosen is None:
        return ()
    rt = runtime_key(job_runtime(spec.training), job_precision(spec.training))
    model = spec.training.profile_name
    groups: dict[tuple[str, str, int], list[float]] = {}
    for w in chosen.workers:
        groups.setdefault((w.gpu, w.machine_type, w.batch), []).append(w.step_time_s)
    out = []
    for (gpu, machine, batch), steps in groups.items():
        step = steps[0]
        point = measured_at(calibration, gpu, rt, model, batch)
        if point is None:  # through other GPUs' probes: the cross-GPU model's width of that question
            through = probe_interval(model, gpu, batch, calibration, rt)
            rel = relative if through is None else through
            out.append(StepSource(gpu, machine, batch, len(steps), step, "predicted", step / (1 + rel),
                                  step * (1 + rel), through=() if through is None else tuple(
                                      g for g in probed_gpus(calibration, rt, model) if g != gpu.lower())))
            continue
        low, high = point.spread
        out.append(StepSource(gpu, machine, batch, len(steps), step, "measured", step * low, step * high,
                              point.step_s, point.samples))
    return tuple(out)


def measured_interval(interval: dict[str, Any] | None, sources: tuple[StepSource, ...],
                      result: PlanResult) -> dict[str, Any] | None:
    """The plan's interval from its measured points' spread where every group is measured; else as it was."""
    chosen = result.chosen
    if interval is None or chosen is None or not sources or any(s.step_source != "measured" for s in sources):
        return interval
    rel = max(max(s.step_high_s / s.step_s - 1, 1 - s.step_low_s / s.step_s) for s in sources if s.step_s > 0)
    return {**interval, "relative": rel, "kind": "measured", "time_low_s": chosen.time_s / (1 + rel),
            "time_high_s": chosen.time_s * (1 + rel), "cost_low_usd": chosen.cost_usd / (1 + rel),
            "cost_high_usd": chosen.cost_usd * (1 + rel)}
