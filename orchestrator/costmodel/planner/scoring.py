"""Scoring a candidate: expected time, cost and revocations under a constant revocation hazard.

``AnalyticScorer`` is the default; the simulator gives the planner its own scorer for a local run
(``planning.local_run.LocalRunScorer``). Budget and deadline turn a scored candidate infeasible, not invisible.
A synchronous cluster whose strategies the planner weighed (``strategies.Revocations``: a lost stage stops a
pipeline, data parallel survivors train on, as the simulator plays them) takes its strategy's expectation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from orchestrator.costmodel.accounting import run_accounting
from orchestrator.costmodel.batches import price_book_for
from orchestrator.costmodel.compute import Calibration
from orchestrator.costmodel.planner.candidates import Candidate, WorkerPlan
from orchestrator.costmodel.risk import RevocationRates, load_revocation_rates
from orchestrator.costmodel.stepmodel import COST_STEPS, StepModel
from orchestrator.model import timings
from orchestrator.model.catalog import Catalog, PriceBook, load_catalog
from orchestrator.model.spec import JobSpec
from orchestrator.model.torch_spec import replica_groups


@dataclass(frozen=True)
class Score:
    time_s: float
    cost_usd: float
    expected_revocations: float
    revocation_overhead_s: float
    risk_assumed: bool = False


@dataclass(frozen=True)
class PlanContext:
    spec: JobSpec
    catalog: Catalog
    book: PriceBook
    rates: RevocationRates
    train_steps: int
    checkpoint_every: int
    replacement_delay_s: float
    time_scale: float = 1.0  # local provider: cloud seconds per wall second (hazards run that much faster)


class Scorer(Protocol):
    def score(self, candidate: Candidate, context: PlanContext) -> Score: ...


class AnalyticScorer:
    """Expected time and cost with a constant revocation hazard per spot instance (see module docstring).

    Every revoked instance is taken to be replaced (``policy.on_revocation: replace``); the other policies
    (shrink, fall back to on-demand) change the cluster after a revocation, which the simulator models.
    """

    def score(self, candidate: Candidate, context: PlanContext) -> Score:
        rate = candidate.steps_per_s
        if not rate > 0:
            return Score(math.inf, math.inf, math.inf, math.inf)
        t0 = candidate.base_time_s
        delay = context.replacement_delay_s
        # Boot delay of the replacement plus half a checkpoint interval of work rolled back.
        stall = delay + 0.5 * context.checkpoint_every / rate
        own_total = sum(w.steps_per_s for w in candidate.workers)
        loss = 0.0  # seconds of progress lost per second of run time
        hazard = 0.0
        assumed = False
        chief_on_w0 = candidate.mode == "async" and candidate.chief_machine_type is None
        groups = candidate.mode == "sync" and replica_groups(context.spec)
        for i, w in enumerate(candidate.workers):
            if not w.spot:
                continue
            lam = context.rates.hazard_per_s(w.gpu, w.zone) * context.time_scale
            assumed = assumed or context.rates.assumed(w.gpu)
            hazard += lam
            if groups:  # torchft: the survivors pause for a quorum as it leaves and as its replacement joins,
                # and train without its share of the pace while the replacement boots; nothing rolls back
                loss += lam * (2 * timings.TORCHFT_PAUSE_S + delay * w.steps_per_s / own_total)
            elif candidate.mode == "sync" or (chief_on_w0 and i == 0):  # worker 0 takes the chief down
                loss += lam * stall
            else:
                without = min(own_total - w.steps_per_s, candidate.ps_capacity)
                lost_fraction = (rate - without) / rate
                loss += lam * delay * lost_fraction
        cpu_roles = [(candidate.ps_spot, candidate.ps_zone)] * candidate.ps_count
        if candidate.chief_machine_type is not None:
            cpu_roles.append((candidate.chief_spot, candidate.chief_zone))
        for spot, zone in cpu_roles:
            if spot:
                lam = context.rates.hazard_per_s(None, zone) * context.time_scale
                hazard += lam
                loss += lam * stall
        weighed = _weighed_expectation(candidate, cpu_roles)
        if weighed is not None:  # the strategy's own model: a lost stage stops a pipeline, DP survivors train on
            t = weighed
            return Score(t, candidate.hourly_usd * t / 3600.0, hazard * t, t - t0, assumed)
        if loss >= 1.0:
            return Score(math.inf, math.inf, math.inf, math.inf, assumed)
        t = t0 / (1.0 - loss)
        return Score(t, candidate.hourly_usd * t / 3600.0, hazard * t, t - t0, assumed)



def _weighed_expectation(candidate: Candidate, cpu_roles: list[tuple[bool, str | None]]) -> float | None:
    """The expected run of the strategy the candidate runs, where the planner weighed strategies for it
    (``strategies.Revocations``, the simulator's model) and no spot CPU instance adds risk of its own."""
    picked = candidate.strategies[0] if candidate.strategies else None
    if picked is None or picked.name != candidate.strategy or any(spot for spot, _ in cpu_roles):
        return None
    expected = float(picked.expected_s)
    return expected if not math.isnan(expected) else None


def score_candidates(
    candidates: Sequence[Candidate],
    context: PlanContext,
    scorer: Scorer,
    budget_usd: float | None,
    deadline_s: float | None,
) -> list[Candidate]:
    """Each candidate with the scorer's expected time, cost and revocations; over budget or past the deadline:
    infeasible, saying why."""
    out = []
    for c in candidates:
        s = scorer.score(c, context)
        reasons = list(c.reasons)
        if not math.isfinite(s.time_s):
            reasons.append("no progress: zero throughput, or revocations outpace training")
        if over := over_budget(s.cost_usd, budget_usd):
            reasons.append(over)
        if deadline_s is not None and s.time_s > deadline_s:
            reasons.append(f"time {s.time_s / 3600:.2f} h is past the deadline {deadline_s / 3600:.2f} h")
        out.append(
            replace(
                c,
                time_s=s.time_s,
                cost_usd=s.cost_usd,
                expected_revocations=s.expected_revocations,
                revocation_overhead_s=s.revocation_overhead_s,
                risk_assumed=s.risk_assumed,
                feasible=not reasons,
                reasons=tuple(reasons),
            )
        )
    return out


def over_budget(cost_usd: float, budget_usd: float | None) -> str | None:
    """Why a cost breaks the budget, or None."""
    if budget_usd is not None and cost_usd > budget_usd:
        d = 2 if budget_usd >= 1 else 4  # cents alone would show $0.0246 over $0.02 as "$0.02 over $0.02"
        return f"cost ${cost_usd:,.{d}f} is over the budget ${budget_usd:,.{d}f}"
    return None


def repriced(c: Candidate, workers: tuple[WorkerPlan, ...], hourly_usd: float, cost_usd: float,
             budget_usd: float | None) -> Candidate:
    """A scored candidate at other prices (an ssh inventory's, which the price book does not know): its budget
    judged again at the new cost; every other reason stands."""
    reasons = [r for r in c.reasons if r != over_budget(c.cost_usd, budget_usd)]
    if over := over_budget(cost_usd, budget_usd):
        reasons.append(over)
    return replace(c, workers=workers, hourly_usd=hourly_usd, cost_usd=cost_usd, feasible=not reasons,
                   reasons=tuple(reasons))


def plan_context(
    spec: JobSpec, catalog: Catalog | None = None, calibration: Calibration | None = None,
    steps: StepModel | None = None,
) -> PlanContext:
    """What a scorer needs besides the candidate: prices, revocation rates and the replacement delay (for a
    wall-clock step model, the local provider's, in wall seconds, with the hazards sped up by its time scale)."""
    cat = catalog or load_catalog()
    book = price_book_for(spec, cat)
    delay = timings.BOOT_S + timings.gce_boot_extra_s(spec)  # a gce VM's image route adds its first boot
    scale = 1.0
    chosen = steps or COST_STEPS
    if chosen.wall_clock:  # wall seconds: boot / time_scale, then the task's start-up
        acc = run_accounting(spec, cat, calibration, steps=chosen)
        delay, scale = acc.boot_s + acc.startup_s, chosen.time_scale
    return PlanContext(
        spec,
        cat,
        book,
        load_revocation_rates(),
        spec.training.train_steps,
        spec.training.checkpoint_every,
        delay,
        scale,
    )

