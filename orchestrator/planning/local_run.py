"""A local spec's plan is the local run itself: the simulated run of its pinned cluster on this host (the local
provider's seeded revocations, or its schedule), so `plan`, `launch` and `simulate` give one answer for it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from orchestrator.costmodel import DEFAULT_CALIBRATION, Calibration, PlanResult, plan
from orchestrator.costmodel.planner.candidates import Candidate
from orchestrator.costmodel.planner.scoring import PlanContext, Score
from orchestrator.costmodel.stepmodel import StepModel
from orchestrator.model.blocks import BlockLike
from orchestrator.model.catalog import Catalog
from orchestrator.model.spec import JobSpec
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.sim.engine import (
    FixedLifetimes,
    LifetimeSource,
    NoRevocations,
    RunResult,
    ScheduleLifetimes,
    simulate,
)
from orchestrator.sim.from_spec import cluster_from_spec


@dataclass(frozen=True)
class RunFigures:
    """A local run's time and cost as simulated."""

    time_s: float
    cost_usd: float


def _simulated(spec: JobSpec, calibration: Calibration, steps: StepModel) -> tuple[RunResult, RunResult]:
    """(the run with its revocations, the same run without any)."""
    # The planner judges budget and deadline itself: score the whole run, not one the limits cut short.
    cluster = replace(cluster_from_spec(spec, calibration=calibration, steps=steps), enforce_limits=False)
    source: LifetimeSource
    if cluster.schedule is not None:
        source = ScheduleLifetimes(cluster, cluster.schedule, first_generation_only=True)
    elif cluster.lifetime_fn is not None:
        source = FixedLifetimes(cluster.lifetime_fn)
    else:
        source = NoRevocations()
    return simulate(cluster, source), simulate(cluster, NoRevocations())


class LocalRunScorer:
    """The planner's scorer for a pinned local spec. ``idle``: also the run on an idle host (the calibration
    without the host's other work), from the same planner run, to show beside the loaded figures. ``steps``: the
    plan's step model (the local provider's emulation)."""

    def __init__(self, spec: JobSpec, calibration: Calibration, steps: StepModel,
                 idle: Calibration | None = None) -> None:
        self.result, self.base = _simulated(spec, calibration, steps)
        self.idle: RunFigures | None = None
        if idle is not None:
            run, _ = _simulated(spec, idle, steps) if idle is not calibration else (self.result, self.base)
            self.idle = RunFigures(run.wall_time_s, run.cost_usd)

    def score(self, candidate: Candidate, context: PlanContext) -> Score:
        r = self.result
        return Score(r.wall_time_s, r.cost_usd, float(r.revocations), r.wall_time_s - self.base.wall_time_s)


def plan_job(spec: JobSpec, catalog: Catalog | None = None, calibration: Calibration | None = None,
             blocks: Sequence[BlockLike] = (), idle: Calibration | None = None) -> tuple[PlanResult, RunFigures | None]:
    """The planner, judging a local provider's pinned cluster as `simulate` plays the local run; the idle host's
    figures beside it where ``idle`` is given (a local pinned spec only). The job's step model is chosen here,
    once (``providers.local.step_model.step_model_for``: the local provider's emulation for a local spec), and
    handed to the planner and the simulated run."""
    steps = step_model_for(spec, calibration, catalog)
    scorer = None
    if steps.wall_clock and spec.cluster is not None:
        scorer = LocalRunScorer(spec, calibration or DEFAULT_CALIBRATION, steps, idle)
    result = plan(spec, catalog, calibration, scorer, blocks, steps=steps)
    return result, scorer.idle if scorer is not None else None
