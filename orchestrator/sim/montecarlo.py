"""Monte Carlo over revocation draws: distributions of wall time and cost for one cluster.

Lifetimes are drawn with NumPy for all runs at once (first generation: one matrix; replacements:
per instance class, in refilled blocks). Runs in which no instance is revoked before the
revocation-free finish time are identical, so they are filled in from one reference run without
simulating; the others go through the event loop, which needs only a handful of events per run.
Results depend only on the cluster, the model and the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from orchestrator.costmodel.revocation.model import DEFAULT_KIND, LifetimeModel, load_revocation_model
from orchestrator.costmodel.revocation.traces import BoolArray, FloatArray
from orchestrator.sim.engine import (
    COST_KEYS,
    FAILURES,
    CompiledCluster,
    FixedLifetimes,
    NoRevocations,
    RunResult,
    ScheduleLifetimes,
    SimCluster,
    simulate,
)

_BLOCK = 256
PERCENTILES = (10, 50, 90)


class _ModelLifetimes:
    """Lifetimes from a revocation model: a pre-drawn matrix for the first instances of every run and
    per-class blocks for replacements (consumed in run order, so results are deterministic)."""

    def __init__(
        self, cluster: SimCluster, model: LifetimeModel, kind: str, rng: np.random.Generator, runs: int
    ) -> None:
        self.cluster = cluster
        self.model = model
        self.kind = kind
        self.rng = rng
        self.row = 0
        self._pools: dict[tuple[str | None, str | None], list[float]] = {}
        self._gpu = [s.gpu for s in cluster.slots]
        gen0 = np.full((runs, len(cluster.slots)), np.inf)
        for j, slot in enumerate(cluster.slots):
            if slot.spot:
                gen0[:, j] = self._draw(slot.gpu, slot.zone_for(0, False), runs, 0.0)
        self.gen0 = gen0
        self._gen0_rows: list[list[float]] = gen0.tolist()

    def _draw(self, gpu: str | None, zone: str | None, n: int, t_request: float) -> FloatArray:
        start = self.cluster.start_at
        scale = self.cluster.time_scale  # lifetimes are cloud seconds; the local provider runs faster
        cloud_s = self.model.sample_lifetimes(
            gpu,
            zone,
            n,
            self.rng,
            preemptible=self.cluster.preemptible,
            kind=self.kind,
            start=None if start is None else start + timedelta(seconds=t_request * scale),
        )
        return cloud_s / scale if scale != 1.0 else cloud_s

    def lifetime(self, slot: int, generation: int, zone: str | None, spot: bool, t_request: float) -> float:
        if not spot:
            return math.inf
        if generation == 0:
            return self._gen0_rows[self.row][slot]
        gpu = self._gpu[slot]
        if self.cluster.start_at is not None:
            return float(self._draw(gpu, zone, 1, t_request)[0])
        key = (gpu, zone)
        pool = self._pools.get(key)
        if not pool:
            pool = self._draw(gpu, zone, _BLOCK, 0.0).tolist()
            pool.reverse()
            self._pools[key] = pool
        return pool.pop()


@dataclass(frozen=True)
class MonteCarloResult:
    cluster: SimCluster
    runs: int
    seed: int
    kind: str
    time_s: FloatArray
    cost_usd: FloatArray
    cost_by_role: dict[str, FloatArray]
    revocations: FloatArray
    replacements: FloatArray
    steps_lost: FloatArray
    finished: BoolArray
    deadline_missed: BoolArray
    over_budget: BoolArray
    failures: dict[str, int] = field(default_factory=dict)
    simulated_runs: int = 0  # runs that needed the event loop (the others had no revocation)

    def summary(self) -> dict[str, Any]:
        """Plain-JSON summary: mean and p10/p50/p90 of time and cost, revocations, probabilities."""
        c = self.cluster

        def stats(x: FloatArray) -> dict[str, float]:
            p = np.percentile(x, PERCENTILES)
            return {"mean": float(np.mean(x)), "p10": float(p[0]), "p50": float(p[1]), "p90": float(p[2])}

        miss_any = self.deadline_missed | self.over_budget
        return {
            "spec": c.name,
            "runs": self.runs,
            "seed": self.seed,
            "revocation_model": "schedule" if c.schedule is not None else (
                "local provider's seeded draws" if c.lifetime_fn is not None else self.kind),
            "preemptible_24h_cap": c.preemptible,
            "policy": c.policy,
            "strategy": c.strategy,  # data | pipeline | hybrid (a pipeline stops while a stage is lost)
            "stage_loss": c.stage_loss,
            "time_s": stats(self.time_s),
            "cost_usd": stats(self.cost_usd),
            "cost_by_role_usd": {k: float(np.mean(v)) for k, v in self.cost_by_role.items()},
            "revocations": {
                "mean": float(np.mean(self.revocations)),
                "p90": float(np.percentile(self.revocations, 90)),
            },
            "replacements_mean": float(np.mean(self.replacements)),
            "steps_lost_mean": float(np.mean(self.steps_lost)),
            "p_finished": float(np.mean(self.finished)),
            "p_miss_deadline": float(np.mean(self.deadline_missed)) if c.deadline_s is not None else None,
            "p_over_budget": float(np.mean(self.over_budget)) if c.budget_usd is not None else None,
            "p_miss_deadline_or_budget": float(np.mean(miss_any)),
            "deadline_s": c.deadline_s,
            "budget_usd": c.budget_usd,
            "failures": dict(self.failures),
        }


def run_monte_carlo(
    cluster: SimCluster,
    runs: int = 1000,
    seed: int = 0,
    *,
    model: LifetimeModel | None = None,
    trace: Path | None = None,
    kind: str = DEFAULT_KIND,
    shortcut: bool = True,
    daemon: bool = False,
) -> MonteCarloResult:
    """``runs`` simulated runs of ``cluster`` with lifetimes from ``model`` (default: fitted to ``trace``).

    A cluster with a ``schedule`` is deterministic: every run replays the schedule. ``shortcut``
    copies the revocation-free reference run into every run with no revocation before it ends
    (identical results, much faster); turn it off only to check exactly that. ``daemon``: every revocation
    is decided by the daemon's real reconcile (``simulate(daemon=True)``; about 10x slower per revocation).
    """
    if runs <= 0:
        raise ValueError("runs must be positive")
    cc = CompiledCluster(cluster)
    results: list[RunResult | None] = [None] * runs
    simulated = 0
    if cluster.schedule is not None:
        res = simulate(cc, ScheduleLifetimes(cluster, cluster.schedule, first_generation_only=True), daemon=daemon)
        results = [res] * runs
    elif cluster.lifetime_fn is not None:  # the local provider's seeded draws: one outcome
        results = [simulate(cc, FixedLifetimes(cluster.lifetime_fn), daemon=daemon)] * runs
    else:
        rev_model = model or load_revocation_model(trace)
        rng = np.random.default_rng(seed)
        source = _ModelLifetimes(cluster, rev_model, kind, rng, runs)
        reference = simulate(cc, NoRevocations())
        quiet = np.all(source.gen0 > reference.wall_time_s, axis=1)
        for r in range(runs):
            if shortcut and quiet[r]:
                results[r] = reference
                continue
            source.row = r
            results[r] = simulate(cc, source, daemon=daemon)
            simulated += 1
    done = [r for r in results if r is not None]
    return _collect(cluster, done, seed, kind, simulated)


def _collect(
    cluster: SimCluster, results: list[RunResult], seed: int, kind: str, simulated: int
) -> MonteCarloResult:
    def arr(values: list[float]) -> npt.NDArray[np.float64]:
        return np.asarray(values, dtype=np.float64)

    failures = dict.fromkeys(FAILURES, 0)
    for r in results:
        if r.failure is not None:
            failures[r.failure] += 1
    return MonteCarloResult(
        cluster=cluster,
        runs=len(results),
        seed=seed,
        kind=kind,
        time_s=arr([r.wall_time_s for r in results]),
        cost_usd=arr([r.cost_usd for r in results]),
        cost_by_role={k: arr([r.cost_by_role[k] for r in results]) for k in COST_KEYS},
        revocations=arr([float(r.revocations) for r in results]),
        replacements=arr([float(r.replacements) for r in results]),
        steps_lost=arr([r.steps_lost for r in results]),
        finished=np.asarray([r.finished for r in results], dtype=np.bool_),
        deadline_missed=np.asarray([r.deadline_missed for r in results], dtype=np.bool_),
        over_budget=np.asarray([r.over_budget for r in results], dtype=np.bool_),
        failures={k: v for k, v in failures.items() if v},
        simulated_runs=simulated,
    )
