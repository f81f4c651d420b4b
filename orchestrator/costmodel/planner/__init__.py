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

The parts: ``layouts`` (the clusters to evaluate, packing included), ``evaluate`` (a layout's rate, time
and price), ``scoring`` (expected time and cost under revocations), ``candidates`` (the result types);
here, the search that ties them together and the choice.

``steps``: the job's step model, chosen once above the cost model and handed to every part (the local provider's
emulated GPUs, ``providers.local.step_model``, run on this host's wall clock); not given: the cost model's.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence

from orchestrator.clock import WALL
from orchestrator.costmodel.batches import job_precision, job_runtime, trained_gpus
from orchestrator.costmodel.compute import DEFAULT_CALIBRATION, Calibration, runtime_key
from orchestrator.costmodel.crossgpu import arch_gpu
from orchestrator.costmodel.planner.candidates import Candidate, PlanResult
from orchestrator.costmodel.planner.evaluate import LOCAL_MACHINE, Evaluator
from orchestrator.costmodel.planner.layouts import layouts
from orchestrator.costmodel.planner.scoring import AnalyticScorer, Scorer, plan_context, score_candidates
from orchestrator.costmodel.planner.strategies import DATA, HYBRID, PIPELINE
from orchestrator.costmodel.stepmodel import COST_STEPS, StepModel
from orchestrator.model.blocks import BlockLike
from orchestrator.model.catalog import Catalog, Price, PriceBook
from orchestrator.model.offerings import lifecycle_warnings, unverified_price_notes
from orchestrator.model.spec import JobSpec, TrainingMode
from orchestrator.model.timings import gce_boot_note
from orchestrator.model.torch_spec import is_pytorch, is_run_job, replica_groups


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



def calibration_note(spec: JobSpec, calib: Calibration, best: Candidate | None,
                     steps: StepModel | None = None) -> str:
    """Which calibration (and how many measured points) stands behind each GPU's step time."""
    if (steps or COST_STEPS).wall_clock:
        src = (f"calibration {calib.name} (fitted on {calib.local_host.get('jobs', 0):.0f} local jobs)"
               if calib.local_host.get("jobs") else "data/local_host.csv")
        return (f"step times: this host's measured CPU step and start-up ({src}) + the emulated GPUs' measured "
                "curves (orchestrator.providers.local.emulation); no GPU calibration")
    gpus = dict.fromkeys(best.gpus if best else [])
    model = spec.training.profile_name
    runtime, precision = job_runtime(spec.training), job_precision(spec.training)
    return f"calibration ({runtime}, {precision}): " + "; ".join(
        f"{g}: {calib.describe(g, runtime_key(runtime, precision), model, precision)}" for g in gpus)


def price_rows(book: PriceBook, c: Candidate, cloud: bool) -> list[tuple[str, Price]]:
    """The price rows a candidate's instances are priced from (as ``Evaluator.price`` reads them)."""
    instances: list[tuple[str, str | None]] = [(w.machine_type, w.gpu) for w in c.workers]
    instances += [(c.ps_machine_type, None)] * c.ps_count
    if c.chief_machine_type is not None:
        instances.append((c.chief_machine_type, None))
    return [row for machine, gpu in instances
            for row in book.rows_for(machine if cloud else LOCAL_MACHINE, gpu, 1 if gpu else 0)]


def plan_warnings(
    spec: JobSpec, cat: Catalog, c: Candidate | None, book: PriceBook, today: dt.date | None = None
) -> list[str]:
    """What a user must know before trusting the plan: a price that is a placeholder or unconfirmed (never
    passed off as fact), a GPU whose GCE retirement / end of support falls within the job's deadline (or
    its predicted time)."""
    if c is None:
        return []
    prices = unverified_price_notes(book, price_rows(book, c, spec.provider.is_cloud))
    if not spec.provider.is_cloud:
        return prices
    deadline = spec.policy.deadline
    predicted = c.time_s if math.isfinite(c.time_s) else 0.0
    horizon, why = (deadline, "its deadline") if deadline and deadline >= predicted else (predicted, "predicted")
    return (prices + idle_gpu_warnings(spec, cat, c) + precision_warnings(spec, c)
            + lifecycle_warnings(cat, list(c.gpus), today or WALL.now().date(), horizon, why))


_UNITS = {"tf32": "TF32", "amp": "FP16", "bf16": "BF16"}


def precision_warnings(spec: JobSpec, c: Candidate) -> list[str]:
    """GPUs that lack the tensor units of the job's ``training.precision``: they run it at FP32 speed at best (the
    plan predicts FP32), and for bf16 the 16-bit unit they do have is named."""
    precision = job_precision(spec.training)
    if precision not in _UNITS:
        return []
    out = []
    for gpu in sorted(set(c.gpus)):
        try:
            arch = arch_gpu(gpu)
        except KeyError:
            continue
        if arch.tensor_peak(precision) > arch.fp32_tflops * 1e12:
            continue
        hint = ("; precision: amp (FP16 mixed) uses its FP16 tensor cores"
                if precision == "bf16" and arch.fp16_tflops > arch.fp32_tflops else "")
        out.append(f"{gpu} ({arch.arch}) has no {_UNITS[precision]} tensor cores: training.precision {precision} "
                   f"runs at FP32 speed at best there (the plan predicts it at its FP32 peak){hint}")
    return out


def idle_gpu_warnings(spec: JobSpec, cat: Catalog, c: Candidate) -> list[str]:
    """Machine types whose GPUs the payload does not all train on (a pipeline stage: one process a VM), paid for
    idle."""
    out = []
    for machine in sorted({w.machine_type for w in c.workers}):
        paid, used = cat.gpus_per_instance(machine), trained_gpus(spec, cat, machine)
        if paid > used:
            how = ("a torchft replica group", "training.fault_tolerance: torchrun") if replica_groups(spec) else (
                "a pipeline stage", "data parallelism")
            out.append(f"{machine} carries {paid} GPUs but {how[0]} trains on {used} of them (one process a VM; "
                       f"the plan counts {used}): pick a 1-GPU machine type, or {how[1]}")
    return out


def plan(
    spec: JobSpec,
    catalog: Catalog | None = None,
    calibration: Calibration | None = None,
    scorer: Scorer | None = None,
    blocks: Sequence[BlockLike] = (),
    today: dt.date | None = None,
    steps: StepModel | None = None,
) -> PlanResult:
    """Evaluate the pinned cluster, or every candidate of ``spec.search``; see the module docstring. ``blocks``:
    stockouts and quotas in force (the blocks table), which placement avoids; ``today``: the day the job would start
    (GCE retirement dates are checked against it); ``steps``: the job's step model."""
    started = WALL.monotonic()  # the planner's own compute time, reported as elapsed_s: real time
    context = plan_context(spec, catalog, calibration, steps)
    cat, calib = context.catalog, calibration or DEFAULT_CALIBRATION
    ev = Evaluator(spec, cat, calib, context.book, steps)
    base = [ev.evaluate(layout) for layout in layouts(spec, cat, blocks)]
    notes: list[str] = []
    if blocks:
        notes.append(f"placement avoided {len(blocks)} block(s) in force: "
                     + "; ".join(f"{b.scope} {b.location} ({b.resource})" for b in blocks[:5]))
    if not base:
        notes.append("no candidate: no allowed zone offers the GPU types searched"
                     + (" that no stockout or quota block rules out" if blocks else ""))
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
    notes.append(calibration_note(spec, calib, best, steps))
    if boot := gce_boot_note(spec):
        notes.append(boot)
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
        elapsed_s=WALL.monotonic() - started,
        calibration=calib.name,
        notes=tuple(notes),
        warnings=tuple(plan_warnings(spec, cat, best, context.book, today)),
    )




def chosen_strategy(spec: JobSpec, catalog: Catalog | None = None, calibration: Calibration | None = None,
                    steps: StepModel | None = None) -> str:
    """How ``plan`` runs the spec's pinned cluster: data, pipeline or hybrid. Only synchronous jobs weigh strategies,
    and on a wall-clock step model (emulated GPUs) only an explicit ``parallelism: pipeline`` makes a pipeline (the
    planner weighs none there)."""
    parallelism = str(getattr(spec.training, "parallelism", DATA))
    if spec.mode != TrainingMode.SYNC or parallelism == DATA or spec.cluster is None:
        return DATA
    if (steps or COST_STEPS).wall_clock and parallelism != PIPELINE:
        return DATA
    chosen = plan(spec, catalog, calibration, steps=steps).chosen
    return chosen.strategy if chosen is not None else DATA


def launch_strategy(spec: JobSpec, chosen: Candidate | None) -> str | None:
    """What a launch runs for the planner's ``chosen`` candidate: the built-in PyTorch job runs the plan's strategy
    (a hybrid as its plain pipeline: the job runs one stage a node); TensorFlow jobs and ``run:`` scripts run data
    parallel, or nothing (None) where the model does not fit a worker."""
    planned = chosen.strategy if chosen is not None else DATA
    if is_pytorch(spec) and not is_run_job(spec) and planned in (PIPELINE, HYBRID):
        return PIPELINE
    data = next((s for s in (chosen.strategies if chosen is not None else ()) if s.name == DATA), None)
    return None if data is not None and not data.fits else DATA


__all__ = ["calibration_note", "chosen_strategy", "launch_strategy", "pareto_front", "plan", "plan_warnings",
           "price_rows"]
