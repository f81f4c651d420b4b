"""Planner: enumerate candidate clusters, predict their time and cost, return the Pareto front and a choice.

For each candidate (worker GPUs, per-worker batches, PS count, zone, spot or on-demand):

* compute step time per worker (compute.py), split of the batch (split.py) under memory caps (memory.py);
* cluster steps/s and PS load (cluster.py / comm.py); ``T0 = train_steps / steps_per_s`` (async: global
  steps, every worker step is one; sync: synchronous steps);
* expected revocation overhead (the default :class:`AnalyticScorer`): a spot instance is revoked at rate
  ``lambda`` (risk.py); a revoked worker costs the replacement boot delay (``replacement_boot_delay`` in
  data/cloud_facts.csv) of *its* throughput (async: the cluster rate lost while it is missing), a revoked
  sync worker, spot PS or spot chief stalls everything for that delay and rolls back half a checkpoint
  interval. With ``L = sum_i lambda_i * loss_i`` seconds lost per second, the expected time solves
  ``T = T0 + L T``, i.e. ``T = T0 / (1 - L)``; expected revocations ``sum_i lambda_i * T``;
* cost = hourly price of every instance (PS, chief, workers; price book with the spec's overrides) x T.

Candidates over ``policy.budget_usd`` or ``policy.deadline`` are kept but flagged infeasible. The front
is the set of feasible candidates no other feasible one beats on both time and cost; the choice is the
cheapest (``search.objective: cost``) or fastest (``time``) of it. Zones change only price and risk, so
the throughput of a worker set is computed once and reused for every zone and spot choice.

Hook for the simulator: any object with ``score(candidate, context) -> Score`` can replace the analytic
revocation model (``plan(..., scorer=...)``); it gets the failure-free prediction and returns the
expected time, cost and revocations.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from orchestrator.core import policy
from orchestrator.core.catalog import Catalog, CatalogError, PriceBook, load_catalog
from orchestrator.core.costmodel.accounting import local_worker_steps, run_accounting
from orchestrator.core.costmodel.batches import price_book_for, worker_batches
from orchestrator.core.costmodel.cluster import ClusterEstimate, estimate_from_compute
from orchestrator.core.costmodel.compute import DEFAULT_CALIBRATION, Calibration, StepTimeFn, step_fn
from orchestrator.core.costmodel.memory import max_batch
from orchestrator.core.costmodel.profiles import get_profile
from orchestrator.core.costmodel.risk import RevocationRates, load_revocation_rates
from orchestrator.core.costmodel.split import SplitError, min_max_split
from orchestrator.core.spec import (
    LOCAL_ZONE,
    Chief,
    Cluster,
    JobSpec,
    ParameterServers,
    TrainingMode,
    WorkerGroup,
)

LOCAL_MACHINE = "local"  # how non-cloud instances are priced (as the spec validation does)


# ---------------------------------------------------------------- results


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
        }


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
    def label(self) -> str:
        counts: dict[str, int] = {}
        for w in self.workers:
            # A multi-GPU machine type names its shape: 2x h100 (a3-highgpu-4g) is 8 H100s.
            multi = load_catalog().gpus_per_instance(w.machine_type) > 1
            shown = f"{w.gpu} ({w.machine_type})" if multi else w.gpu
            counts[shown] = counts.get(shown, 0) + 1
        gpus = " + ".join(f"{n}x {g}" for g, n in counts.items())
        ps = f", {self.ps_count} PS" if self.ps_count else ""
        where = f", {self.zone}" if self.zone else ""
        return f"{gpus}{ps}{where}, {'spot' if self.spot else 'on-demand'}"

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
            "cluster": self.to_cluster().model_dump(mode="json"),
        }


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
            "chosen": self.chosen.to_dict() if self.chosen else None,
            "best_infeasible": self.best_infeasible.to_dict() if self.best_infeasible else None,
            "front": [c.to_dict() for c in self.front],
            "runner_ups": [c.to_dict() for c in self.runner_ups(top)],
        }


# ---------------------------------------------------------------- scoring hook


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
        for i, w in enumerate(candidate.workers):
            if not w.spot:
                continue
            lam = context.rates.hazard_per_s(w.gpu, w.zone) * context.time_scale
            assumed = assumed or context.rates.assumed(w.gpu)
            hazard += lam
            if candidate.mode == "sync" or (chief_on_w0 and i == 0):  # worker 0 takes the chief down
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
        if loss >= 1.0:
            return Score(math.inf, math.inf, math.inf, math.inf, assumed)
        t = t0 / (1.0 - loss)
        return Score(t, candidate.hourly_usd * t / 3600.0, hazard * t, t - t0, assumed)


# ---------------------------------------------------------------- enumeration


@dataclass(frozen=True)
class _Slot:
    gpu: str
    spot: bool
    zone: str | None
    machine_type: str | None
    batch: int | None


@dataclass(frozen=True)
class _Layout:
    """A cluster shape before evaluation."""

    workers: tuple[_Slot, ...]
    ps_count: int
    ps_machine_type: str
    ps_spot: bool
    ps_zone: str | None
    chief_machine_type: str | None
    chief_spot: bool
    chief_zone: str | None
    pinned: bool = False


def _compositions(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """Ways to write n as an ordered sum of k positive integers."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(k))


def _worker_sets(gpus: Sequence[str], lo: int, hi: int, mixed: bool) -> list[tuple[str, ...]]:
    types = list(dict.fromkeys(gpus))
    out: list[tuple[str, ...]] = []
    for n in range(lo, hi + 1):
        out += [(g,) * n for g in types]
        if mixed:
            for k in (2, 3):
                for combo in itertools.combinations(types, k):
                    for parts in _compositions(n, k):
                        out.append(tuple(g for g, p in zip(combo, parts, strict=True) for _ in range(p)))
    return out


def _search_zones(spec: JobSpec, catalog: Catalog) -> list[str | None]:
    search = spec.search
    assert search is not None
    if search.zones:
        return list(search.zones)
    if spec.provider.is_cloud:
        if spec.provider.allowed_zones:
            return list(spec.provider.allowed_zones)
        zones: dict[str, None] = {}
        for g in search.gpus:
            zones.update(dict.fromkeys(catalog.zones_for(g)))
        return list(zones)
    return [None]


def _pinned_zone(spec: JobSpec, catalog: Catalog, zone: str | None, gpu: str | None) -> str | None:
    """Where the controller puts an instance the spec leaves unplaced: the first allowed zone offering it."""
    if zone is not None or not spec.provider.is_cloud:
        return zone
    offered = catalog.zones_for(gpu) if gpu else catalog.all_zones()
    return next((z for z in spec.provider.allowed_zones if z in offered), None)


def _offered(catalog: Catalog, gpus: set[str], zone: str | None) -> bool:
    return zone is None or zone == LOCAL_ZONE or all(zone in catalog.zones_for(g) for g in gpus)


# ---------------------------------------------------------------- the planner


class _Evaluator:
    """Per-plan caches: step-time functions, memory caps, splits and cluster estimates."""

    def __init__(self, spec: JobSpec, catalog: Catalog, calibration: Calibration, book: PriceBook) -> None:
        self.spec = spec
        self.catalog = catalog
        self.calibration = calibration
        self.book = book
        self.model = spec.training.profile_name
        self.profile = get_profile(self.model)
        self.mode = str(TrainingMode(spec.mode))
        self.cloud = spec.provider.is_cloud
        self.train_steps = spec.training.train_steps
        self.accounting = run_accounting(spec, catalog, calibration)  # boot, checkpoints, teardown: as the sim
        self._fns: dict[str, StepTimeFn] = {}
        self._caps: dict[str, int] = {}
        self._batches: dict[tuple[tuple[str, int | None], ...], tuple[list[int], str | None]] = {}
        self._estimates: dict[tuple[Any, ...], ClusterEstimate] = {}
        self._prices: dict[tuple[str, str | None, bool], float | str] = {}

    def fn(self, gpu: str) -> StepTimeFn:
        if gpu not in self._fns:
            self._fns[gpu] = step_fn(self.model, gpu, self.calibration, self.catalog)
        return self._fns[gpu]

    def cap(self, gpu: str) -> int:
        if gpu not in self._caps:
            self._caps[gpu] = max_batch(self.model, gpu, self.catalog)
        return self._caps[gpu]

    def gpus_per_instance(self, machine: str) -> int:
        return self.catalog.gpus_per_instance(machine) if self.cloud else 1

    def price(self, machine: str, gpu: str | None, spot: bool) -> float | str:
        """USD/h, or the reason it has no price."""
        key = (machine if self.cloud else LOCAL_MACHINE, gpu, spot)
        if key not in self._prices:
            try:
                self._prices[key] = self.book.instance_price(key[0], gpu, 1 if gpu else 0, spot)
            except CatalogError as exc:
                self._prices[key] = str(exc)
        return self._prices[key]

    def pinned_batches(self) -> tuple[list[int], str | None]:
        """A pinned cluster runs the batches the controller computes (``orchestrator.core.slots``)."""
        try:
            out = list(worker_batches(self.spec, self.catalog))
        except SplitError as exc:
            n = self.spec.worker_count
            return [max(1, (self.spec.training.global_batch or n) // n)] * n, str(exc)
        return out, self._check_caps([g.gpu for g in self.spec.pinned.workers for _ in range(g.count)], out)

    def _check_caps(self, gpus: Sequence[str], batches: Sequence[int]) -> str | None:
        for g, b in zip(gpus, batches, strict=True):
            if b > self.cap(g):
                return f"batch {b} does not fit {g} memory (at most {self.cap(g)} for {self.model})"
        return None

    def batches(self, slots: Sequence[tuple[str, int | None]]) -> tuple[list[int], str | None]:
        """Per-worker batches of a searched cluster and an error, if the batch cannot be placed.

        async: ``training.batch_per_worker`` or, with ``training.global_batch``, the split that equalises
        step times, else the profile's default; sync: the global batch (``global_batch``, or the per-worker
        batch times the workers) split so the slowest worker is fastest.
        """
        key = tuple(slots)
        if key in self._batches:
            return self._batches[key]
        tr = self.spec.training
        n = len(slots)
        fixed = [b for _, b in slots]
        free = [i for i, b in enumerate(fixed) if b is None]
        out = [b or 0 for b in fixed]
        err: str | None = None
        if free:
            per_worker = tr.batch_per_worker or (None if tr.global_batch else self.profile.default_batch)
            if self.mode == "async" and per_worker is not None:
                for i in free:
                    out[i] = per_worker
            else:
                total = tr.global_batch or (per_worker or self.profile.default_batch) * n
                remaining = total - sum(b for b in fixed if b is not None)
                gpus = [slots[i][0] for i in free]
                longest = max(1, remaining - len(free) + 1)
                tables = {g: self.fn(g).table(max(0, min(self.cap(g), longest))) for g in set(gpus)}
                try:
                    split = min_max_split([tables[g] for g in gpus], remaining)
                    for i, b in zip(free, split, strict=True):
                        out[i] = b
                except SplitError as exc:
                    err = str(exc)
                    for i in free:
                        out[i] = max(1, remaining // len(free))
        if err is None:
            err = self._check_caps([g for g, _ in slots], out)
        self._batches[key] = (out, err)
        return out, err

    def estimate(
        self,
        gpus: tuple[str, ...],
        batches: tuple[int, ...],
        machines: tuple[str, ...],
        ps_count: int,
        ps_machine: str,
        zones: tuple[str | None, ...],
        ps_zone: str | None,
    ) -> ClusterEstimate:
        # Zones matter only when they differ (round trips); one-zone clusters share one estimate.
        spread = len(set(zones) | ({ps_zone} if ps_count else set())) > 1
        key = (
            gpus,
            batches,
            machines,
            ps_count,
            ps_machine,
            zones if spread else (),
            ps_zone if spread else None,
        )
        est = self._estimates.get(key)
        if est is None:
            if self.spec.provider.emulates_gpus:  # emulated GPUs: host CPU + measured curves
                compute_s = local_worker_steps(self.spec, gpus, batches, self.calibration)
            else:
                compute_s = [self.fn(g).at(float(b)) for g, b in zip(gpus, batches, strict=True)]
            est = estimate_from_compute(
                self.model,
                compute_s,
                machines,
                ps_count,
                ps_machine,
                self.mode,
                self.calibration,
                self.catalog,
                worker_zones=zones if spread else None,
                ps_zone=ps_zone if spread else None,
            )
            self._estimates[key] = est
        return est

    def evaluate(self, layout: _Layout) -> Candidate:
        slots = layout.workers
        machines = tuple(s.machine_type or self.catalog.gpu(s.gpu).default_machine_type for s in slots)
        # A machine type with k GPUs (a3-highgpu-2g) is one instance, priced once, that trains as k
        # GPU-workers (one process per GPU): the estimate sees k copies, each at the per-GPU batch.
        owner = [i for i, m in enumerate(machines) for _ in range(self.gpus_per_instance(m))]
        gpus = tuple(slots[i].gpu for i in owner)
        if layout.pinned:
            # Batches are per GPU; a global batch the controller splits per instance is shared by its GPUs.
            per_slot, err = self.pinned_batches()
            split = self.spec.training.global_batch is not None
            batches = [max(1, per_slot[i] // self.gpus_per_instance(machines[i])) if split else per_slot[i]
                       for i in owner]
        else:
            batches, err = self.batches([(slots[i].gpu, slots[i].batch) for i in owner])
        zones = tuple(slots[i].zone for i in owner)
        est = self.estimate(
            gpus, tuple(batches), tuple(machines[i] for i in owner), layout.ps_count, layout.ps_machine_type,
            zones, layout.ps_zone,
        )
        reasons: list[str] = [err] if err else []
        hourly = 0.0
        workers = []
        for i, (s, m) in enumerate(zip(slots, machines, strict=True)):
            copies = [j for j, o in enumerate(owner) if o == i]
            first, b = copies[0], batches[copies[0]]
            p = self.price(m, s.gpu, s.spot)
            if isinstance(p, str):
                reasons.append(p)
                p = math.inf
            hourly += p
            workers.append(
                WorkerPlan(
                    s.gpu,
                    b,
                    s.spot,
                    s.zone,
                    m,
                    est.compute_s[first],
                    est.comm_s[first],
                    sum(est.worker_steps_per_s[j] for j in copies),
                    sum(est.shares[j] for j in copies),
                    self.cap(s.gpu),
                    p,
                )
            )
        cpu = [(layout.ps_machine_type, layout.ps_spot)] * layout.ps_count
        if layout.chief_machine_type is not None:
            cpu.append((layout.chief_machine_type, layout.chief_spot))
        for machine, spot in cpu:
            p = self.price(machine, None, spot)
            if isinstance(p, str):
                reasons.append(p)
                p = math.inf
            hourly += p
        rate = est.steps_per_s
        return Candidate(
            mode=self.mode,
            workers=tuple(workers),
            ps_count=layout.ps_count,
            ps_machine_type=layout.ps_machine_type,
            ps_spot=layout.ps_spot,
            ps_zone=layout.ps_zone,
            chief_machine_type=layout.chief_machine_type,
            chief_spot=layout.chief_spot,
            chief_zone=layout.chief_zone,
            steps_per_s=rate,
            ps_capacity=est.ps_capacity,
            ps_load=est.ps_load,
            bottleneck=est.bottleneck,
            base_time_s=self.accounting.failure_free_s(
                self.train_steps, self.spec.training.checkpoint_every, rate,
                layout.ps_spot or layout.chief_spot or all(s.spot for s in slots)),
            hourly_usd=hourly,
            feasible=not reasons,
            reasons=tuple(dict.fromkeys(reasons)),
        )


def _layouts(spec: JobSpec, catalog: Catalog) -> Iterator[_Layout]:
    mode = spec.mode
    cluster = spec.cluster
    if cluster is not None:
        slots = tuple(
            _Slot(g.gpu, g.spot, _pinned_zone(spec, catalog, g.zone, g.gpu), g.machine_type, g.batch)
            for g in cluster.workers
            for _ in range(g.count)
        )
        ps, ch = cluster.parameter_servers, cluster.chief
        is_async = mode == TrainingMode.ASYNC
        yield _Layout(
            slots,
            spec.ps_count,
            ps.machine_type,
            ps.spot,
            _pinned_zone(spec, catalog, ps.zone, None),
            ch.machine_type if is_async and not ch.on_worker0 else None,
            ch.spot,
            _pinned_zone(spec, catalog, ch.zone, None),
            pinned=True,
        )
        return
    search = spec.search
    assert search is not None
    ps_default, chief_default = ParameterServers(), Chief()
    ps_counts = range(1, search.max_ps + 1) if mode == TrainingMode.ASYNC else range(0, 1)
    chief_machine = chief_default.machine_type if mode == TrainingMode.ASYNC else None
    zones = _search_zones(spec, catalog)
    for worker_set in _worker_sets(search.gpus, search.min_workers, search.max_workers, search.mixed):
        types = set(worker_set)
        for zone in zones:
            if not _offered(catalog, types, zone):
                continue
            for slots in _shapes(spec, catalog, worker_set, zone, search.spot):
                for n_ps in ps_counts:
                    yield _Layout(
                        slots,
                        n_ps,
                        ps_default.machine_type,
                        ps_default.spot,
                        zone,
                        chief_machine,
                        chief_default.spot,
                        zone,
                    )


def _shapes(
    spec: JobSpec, catalog: Catalog, worker_set: tuple[str, ...], zone: str | None, spots: Sequence[bool]
) -> Iterator[tuple[_Slot, ...]]:
    """The workers as one instance per GPU (the GPU's default type) and, on gce, packed into each
    accelerator-optimized type whose fixed GPU count divides them (8 x H100 = 4 x a3-highgpu-2g)."""
    packings: list[tuple[str | None, int]] = [(None, 1)]
    if spec.provider.is_cloud and len(set(worker_set)) == 1:
        gpu = worker_set[0]
        default = catalog.gpu(gpu).default_machine_type
        packings += [(m.name, m.gpu_count) for m in catalog.machine_types_for(gpu)
                     if m.name != default and m.gpu_count > 1 and len(worker_set) % m.gpu_count == 0]
    for spot in spots:
        for machine, k in packings:
            yield tuple(_Slot(g, spot, zone, machine, None) for g in worker_set[::k])


def pareto_front(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Candidates no other beats on both time and cost (one of each tie), fastest first."""
    finite = [c for c in candidates if math.isfinite(c.time_s) and math.isfinite(c.cost_usd)]
    finite.sort(key=lambda c: (c.time_s, c.cost_usd))
    front: list[Candidate] = []
    best_cost = math.inf
    for c in finite:
        if c.cost_usd < best_cost:
            front.append(c)
            best_cost = c.cost_usd
    return front


def _objective_key(objective: str) -> Callable[[Candidate], tuple[bool, float, float]]:
    if objective == "time":
        return lambda c: (not c.feasible, c.time_s, c.cost_usd)
    return lambda c: (not c.feasible, c.cost_usd, c.time_s)


def score_candidates(
    candidates: Sequence[Candidate],
    context: PlanContext,
    scorer: Scorer,
    budget_usd: float | None,
    deadline_s: float | None,
) -> list[Candidate]:
    out = []
    for c in candidates:
        s = scorer.score(c, context)
        reasons = list(c.reasons)
        if not math.isfinite(s.time_s):
            reasons.append("no progress: zero throughput, or revocations outpace training")
        if budget_usd is not None and s.cost_usd > budget_usd:
            reasons.append(f"cost ${s.cost_usd:,.2f} is over the budget ${budget_usd:,.2f}")
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


def plan_context(
    spec: JobSpec, catalog: Catalog | None = None, calibration: Calibration | None = None
) -> PlanContext:
    cat = catalog or load_catalog()
    book = price_book_for(spec, cat)
    delay = policy.BOOT_S
    scale = 1.0
    if spec.provider.emulates_gpus:  # wall seconds: boot / time_scale, then the task's start-up
        acc = run_accounting(spec, cat, calibration)
        delay, scale = acc.boot_s + acc.startup_s, spec.provider.time_scale
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


def calibration_note(spec: JobSpec, calib: Calibration, best: Candidate | None) -> str:
    """Which calibration (and how many measured points) stands behind each GPU's step time."""
    if spec.provider.emulates_gpus:
        src = (f"calibration {calib.name} (fitted on {calib.local_host.get('jobs', 0):.0f} local jobs)"
               if calib.local_host else "data/local_host.csv")
        return (f"step times: this host's measured CPU step and start-up ({src}) + the emulated GPUs' measured "
                "curves (orchestrator.core.emulation); no GPU calibration")
    gpus = dict.fromkeys(best.gpus if best else [])
    model = spec.training.profile_name
    return "calibration: " + "; ".join(f"{g}: {calib.describe(g, model=model)}" for g in gpus)


def plan(
    spec: JobSpec,
    catalog: Catalog | None = None,
    calibration: Calibration | None = None,
    scorer: Scorer | None = None,
) -> PlanResult:
    """Evaluate the pinned cluster, or every candidate of ``spec.search``; see the module docstring."""
    started = time.perf_counter()
    context = plan_context(spec, catalog, calibration)
    cat = context.catalog
    calib = calibration or DEFAULT_CALIBRATION
    ev = _Evaluator(spec, cat, calib, context.book)
    base = [ev.evaluate(layout) for layout in _layouts(spec, cat)]
    notes: list[str] = []
    if not base:
        notes.append("no candidate: no allowed zone offers the GPU types searched")
    policy = spec.policy
    scored = score_candidates(base, context, scorer or AnalyticScorer(), policy.budget_usd, policy.deadline)
    objective = spec.search.objective if spec.search is not None else "cost"
    scored.sort(key=_objective_key(objective))
    feasible = [c for c in scored if c.feasible]
    front = pareto_front(feasible or scored)
    if not feasible and scored:
        notes.append("no candidate meets every constraint; the front and the choice below are infeasible")
    key = _objective_key(objective)
    best = min(front, key=key) if front else (scored[0] if scored else None)
    # A pinned cluster is what will run: it is the choice even when it breaks the budget or deadline.
    # From a search, only a feasible candidate is chosen; the best infeasible one is reported apart.
    chosen = best if (best is not None and (best.feasible or spec.cluster is not None)) else None
    best_infeasible = best if chosen is None else None
    if best is not None and best.risk_assumed:
        notes.append("no revocation data for some GPU types: their risk is the mean of the measured types")
    notes.append(calibration_note(spec, calib, best))
    return PlanResult(
        model=ev.model,
        mode=ev.mode,
        objective=objective,
        train_steps=ev.train_steps,
        candidates=tuple(scored),
        front=tuple(front),
        chosen=chosen,
        feasible=bool(chosen and chosen.feasible),
        best_infeasible=best_infeasible,
        budget_usd=policy.budget_usd,
        deadline_s=policy.deadline,
        elapsed_s=time.perf_counter() - started,
        calibration=calib.name,
        notes=tuple(notes),
    )


__all__ = [
    "AnalyticScorer",
    "Candidate",
    "PlanContext",
    "PlanResult",
    "Score",
    "Scorer",
    "WorkerPlan",
    "pareto_front",
    "plan",
    "plan_context",
    "score_candidates",
]
