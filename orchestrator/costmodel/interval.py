"""The interval of a plan's prediction, and whether the planner's choice flips inside it.

The half-width is the held-out error of the kind of question the plan asks (``crossgpu``: measured
on this GPU, on another GPU, nothing measured; fitted by bench/cross_gpu.py), taken for the least
measured GPU of the chosen cluster. A step time off by ``r`` moves the run's time by at most ``r``
(and its cost with it), so a runner-up whose objective is within ``r`` of the choice may be the better
cluster: the plan says so.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.costmodel.compute import Calibration, runtime_key
from orchestrator.costmodel.crossgpu import load_efficiencies, none_interval
from orchestrator.costmodel.planner.candidates import Candidate, PlanResult
from orchestrator.costmodel.stepmodel import question_kind


def _objective(c: Candidate, objective: str) -> float:
    return c.time_s if objective == "time" else c.cost_usd


def plan_interval(
    result: PlanResult, calibration: Calibration, runtime: str = "tf1-graph", precision: str = "fp32"
) -> dict[str, Any] | None:
    """``{relative, kind, low_s, high_s, flips, runner_up}`` of the chosen cluster; None without one."""
    chosen = result.chosen
    if chosen is None:
        return None
    eff = load_efficiencies()
    order = ["same-gpu", "other-gpu", "other-gpu-precision", "none"]
    kinds = [question_kind(result.model, w.gpu, runtime_key(runtime, precision), calibration) for w in chosen.workers]
    kind = max(kinds, key=order.index)
    rel = none_interval(eff) if kind == "none" else float(eff.interval[kind])
    flips = None
    mine = _objective(chosen, result.objective)
    for other in result.runner_ups(3):
        theirs = _objective(other, result.objective)
        if other.feasible and math.isfinite(theirs) and theirs <= mine * (1 + rel) ** 2:
            flips = other.label
            break
    return {"relative": rel, "kind": kind, "time_low_s": chosen.time_s / (1 + rel),
            "time_high_s": chosen.time_s * (1 + rel), "cost_low_usd": chosen.cost_usd / (1 + rel),
            "cost_high_usd": chosen.cost_usd * (1 + rel), "flips_to": flips}
