"""What the planner returns: each candidate cluster with its predicted time and cost, and the plan."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from orchestrator.costmodel.compute import DEFAULT_CALIBRATION
from orchestrator.model.catalog import load_catalog
from orchestrator.model.spec import Chief, Cluster, ParameterServers, WorkerGroup


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    gpu: str
    batch: int
    spot: bool
    zone: str | None
    machine_type: str  # host machine type (the GPU's default unless the spec pins one)
    step_time_s: float  # compute only
    comm_s: float  # PS push/pull or all-reduce per step
    steps_per_s: float  # this worker's own rate (async: unhindered by the PS)
    share: float  # expected share of the global steps
    max_batch: int  # memory cap
    price_per_hour: float = 0.0
    flex_start: bool = False

    @property
    def billing(self) -> str:
        return "flex-start" if self.flex_start and not self.spot else _billing(self.spot)

    @property
    def multi_gpu(self) -> bool:
        """A machine type with several GPUs (its batch is each GPU's)."""
        return load_catalog().gpus_per_instance(self.machine_type) > 1

    @property
    def shown(self) -> str:
        """The GPU, and a multi-GPU machine type's name: 2x h100 (a3-highgpu-4g) is 8 H100s."""
        return f"{self.gpu} ({self.machine_type})" if self.multi_gpu else self.gpu

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "batch": self.batch,
            "spot": self.spot,
            "zone": self.zone,
            "machine_type": self.machine_type,
            "step_time_s": self.step_time_s,
            "comm_s": self.comm_s,
            "steps_per_s": self.steps_per_s,
            "share": self.share,
            "max_batch": self.max_batch,
            "price_per_hour": self.price_per_hour,
            "flex_start": self.flex_start,
        }


def _billing(spot: bool) -> str:
    return "spot" if spot else "on-demand"


@dataclass(frozen=True, slots=True)
class Candidate:
    mode: str
    workers: tuple[WorkerPlan, ...]
    ps_count: int
    ps_machine_type: str
    ps_spot: bool
    ps_zone: str | None
    chief_machine_type: str | None  # None in sync mode, or async with the chief on worker 0 (no VM)
    chief_spot: bool
    chief_zone: str | None
    steps_per_s: float
    ps_capacity: float
    ps_load: float
    bottleneck: str
    base_time_s: float  # without revocations
    time_s: float = math.inf  # expected, with revocations
    revocation_overhead_s: float = 0.0
    expected_revocations: float = 0.0
    hourly_usd: float = 0.0
    cost_usd: float = math.inf
    feasible: bool = True
    reasons: tuple[str, ...] = ()
    risk_assumed: bool = False  # a GPU type without revocation data used the GPU mean
    strategy: str = "data"  # data | pipeline | hybrid (planner/strategies.py)
    strategies: tuple[Any, ...] = ()  # every strategy weighed for this cluster (planner.strategies.Strategy)

    # ---- views
    @property
    def gpus(self) -> list[str]:
        return [w.gpu for w in self.workers]

    @property
    def batches(self) -> list[int]:
        return [w.batch for w in self.workers]

    @property
    def spot(self) -> bool:
        return any(w.spot for w in self.workers)

    @property
    def zone(self) -> str | None:
        zones = {w.zone for w in self.workers}
        return zones.pop() if len(zones) == 1 else None

    @property
    def revocation_risk(self) -> float:
        """Probability of at least one revocation during the run (Poisson)."""
        return 1.0 - math.exp(-self.expected_revocations) if math.isfinite(self.expected_revocations) else 1.0

    @property
    def shape(self) -> tuple[Any, ...]:
        """The cluster regardless of zone: GPUs, batches, billing, PS count."""
        return (
            tuple((w.gpu, w.batch, w.spot) for w in self.workers),
            self.ps_count,
            self.ps_spot,
            self.chief_spot,
        )

    @property
    def billing(self) -> str:
        """The workers' billing: 'spot', 'on-demand', or 'spot + on-demand' for a cluster that mixes them."""
        kinds = dict.fromkeys(w.billing for w in self.workers)
        return " + ".join(kinds) or "on-demand"

    @property
    def label(self) -> str:
        counts: dict[tuple[str, str], int] = {}
        for w in self.workers:
            counts[(w.shown, w.billing)] = counts.get((w.shown, w.billing), 0) + 1
        roles = [(self.ps_count, "PS", _billing(self.ps_spot))] if self.ps_count else []
        if self.chief_machine_type is not None:
            roles.append((1, "chief", _billing(self.chief_spot)))
        where = f", {self.zone}" if self.zone else ""
        billings = {b for _, b in counts} | {b for _, _, b in roles}
        if len(billings) == 1:  # every VM billed alike: say it once
            gpus = " + ".join(f"{n}x {g}" for (g, _), n in counts.items())
            cpu = "".join(f", {n} {what}" for n, what, _ in roles if what == "PS")
            return f"{gpus}{cpu}{where}, {billings.pop()}"
        # Mixed billing: each group says its own (a V100 on-demand beside spot K80s is not "spot").
        gpus = " + ".join(f"{n}x {g} {b}" for (g, b), n in counts.items())
        cpu = "".join(f", {n} {what} {b}" if what == "PS" else f", {what} {b}" for n, what, b in roles)
        return f"{gpus}{cpu}{where}"

    def describe(self) -> str:
        """One line: the cluster, its batches, predicted time and cost."""
        t = f"{self.time_s / 3600:.2f} h" if math.isfinite(self.time_s) else "never finishes"
        cost = f"${self.cost_usd:,.2f}" if math.isfinite(self.cost_usd) else "unpriced"
        batches = "/".join(str(b) for b in dict.fromkeys(self.batches))
        load = f", PS load {self.ps_load:.0%}" if self.ps_count else ""
        return (
            f"{self.label}; batch {batches}; {self.steps_per_s:.1f} steps/s{load}; {t}, {cost} "
            f"(revocation risk {self.revocation_risk:.0%})"
        )

    def dominates(self, other: Candidate) -> bool:
        return (
            self.time_s <= other.time_s
            and self.cost_usd <= other.cost_usd
            and (self.time_s < other.time_s or self.cost_usd < other.cost_usd)
        )

    def to_cluster(self) -> Cluster:
        """The concrete cluster (every worker group with its batch), for ``spec.with_cluster``."""
        groups: list[WorkerGroup] = []
        run: list[WorkerPlan] = []

        def flush() -> None:
            if run:
                w = run[0]
                groups.append(
                    WorkerGroup(
                        gpu=w.gpu,
                        count=len(run),
                        spot=w.spot,
                        zone=w.zone,
                        machine_type=w.machine_type,
                        batch=w.batch,
                    )
                )
                run.clear()

        for w in self.workers:
            if run and (run[0].gpu, run[0].spot, run[0].zone, run[0].machine_type, run[0].batch) != (
                w.gpu,
                w.spot,
                w.zone,
                w.machine_type,
                w.batch,
            ):
                flush()
            run.append(w)
        flush()
        ps = ParameterServers(
            count=self.ps_count, machine_type=self.ps_machine_type, spot=self.ps_spot, zone=self.ps_zone
        )
        chief = Chief(
            machine_type=self.chief_machine_type or Chief().machine_type,
            spot=self.chief_spot,
            zone=self.chief_zone,
            on_worker0=self.mode == "async" and self.chief_machine_type is None,
        )
        return Cluster(parameter_servers=ps, chief=chief, workers=groups)

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "label": self.label,
            "mode": self.mode,
            "workers": [w.to_dict() for w in self.workers],
            "ps_count": self.ps_count,
            "ps_machine_type": self.ps_machine_type,
            "ps_spot": self.ps_spot,
            "ps_zone": self.ps_zone,
            "chief_machine_type": self.chief_machine_type,
            "chief_spot": self.chief_spot,
            "chief_zone": self.chief_zone,
            "steps_per_s": self.steps_per_s,
            "ps_capacity": num(self.ps_capacity),
            "ps_load": self.ps_load,
            "bottleneck": self.bottleneck,
            "base_time_s": num(self.base_time_s),
            "time_s": num(self.time_s),
            "revocation_overhead_s": num(self.revocation_overhead_s),
            "expected_revocations": num(self.expected_revocations),
            "revocation_risk": self.revocation_risk,
            "hourly_usd": self.hourly_usd,
            "cost_usd": num(self.cost_usd),
            "feasible": self.feasible,
            "reasons": list(self.reasons),
            "risk_assumed": self.risk_assumed,
            "strategy": self.strategy,
            "strategies": [st.to_dict() for st in self.strategies],
            "cluster": self.to_cluster().model_dump(mode="json"),
        }


class _NoStrategies:
    strategies: tuple[Any, ...] = ()


_NONE = _NoStrategies()


@dataclass(frozen=True)
class PlanResult:
    model: str
    mode: str
    objective: str
    train_steps: int
    candidates: tuple[Candidate, ...]  # every evaluated candidate, best first by the objective
    front: tuple[Candidate, ...]  # Pareto front of (time, cost), fastest first
    chosen: Candidate | None  # search: None when no candidate meets every constraint; pinned: the cluster
    feasible: bool  # the chosen candidate meets memory, pricing, budget and deadline
    best_infeasible: Candidate | None = None  # search without a feasible candidate: the closest miss
    budget_usd: float | None = None
    deadline_s: float | None = None
    elapsed_s: float = 0.0
    calibration: str = DEFAULT_CALIBRATION.name
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # e.g. a GPU's GCE end of support within the job's deadline

    def cluster(self) -> Cluster:
        if self.chosen is None:
            why = self.best_infeasible.reasons if self.best_infeasible else self.notes
            raise ValueError("the planner found no feasible cluster: " + "; ".join(why))
        return self.chosen.to_cluster()

    def runner_ups(self, top: int) -> list[Candidate]:
        """The next best candidates by the objective: the chosen cluster excluded, and of clusters that differ
        only in zone, the best zone only."""
        out: list[Candidate] = []
        seen = {self.chosen.shape} if self.chosen else set()
        for c in self.candidates:
            if len(out) >= top:
                break
            if c.shape not in seen:
                seen.add(c.shape)
                out.append(c)
        return out

    def to_dict(self, top: int = 8) -> dict[str, Any]:
        return {
            "model": self.model,
            "mode": self.mode,
            "objective": self.objective,
            "train_steps": self.train_steps,
            "feasible": self.feasible,
            "budget_usd": self.budget_usd,
            "deadline_s": self.deadline_s,
            "evaluated": len(self.candidates),
            "elapsed_s": self.elapsed_s,
            "calibration": self.calibration,
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "chosen": self.chosen.to_dict() if self.chosen else None,
            # how the chosen (else the closest) cluster would train: data parallel, pipeline, hybrid
            "strategies": [st.to_dict() for st in (self.chosen or self.best_infeasible or _NONE).strategies],
            "best_infeasible": self.best_infeasible.to_dict() if self.best_infeasible else None,
            "front": [c.to_dict() for c in self.front],
            "runner_ups": [c.to_dict() for c in self.runner_ups(top)],
        }

