"""JobSpec -> SimCluster: slots with prices (price book), zones, batches and step rates (cost model).

This is the only module of ``orchestrator.sim`` that uses the cost model; it imports it lazily so
the engine works (with explicit step rates) without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from orchestrator.catalog import Catalog, load_catalog
from orchestrator.sim.engine import RateFn, SimCluster, SimSlot
from orchestrator.spec import Cluster, GceProvider, JobSpec, LocalProvider, RevocationMode, TrainingMode

DEFAULT_MODEL_MB = 2.0
PREEMPTIBLE_BOOKS = frozenset({"2019-02"})  # books from the era of 24 h-capped preemptible VMs


class SimSpecError(ValueError):
    """The spec cannot be simulated as it is; the message says what to do."""


def _costmodel() -> Any:
    try:
        import orchestrator.costmodel as cm
    except ImportError as exc:  # pragma: no cover - the cost model ships with the package
        raise SimSpecError(f"the cost model is not available ({exc}); pass explicit step_rates") from None
    missing = [f for f in ("predict_step_time", "cluster_steps_per_s", "split_batch") if not hasattr(cm, f)]
    if missing:
        raise SimSpecError(
            f"orchestrator.costmodel lacks {', '.join(missing)}; pass explicit step_rates (steps/s per GPU)"
        )
    return cm


def model_size_mb(profile: str) -> float:
    """Checkpoint size in MB: the cost-model profile's parameter bytes, or 2 MB if there is no profile."""
    try:
        from orchestrator.costmodel.profiles import get_profile

        return float(get_profile(profile).param_bytes) / 1e6
    except (ImportError, LookupError, AttributeError, ValueError):
        return DEFAULT_MODEL_MB


def local_boot_delay_s(provider: LocalProvider, facts: Mapping[str, float]) -> float:
    """Wall seconds the local provider takes to boot an instance: the cloud boot delay / time_scale."""
    return facts.get("replacement_boot_delay", 70.0) / provider.time_scale


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
) -> SimCluster:
    """Build the simulation of ``spec``'s pinned cluster (or ``cluster``).

    ``step_rates`` (GPU key -> steps/s of one worker at its batch) bypass the cost model; the
    cluster rate is then the async/sync default rule with ``ps_capacity_steps_per_s`` (default:
    unlimited). ``preemptible`` (24 h cap on spot VMs) defaults to True for the 2019-02 price book
    (that era's preemptible VMs) and False otherwise (today's spot VMs have no cap).
    """
    from orchestrator.slots import expand, price_book_for

    if cluster is not None:
        spec = spec.with_cluster(cluster)
    if spec.cluster is None:
        raise SimSpecError(
            f"spec '{spec.name}' does not pin a cluster (it only gives search:); run `orchestrator plan` "
            "on it and simulate the cluster it picks (write it under cluster:), or pass a cluster"
        )
    cat = catalog or load_catalog()
    book = price_book_for(spec, cat, price_book)
    slots = expand(spec, cat, price_book)
    training = spec.training
    profile = training.profile_name
    mode = spec.mode.value
    cloud = isinstance(spec.provider, GceProvider)
    allowed = spec.provider.zones if isinstance(spec.provider, GceProvider) else []

    cm = None if step_rates is not None else _costmodel()
    sim_slots: list[SimSlot] = []
    for s in slots:
        od_price = book.instance_price(s.machine_type, s.gpu, 1 if s.gpu else 0, False)
        rate = 0.0
        batch = s.batch or 0
        if s.gpu is not None:
            if step_rates is not None:
                if s.gpu not in step_rates:
                    raise SimSpecError(
                        f"no step rate for GPU '{s.gpu}'; step_rates has {', '.join(step_rates)}"
                    )
                rate = float(step_rates[s.gpu])
            else:
                assert cm is not None
                rate = 1.0 / float(cm.predict_step_time(profile, s.gpu, batch, calibration))
        alt: tuple[str, ...] = ()
        if cloud and s.gpu is not None:
            offered = cat.zones_for(s.gpu)
            alt = tuple(z for z in allowed if z in offered and z != s.zone)
        sim_slots.append(
            SimSlot(
                name=s.name,
                role=s.role.value,
                gpu=s.gpu,
                zone=s.zone,
                spot=s.spot,
                price_per_hour=s.price_per_hour,
                on_demand_price_per_hour=od_price,
                step_rate=rate,
                batch=batch,
                replacement_zones=alt,
            )
        )

    rate_fn: RateFn | None = None
    if cm is not None:
        rate_fn = _cost_model_rate_fn(cm, spec, sim_slots, calibration)

    facts = cat.facts
    mb = model_mb if model_mb is not None else model_size_mb(profile)
    schedule: tuple[tuple[str, float], ...] | None = None
    provider = spec.provider
    if isinstance(provider, LocalProvider):
        if provider.revocations == RevocationMode.NONE:
            schedule = ()
        elif provider.revocations == RevocationMode.SCHEDULE:
            # Like the local provider: only spot instances, only a slot's first instance, and at_s
            # taken as seconds of simulated time after the start.
            spot_slots = {s.name for s in sim_slots if s.spot}
            schedule = tuple((r.instance, r.at_s) for r in provider.schedule if r.instance in spot_slots)
    book_name = price_book or spec.pricing.book
    boot_s = facts.get("replacement_boot_delay", 70.0)
    spot_extra_s = facts.get("preemptible_extra_staging", 15.0)
    if isinstance(provider, LocalProvider):
        # The local provider boots every instance in boot_delay / time_scale wall seconds, spot or not.
        boot_s, spot_extra_s = local_boot_delay_s(provider, facts), 0.0
    return SimCluster(
        slots=tuple(sim_slots),
        train_steps=training.train_steps,
        mode=mode,
        ps_capacity_steps_per_s=ps_capacity_steps_per_s if ps_capacity_steps_per_s is not None else math.inf,
        rate_fn=rate_fn,
        checkpoint_every=training.checkpoint_every,
        checkpoint_cost_s=facts.get("checkpoint_write_base", 3.75)
        + facts.get("checkpoint_write_per_mb", 0.02) * mb,
        policy=spec.policy.on_revocation.value,
        max_replacements=spec.policy.max_replacements,
        budget_usd=spec.policy.budget_usd,
        deadline_s=spec.policy.deadline,
        boot_delay_s=boot_s,
        spot_extra_boot_s=spot_extra_s,
        preemptible=(book_name in PREEMPTIBLE_BOOKS) if preemptible is None else preemptible,
        name=spec.name,
        model_mb=mb,
        schedule=schedule,
    )


def _cost_model_rate_fn(cm: Any, spec: JobSpec, slots: list[SimSlot], calibration: object | None) -> RateFn:
    """Cluster steps/s for a set of live workers, from the cost model (memoised by the live GPU mix)."""
    profile = spec.training.profile_name
    mode = spec.mode.value
    ps_count = spec.ps_count
    ps_machine = spec.pinned.parameter_servers.machine_type
    global_batch = spec.training.global_batch
    resplit = global_batch is not None and spec.mode == TrainingMode.SYNC
    cache: dict[tuple[tuple[str, int], ...], float] = {}

    def rate(live: tuple[int, ...]) -> float:
        pairs = tuple(sorted((slots[i].gpu or "", slots[i].batch) for i in live))
        if pairs in cache:
            return cache[pairs]
        gpus = [g for g, _ in pairs]
        if resplit:
            batches = [int(b) for b in cm.split_batch(profile, gpus, global_batch, calibration)]
        else:
            batches = [b for _, b in pairs]
        value = float(cm.cluster_steps_per_s(profile, gpus, batches, ps_count, ps_machine, mode, calibration))
        cache[pairs] = value
        return value

    return rate
