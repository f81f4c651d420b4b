"""JobSpec -> SimCluster: slots with prices (price book), zones, batches and step rates (cost model).

This is the only module of ``orchestrator.sim`` that uses the cost model; the engine itself works with
explicit step rates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypedDict

from orchestrator.costmodel import (
    DEFAULT_CALIBRATION,
    Calibration,
    SplitError,
    get_profile,
    predict_step_time,
)
from orchestrator.costmodel.accounting import RunAccounting, local_worker_steps, restore_s, run_accounting
from orchestrator.costmodel.batches import job_precision, job_runtime, split_total, trained_gpus
from orchestrator.costmodel.cluster import estimate_from_compute
from orchestrator.costmodel.partition import Partitioner
from orchestrator.costmodel.pipeline_plan import partitioner_for, stage_devices
from orchestrator.costmodel.planner import chosen_strategy
from orchestrator.costmodel.planner.strategies import DATA, HYBRID, PIPELINE, pipeline_strategies
from orchestrator.costmodel.slots import Slot, expand, price_book_for
from orchestrator.costmodel.stepmodel import StepModel, step_fn
from orchestrator.model import timings
from orchestrator.model.catalog import Catalog, PriceBook, load_catalog
from orchestrator.model.spec import Cluster, JobSpec, LocalProvider, RevocationMode, TrainingMode
from orchestrator.providers.local import revocations as local_revocations
from orchestrator.providers.local.provider import PROGRESS_STEP_S, progress_clock_for
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.sim.engine import (
    RateFn,
    SimCluster,
    SimSlot,
)

DEFAULT_MODEL_MB = 2.0
PREEMPTIBLE_BOOKS = frozenset({"2019-02"})  # books from the era of 24 h-capped preemptible VMs


class SimSpecError(ValueError):
    """The spec cannot be simulated as it is; the message says what to do."""


def model_size_mb(profile: str) -> float:
    """Checkpoint size in MB: the cost-model profile's parameter bytes, or 2 MB if there is no profile."""
    try:
        return float(get_profile(profile).param_bytes) / 1e6
    except (LookupError, AttributeError, ValueError):
        return DEFAULT_MODEL_MB


def local_boot_delay_s(provider: LocalProvider, facts: Mapping[str, float]) -> float:
    """Wall seconds the local provider takes to boot an instance: the cloud boot delay / time_scale."""
    return timings.BOOT_S / provider.time_scale


def cluster_from_spec(
    spec: JobSpec,
    *,
    catalog: Catalog | None = None,
    price_book: str | None = None,
    cluster: Cluster | None = None,
    step_rates: Mapping[str, float] | None = None,
    ps_capacity_steps_per_s: float | None = None,
    preemptible: bool | None = None,
    model_mb: float | None = None,
    calibration: object | None = None,
    as_cloud: bool = False,
    strategy: str | None = None,
    stage_loss: str = "wait",
    steps: StepModel | None = None,
) -> SimCluster:
    """Build the simulation of ``spec``'s pinned cluster (or ``cluster``).

    ``step_rates`` (GPU key -> steps/s of one worker at its batch) bypass the cost model; the cluster rate is then
    the async/sync default rule with ``ps_capacity_steps_per_s`` (default: unlimited). ``preemptible`` (24 h cap on
    spot VMs) defaults to True for the 2019-02 price book (that era's preemptible VMs) and False otherwise.

    A local spec is simulated as the local run it will be (this host's CPU step plus the emulated GPUs' measured
    curves, boot / time_scale, lifetimes / time_scale, no 24 h cap, as the local provider draws them); ``as_cloud``
    simulates instead the cloud cluster it emulates (cost-model step rates, cloud boot, checkpoint and lifetimes).

    ``strategy`` (data | pipeline | hybrid; default: the one ``plan`` chooses for the cluster) sets how a sync job
    uses its workers: a pipeline steps only while every stage is up (``SimCluster.strategy``). ``stage_loss``: wait
    (every stage waits for the replacement: ``policy.stage_loss: wait``) or auto (re-partition over the
    survivors where ``costmodel.stage_loss`` predicts it cheaper). ``steps``: the job's step model, as the planner
    had it (default: ``providers.local.step_model.step_model_for``; ``as_cloud`` keeps its split and partition).
    """
    spec, cat = _pinned(spec, cluster), catalog or load_catalog()
    calib = calibration if isinstance(calibration, Calibration) else None
    steps = steps or step_model_for(spec, calib, cat)  # wall-clock (emulated GPUs): simulated as the local run
    local = steps.wall_clock and not as_cloud
    slots, sim_slots, rate_fn = _slots(spec, cat, price_book, step_rates, calib, local, steps)
    strategy = strategy or chosen_strategy(spec, cat, calib, steps)
    if strategy != DATA and step_rates is None:
        machines = {s.name: s.machine_type for s in slots}
        rate_fn = _pipeline_rate_fn(strategy, partitioner_for(spec, calib, cat, steps), cat, sim_slots, machines)
    mb = model_mb if model_mb is not None else model_size_mb(spec.training.profile_name)
    acc = run_accounting(spec, cat, calib, as_cloud=as_cloud, steps=steps)  # the planner's accounting
    if preemptible is None:  # the local provider draws lifetimes without the 24 h cap, in cloud seconds / time_scale
        preemptible = (price_book or spec.pricing.book) in PREEMPTIBLE_BOOKS and not local
    return SimCluster(
        slots=tuple(sim_slots),
        ps_capacity_steps_per_s=ps_capacity_steps_per_s if ps_capacity_steps_per_s is not None else math.inf,
        rate_fn=rate_fn,
        checkpoint_cost_s=acc.checkpoint_s if model_mb is None else timings.checkpoint_s(mb),
        **_spec_fields(spec),
        **_delays(spec, acc, local),
        preemptible=preemptible,
        time_scale=spec.provider.time_scale if local else 1.0,
        model_mb=mb,
        schedule=_revocation_schedule(spec, sim_slots, acc.boot_s + acc.startup_s),
        lifetime_fn=_seeded_lifetimes(spec, slots, sim_slots, acc.boot_s + acc.startup_s, steps) if local else None,
        strategy=strategy,
        stage_loss=stage_loss,
    )


def _pipeline_rate_fn(strategy: str, part: Partitioner, catalog: Catalog, slots: Sequence[SimSlot],
                      machines: Mapping[str, str]) -> RateFn:
    """Steps/s of the best partition (pipeline, or hybrid: a stage per GPU type) of the model over a set of live
    workers, at the cluster's global batch; 0 where none fits their memory (memoised by the set)."""
    global_batch = sum(s.batch for s in slots if s.role == "worker")
    cache: dict[tuple[int, ...], float] = {}

    def rate(live: tuple[int, ...]) -> float:
        key = tuple(sorted(live))
        if key not in cache:
            gpus = [slots[i].gpu or "" for i in key]
            ms = [machines[slots[i].name] for i in key]
            if strategy == HYBRID:
                found = dict(pipeline_strategies(part, catalog, gpus, ms, global_batch))
                p = found.get(HYBRID) or found.get(PIPELINE)  # survivors of one type each: a plain pipeline
            else:
                p = part.best(stage_devices(catalog, gpus, ms), global_batch)
            cache[key] = 1.0 / p.step_s if p is not None and p.fits and p.step_s > 0 else 0.0
        return cache[key]

    return rate


class _SpecFields(TypedDict):
    name: str
    train_steps: int
    mode: str
    checkpoint_every: int
    policy: str
    max_replacements: int
    budget_usd: float | None
    deadline_s: float | None
    objective: str


def _spec_fields(spec: JobSpec) -> _SpecFields:
    """The ``SimCluster`` fields the spec gives as they are: the training and its revocation policy."""
    return {"name": spec.name, "train_steps": spec.training.train_steps, "mode": spec.mode.value,
            "checkpoint_every": spec.training.checkpoint_every, "policy": spec.policy.on_revocation.value,
            "max_replacements": spec.policy.max_replacements, "budget_usd": spec.policy.budget_usd,
            "deadline_s": spec.policy.deadline,
            "objective": spec.search.objective if spec.search is not None else "cost"}


class _Delays(TypedDict):
    boot_delay_s: float
    spot_extra_boot_s: float
    startup_s: float
    rejoin_s: float
    regroup_s: float
    teardown_s: float
    notice_s: float


def _delays(spec: JobSpec, acc: RunAccounting, local: bool) -> _Delays:
    """The run's real-world delays (``SimCluster``): boot, and a local replacement task starts its framework again;
    in sync the whole world restarts instead (``regroup_s``), or with torchft replica groups the survivors only
    pause for the quorum: the planner's figure (costmodel.accounting.restore_s; a cloud torchrun world's restart was
    0 s here before, its start-up); a local revoked instance is billed through its notice window."""
    sync = spec.mode == TrainingMode.SYNC
    regroup = restore_s(spec, acc, local)
    return {"boot_delay_s": acc.boot_s, "spot_extra_boot_s": acc.spot_extra_boot_s,
            "startup_s": acc.startup_s, "rejoin_s": acc.startup_s if local and not sync else 0.0,
            "regroup_s": regroup if sync else 0.0, "teardown_s": acc.teardown_s,
            # A preempted VM runs (and bills) through the notice window it really has (30 s, 120 s if asked).
            "notice_s": timings.notice_window_s(spec.provider) / spec.provider.time_scale
            if local or spec.provider.is_cloud else 0.0}


def _pinned(spec: JobSpec, cluster: Cluster | None) -> JobSpec:
    """``spec`` with ``cluster`` (if given); a spec that still pins no cluster cannot be simulated."""
    if cluster is not None:
        spec = spec.with_cluster(cluster)
    if spec.cluster is None:
        raise SimSpecError(
            f"spec '{spec.name}' does not pin a cluster (it only gives search:); run `orchestrator plan` "
            "on it and simulate the cluster it picks (write it under cluster:), or pass a cluster"
        )
    return spec


def _slots(
    spec: JobSpec, catalog: Catalog, price_book: str | None, step_rates: Mapping[str, float] | None,
    calibration: Calibration | None, local: bool, steps: StepModel,
) -> tuple[list[Slot], list[SimSlot], RateFn | None]:
    """The cluster's slots, as the controller expands them and as the simulator sees them, and the cluster
    rate of a set of live workers (from the cost model; None: the engine's default rule on ``step_rates``)."""
    book = price_book_for(spec, catalog, price_book)
    slots = expand(spec, catalog, price_book, steps=steps)
    use_cost_model = step_rates is None and not local
    if local and step_rates is None:
        step_rates = _local_step_rates(spec, slots, calibration, steps)
    on_w0 = spec.mode == TrainingMode.ASYNC and spec.pinned.chief.on_worker0
    if on_w0:  # the chief lives on worker 0's VM: no slot of its own, worker 0 is critical
        slots = [s for s in slots if s.role.value != "chief"]
    sim_slots = [_sim_slot(spec, s, book, catalog, step_rates, calibration, on_w0) for s in slots]
    if not use_cost_model:
        return slots, sim_slots, None
    machines = {s.name: s.machine_type for s in slots}
    return slots, sim_slots, _cost_model_rate_fn(spec, sim_slots, calibration, machines, catalog, steps)


def _local_step_rates(spec: JobSpec, slots: Sequence[Slot], calibration: Calibration | None, steps: StepModel
                      ) -> dict[str, float]:
    """Emulated GPUs: steps/s of each GPU type from this host's CPU step plus the measured curves."""
    workers = [s for s in slots if s.gpu is not None]
    times = local_worker_steps(spec, [s.gpu or "" for s in workers], [s.batch or 0 for s in workers], calibration,
                               steps=steps)
    rates: dict[str, float] = {}
    for s, t in zip(workers, times, strict=True):
        rates.setdefault(s.gpu or "", 1.0 / t)
    return rates


def _sim_slot(
    spec: JobSpec, s: Slot, book: PriceBook, catalog: Catalog, step_rates: Mapping[str, float] | None,
    calibration: Calibration | None, on_w0: bool,
) -> SimSlot:
    """One slot as the simulator sees it: prices, its worker's own step rate, where a replacement may go."""
    alt: tuple[str, ...] = ()
    if spec.provider.is_cloud and s.gpu is not None:
        offered = catalog.zones_for(s.gpu)
        alt = tuple(z for z in spec.provider.allowed_zones if z in offered and z != s.zone)
    return SimSlot(
        name=s.name,
        role=s.role.value,
        gpu=s.gpu,
        zone=s.zone,
        spot=s.spot,
        price_per_hour=s.price_per_hour,
        on_demand_price_per_hour=book.instance_price(s.machine_type, s.gpu, 1 if s.gpu else 0, False),
        step_rate=_step_rate(spec, s, step_rates, calibration),
        batch=s.batch or 0,
        replacement_zones=alt,
        hosts_chief=on_w0 and s.role.value == "worker" and s.index == 0,
    )


def _step_rate(
    spec: JobSpec, s: Slot, step_rates: Mapping[str, float] | None, calibration: Calibration | None
) -> float:
    """A worker's own steps/s: given per GPU type, else the cost model's prediction; 0 for a CPU role."""
    if s.gpu is None:
        return 0.0
    if step_rates is None:
        return 1.0 / float(predict_step_time(spec.training.profile_name, s.gpu, s.batch or 0, calibration,
                                             job_runtime(spec.training), job_precision(spec.training)))
    if s.gpu not in step_rates:
        raise SimSpecError(f"no step rate for GPU '{s.gpu}'; step_rates has {', '.join(step_rates)}")
    return float(step_rates[s.gpu])


def _job_step_rate(spec: JobSpec, sim_slots: Sequence[SimSlot]) -> float:
    """Global steps/s of the whole cluster: the slowest worker sets a sync job's pace; async rates add up."""
    rates = [s.step_rate for s in sim_slots if s.role == "worker"]
    return (min(rates) if spec.mode == TrainingMode.SYNC else sum(rates)) or 1.0


def _revocation_schedule(
    spec: JobSpec, sim_slots: Sequence[SimSlot], until_training_s: float
) -> tuple[tuple[str, float], ...] | None:
    """A local spec's fixed revocations (none, or its schedule); None: lifetimes are drawn."""
    provider = spec.provider.as_local()
    if provider is None or provider.revocations == RevocationMode.MODEL:
        return None
    if provider.revocations == RevocationMode.NONE:
        return ()
    # Like the local provider: only spot instances, only a slot's first instance, and at_s
    # taken as seconds of simulated time after the start; at_step as the time training reaches that step.
    spot_slots = {s.name for s in sim_slots if s.spot}
    rate = _job_step_rate(spec, sim_slots)
    return tuple((r.instance, r.at_s if r.at_s is not None else until_training_s + (r.at_step or 0) / rate)
                 for r in provider.schedule if r.instance in spot_slots)


def _seeded_lifetimes(
    spec: JobSpec, slots: Sequence[Slot], sim_slots: Sequence[SimSlot], until_training_s: float, steps: StepModel
) -> Callable[[int, int], float] | None:
    """The local provider's own draws (``control.revocations``, seeded per job, slot and generation). It
    revokes on the training-progress clock: after ``revoke_after_s x nominal steps/s`` steps (nominal =
    the emulated sleeps alone); here that many steps at the simulated rate, after the instance is up and
    its task is training. None: the spec's revocations are not drawn (none, or a schedule)."""
    provider = spec.provider.as_local()
    if provider is None or provider.revocations != RevocationMode.MODEL:
        return None
    step_s = float(progress_clock_for(spec, slots, steps.sleep_s).get(PROGRESS_STEP_S, 0) or 0)
    rate = _job_step_rate(spec, sim_slots)
    by_name = {s.name: s for s in slots}

    def lifetime(slot: int, generation: int) -> float:
        s = by_name[sim_slots[slot].name]
        after = local_revocations.revoke_after_s(provider, s.role, s.index, generation, s.gpu, "local", True, None, 0.0)
        if after is None:
            return math.inf
        if step_s <= 0:  # no emulation: the provider stays on the wall clock
            return after
        return until_training_s + after / step_s / rate

    return lifetime


def _cost_model_rate_fn(
    spec: JobSpec, slots: list[SimSlot], calibration: Calibration | None, machines: Mapping[str, str],
    catalog: Catalog, steps: StepModel,
) -> RateFn:
    """Cluster steps/s for a set of live workers, from the cost model as the planner computes it (the
    workers' host machine types and the round trips between zones included; memoised by the live set)."""
    calib = calibration or DEFAULT_CALIBRATION
    ps_zone = next((s.zone for s in slots if s.role == "ps"), None)
    profile = spec.training.profile_name
    runtime, precision = job_runtime(spec.training), job_precision(spec.training)
    mode = spec.mode.value
    ps_count = spec.ps_count
    ps_machine = spec.pinned.parameter_servers.machine_type
    global_batch = spec.training.global_batch
    resplit = global_batch is not None and spec.mode == TrainingMode.SYNC
    cache: dict[tuple[int, ...], float] = {}

    spread = len({s.zone for s in slots}) > 1

    def rate(live: tuple[int, ...]) -> float:
        key = tuple(sorted(live))
        if key in cache:
            return cache[key]
        members = [slots[i] for i in key]
        # A machine type with k GPUs (a3-highgpu-2g) trains as k GPU-workers, as the planner counts it.
        per = [trained_gpus(spec, catalog, machines[s.name]) for s in members]
        owner = [i for i, k in enumerate(per) for _ in range(k)]
        gpus = [members[i].gpu or "" for i in owner]
        if global_batch is not None and resplit:
            try:
                batches = split_total(spec, gpus, global_batch, calibration, catalog, steps=steps)  # the planner's
            except SplitError:  # the survivors cannot hold the global batch: no step until the world grows back
                cache[key] = 0.0
                return 0.0
        else:
            batches = [members[i].batch for i in owner]
        compute = [step_fn(profile, g, calib, catalog, runtime, precision).at(float(b))
                   for g, b in zip(gpus, batches, strict=True)]
        est = estimate_from_compute(
            profile, compute, [machines[members[i].name] for i in owner], ps_count, ps_machine, mode, calib,
            catalog, worker_zones=[members[i].zone for i in owner] if spread else None,
            ps_zone=ps_zone if spread else None,
        )
        cache[key] = est.steps_per_s
        return est.steps_per_s

    return rate
