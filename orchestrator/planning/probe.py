"""`orchestrator probe SPEC`: which points to measure, and what each probe is predicted to cost, before anything is
created.

A point is (GPU type, machine type, precision). The points worth measuring are those of the plan's choice
and of every runner-up whose predicted interval (the plan's own, ``costmodel.interval``) overlaps the choice's: a
measurement may change the ranking only there. Each point is measured at two batches where memory allows
(:func:`second_batch`: the planned batch and double it where the memory model says it fits, else half it), so
the curve the batch split and the memory-capped batch choice read passes through two measured steps
(``measured.through_two``). A batch a probe measured already is not measured again; at most ``max_probes``
points are kept, in the plan's rank order. Each probe is one batch of one point (its own VM: the payloads read
their batch once, at start): the user's own job (same payload, same images) cut to one worker on spot
(on-demand where the GPU has no spot price), in the cheapest zone the plan priced it,
``WARMUP_STEPS`` + ``TIMED_STEPS`` steps, logged every ``LOG_EVERY`` steps, never checkpointed. Their predicted
costs add up against ``policy.budget_usd``: past it, the probe is refused before anything is created.
``control.probe_run`` runs them through the normal launch path and folds what they measured."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.costmodel import Calibration, Candidate, PlanResult
from orchestrator.costmodel.batches import job_precision, job_runtime, memory_params
from orchestrator.costmodel.compute import runtime_key
from orchestrator.costmodel.launch_plan import LaunchPlan
from orchestrator.costmodel.measured import measured_at
from orchestrator.costmodel.memory import max_batch
from orchestrator.model.errors import UserError
from orchestrator.model.spec import (
    Chief,
    Cluster,
    JobSpec,
    OnRevocation,
    ParameterServers,
    Policy,
    RevocationMode,
    TrainingMode,
    WorkerGroup,
)
from orchestrator.model.specfile import short
from orchestrator.planning.admission import AdmitOptions, admit, read_spec
from orchestrator.planning.calibration import planning_calibration
from orchestrator.planning.judge import PlanRefused, judge

WARMUP_STEPS = 10  # the first steps build the graph, fill the input pipeline and warm the caches: not timed
TIMED_STEPS = 30
LOG_EVERY = 5  # a window's step time per LOG_EVERY steps: TIMED_STEPS / LOG_EVERY windows give the spread
NO_CHECKPOINT = 10_000_000  # checkpoint_every past the probe's last step


@dataclass(frozen=True)
class ProbePoint:
    """One point to measure, its probe job and what the cost model predicts of that job."""

    gpu: str
    machine_type: str
    precision: str
    batch: int
    spot: bool
    zone: str | None
    spec: JobSpec  # the probe's own job: the user's payload on one worker
    plan: LaunchPlan
    predicted_step_s: float
    predicted_time_s: float
    predicted_cost_usd: float

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "machine_type": self.machine_type, "precision": self.precision, "batch": self.batch,
                "spot": self.spot, "zone": self.zone, "predicted_step_ms": self.predicted_step_s * 1e3,
                "predicted_wall_s": self.predicted_time_s, "predicted_cost_usd": self.predicted_cost_usd}


@dataclass(frozen=True)
class ProbePlan:
    """What `probe` would create: the points, and those it leaves out (measured already, past --max-probes)."""

    spec: JobSpec  # the user's spec as admitted
    points: tuple[ProbePoint, ...]
    skipped: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    @property
    def total_cost_usd(self) -> float:
        return sum(p.predicted_cost_usd for p in self.points)

    @property
    def total_time_s(self) -> float:
        return sum(p.predicted_time_s for p in self.points)


def plan_probes(spec_path: Path, max_probes: int = 4,
                profile: Callable[[Any, Path], None] | None = None) -> ProbePlan:
    """Admit the spec (as `launch` does: the provider's set-up, the secrets), pick the points and predict their
    probes; refuses (``UserError``, exit 2) past ``policy.budget_usd``. Creates nothing."""
    if max_probes < 1:
        raise UserError("--max-probes: give at least 1")
    try:
        admitted = admit(spec_path, AdmitOptions("probe", profile=profile))
        spec, result, calibration = admitted.spec, admitted.judged.result, admitted.calibration
        rel = float((admitted.interval or {}).get("relative", 0.0))
        warnings = admitted.warnings
    except PlanRefused as refused:  # the plan breaks the policy as predicted: a measurement may say otherwise
        spec = read_spec(spec_path)
        result, calibration, rel, warnings = refused.result, planning_calibration(spec), 0.0, refused.warnings
    label = short(str(spec_path), 200)
    wanted, skipped = candidate_points(spec, result, calibration, rel)
    kept = list(dict.fromkeys((g, m) for g, m, *_ in wanted))[:max_probes]
    points = [_probe_point(spec, p, calibration, label) for p in wanted if (p[0], p[1]) in kept]
    skipped += [f"{g} {m} {p} b{b}: past --max-probes {max_probes}" for g, m, p, b, *_ in wanted
                if (g, m) not in kept]
    planned = ProbePlan(spec, tuple(points), tuple(skipped), warnings)
    budget = spec.policy.budget_usd
    if budget is not None and planned.total_cost_usd > budget:
        raise UserError(f"policy.budget_usd: {len(points)} probe(s) are predicted to cost "
                        f"{planned.total_cost_usd:.4f} USD, past the budget of {budget:.4f} USD; nothing was created")
    return planned


Point = tuple[str, str, str, int, bool, str | None]  # gpu, machine type, precision, batch, spot, zone


def _objective(c: Candidate, objective: str) -> float:
    return c.time_s if objective == "time" else c.cost_usd


def ranked_overlapping(result: PlanResult, rel: float) -> list[Candidate]:
    """The choice (else the best infeasible cluster) and every candidate whose predicted interval overlaps it."""
    ranked = [c for c in result.candidates if math.isfinite(_objective(c, result.objective))]
    ranked.sort(key=lambda c: (not c.feasible, _objective(c, result.objective)))
    best = result.chosen or (ranked[0] if ranked else None)
    if best is None:
        return []
    high = _objective(best, result.objective) * (1 + rel)
    rest = [c for c in ranked if c is not best and c.feasible and _objective(c, result.objective) / (1 + rel) <= high]
    return [best, *rest]


def candidate_points(spec: JobSpec, result: PlanResult, calibration: Calibration | None,
                     rel: float) -> tuple[list[Point], list[str]]:
    """The probes of the overlapping candidates' points in rank order: each point's planned batches, then its
    second batch (:func:`second_batch`), each once, on spot and in its cheapest priced zone where the plan has
    one; batches measured already are left out (named in the second list)."""
    precision = job_precision(spec.training)
    rt = runtime_key(job_runtime(spec.training), precision)
    model = spec.training.profile_name
    found: dict[tuple[str, str], dict[int, list[tuple[bool, float, str | None]]]] = {}
    for c in ranked_overlapping(result, rel):
        for w in c.workers:
            found.setdefault((w.gpu, w.machine_type), {}).setdefault(w.batch, []).append(
                (w.spot, w.price_per_hour, w.zone))
    probes: list[tuple[str, str, int, list[tuple[bool, float, str | None]]]] = []
    for (gpu, machine), batches in found.items():
        offers = [o for per_batch in batches.values() for o in per_batch]
        second = second_batch(spec, gpu, min(batches))
        extra = {second: offers} if second is not None and second not in batches else {}
        probes += [(gpu, machine, b, o) for b, o in {**batches, **extra}.items()]
    points: list[Point] = []
    skipped: list[str] = []
    for gpu, machine, batch, offers in probes:
        if measured_at(calibration, gpu, rt, model, batch) is not None:
            skipped.append(f"{gpu} {machine} {precision} b{batch}: measured already")
            continue
        spot, _, zone = min(offers, key=lambda o: (not o[0], o[1]))  # spot first, then the cheapest zone
        points.append((gpu, machine, precision, batch, spot or spec.provider.emulates_gpus, zone))
    return points, skipped


def second_batch(spec: JobSpec, gpu: str, batch: int) -> int | None:
    """The point's second probed batch: double the planned one where the memory model (the spec's optimizer and
    precision: ``batches.memory_params``) says it fits the GPU, else half it; None at batch 1 with no room to
    double. A model the memory model does not know is halved: the planned batch is the only one known to fit."""
    try:
        cap = max_batch(spec.training.profile_name, gpu, None, memory_params(spec))
    except LookupError:  # UnknownModelError, or a GPU the catalog does not know
        cap = batch
    if 2 * batch <= cap:
        return 2 * batch
    return batch // 2 if batch >= 2 else None


def probe_spec(spec: JobSpec, gpu: str, machine_type: str | None, batch: int, spot: bool,
               zone: str | None) -> JobSpec:
    """The user's job on one worker of this point: same payload and images, a few steps, no checkpoint, no
    revocations of the local provider's own (a probe measures speed), no deadline; the budget is set at launch."""
    changes = {"train_steps": WARMUP_STEPS + TIMED_STEPS, "log_every": LOG_EVERY, "checkpoint_every": NO_CHECKPOINT,
               "eval_every": 0, "batch_per_worker": batch, "global_batch": None, "min_workers": None}
    fields = type(spec.training).model_fields
    training = spec.training.model_copy(update={k: v for k, v in changes.items() if k in fields})
    ps = spec.cluster.parameter_servers if spec.cluster is not None else ParameterServers()
    asynchronous = spec.mode == TrainingMode.ASYNC
    cluster = Cluster(parameter_servers=ps.model_copy(update={"count": 1 if asynchronous else 0, "spot": False}),
                      chief=Chief(on_worker0=True),  # the chief on the worker's VM: one VM a point (PS jobs: + 1 PS)
                      workers=[WorkerGroup(gpu=gpu, count=1, spot=spot, zone=zone,
                                           machine_type=machine_type if spec.provider.is_cloud else None)])
    provider = spec.provider
    if (local := provider.as_local()) is not None:
        provider = local.model_copy(update={"revocations": RevocationMode.NONE})
    name = f"{spec.name[:26]}-probe"
    return spec.model_copy(update={"name": name, "training": training, "cluster": cluster, "search": None,
                                   "provider": provider,
                                   "policy": Policy(on_revocation=OnRevocation.REPLACE, max_replacements=1)})


def _probe_point(spec: JobSpec, point: Point, calibration: Calibration | None, label: str) -> ProbePoint:
    gpu, machine, precision, batch, spot, zone = point
    try:
        probe = probe_spec(spec, gpu, machine, batch, spot, zone)
        judged = judge(probe, label, calibration)
    except UserError:
        if not spot:
            raise
        spot = False  # no spot price for this GPU here: on-demand
        probe = probe_spec(spec, gpu, machine, batch, spot, zone)
        judged = judge(probe, label, calibration)
    est = judged.estimate
    assert est is not None  # judge refuses a plan without a chosen cluster
    return ProbePoint(gpu, machine, precision, batch, spot, zone, judged.spec, judged.plan,
                      est.workers[0].step_time_s, est.time_s, est.cost_usd)
