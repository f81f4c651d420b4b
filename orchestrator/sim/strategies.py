"""Monte Carlo of one spec's pinned cluster under each way a synchronous job can use it: data parallel, a pipeline,
a hybrid (``costmodel.planner.strategies``).

This is where a partition that is faster without revocations can lose to data parallel on spot VMs: a data parallel
world pauses to re-form and its survivors train on, but a lost stage stops the whole pipeline, its survivors idle
and billed. A pipeline is played twice: ``wait`` (every stage waits for the replacement: ``policy.stage_loss: wait``)
and ``auto`` (the survivors re-partition the model where ``costmodel.stage_loss`` predicts it cheaper).
Beside each, the planner's analytic expectation (``plan --json``: ``expected_hours``, ``expected_usd``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.costmodel import Calibration, plan
from orchestrator.costmodel.planner import chosen_strategy
from orchestrator.costmodel.planner.strategies import DATA, Strategy
from orchestrator.costmodel.revocation.model import DEFAULT_KIND, LifetimeModel
from orchestrator.model.catalog import Catalog, load_catalog
from orchestrator.model.spec import JobSpec
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.sim.from_spec import cluster_from_spec
from orchestrator.sim.montecarlo import MonteCarloResult, run_monte_carlo


@dataclass(frozen=True)
class StrategyOutcome:
    strategy: str  # data | pipeline | hybrid
    stage_loss: str  # wait | auto (data parallel: wait, unused)
    fits: bool
    detail: str
    planned: Strategy | None  # the planner's figures for it (None: the planner did not weigh strategies)
    result: MonteCarloResult | None  # None where it does not fit

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"strategy": self.strategy, "stage_loss": self.stage_loss, "fits": self.fits,
                               "detail": self.detail}
        if self.planned is not None:
            out["plan_expected_hours"] = _num(self.planned.expected_s / 3600.0)
            out["plan_expected_usd"] = _num(self.planned.expected_usd)
        if self.result is not None:
            s = self.result.summary()
            out.update({"runs": s["runs"], "hours": {k: v / 3600.0 for k, v in s["time_s"].items()},
                        "usd": s["cost_usd"], "revocations_mean": s["revocations"]["mean"],
                        "p_finished": s["p_finished"], "failures": s["failures"]})
        return out


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def compare_strategies(
    spec: JobSpec, runs: int = 1000, seed: int = 0, *, model: LifetimeModel | None = None, trace: Path | None = None,
    kind: str = DEFAULT_KIND, catalog: Catalog | None = None, calibration: Calibration | None = None,
    price_book: str | None = None, as_cloud: bool = False,
) -> list[StrategyOutcome]:
    """Every strategy the planner weighs for the spec's cluster (an async job, or a spec the planner does not weigh:
    the one it runs), each simulated ``runs`` times with the same seed; budget and deadline do not cut runs short."""
    cat = catalog or load_catalog()
    steps = step_model_for(spec, calibration, cat)  # the job's step model, once: the plan's and every run's
    chosen = plan(spec, cat, calibration, steps=steps).chosen
    weighed: list[Strategy] = list(chosen.strategies) if chosen is not None else []
    names: list[tuple[str, bool, str, Strategy | None]] = [(s.name, s.fits, s.detail, s) for s in weighed] or [
        (chosen_strategy(spec, cat, calibration, steps), True, "", None)]
    out: list[StrategyOutcome] = []
    for name, fits, detail, planned in sorted(names, key=lambda n: n[0] != DATA):
        for stage_loss in ("wait",) if name == DATA else ("wait", "auto"):
            result = None
            if fits:
                cluster = replace(cluster_from_spec(spec, catalog=cat, price_book=price_book, calibration=calibration,
                                                    as_cloud=as_cloud, strategy=name, stage_loss=stage_loss,
                                                    steps=steps),
                                  enforce_limits=False)
                result = run_monte_carlo(cluster, runs, seed, model=model, trace=trace, kind=kind)
            out.append(StrategyOutcome(name, stage_loss, fits, detail, planned, result))
    return out


__all__ = ["StrategyOutcome", "compare_strategies"]
