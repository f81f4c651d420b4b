"""Evaluating a layout: per-worker batches, step times, PS load and prices -> a ``Candidate``.

Step times come from compute.py, batch splits from split.py under memory caps (memory.py), cluster
steps/s and PS load from cluster.py / comm.py; ``base_time_s`` (no revocations) from the run accounting the
simulator shares. Zones change only price and risk, so a worker set's estimate is cached and reused for
every zone and spot choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from orchestrator.costmodel.accounting import local_worker_steps, restore_s, run_accounting
from orchestrator.costmodel.batches import (
    even_split,
    gpu_batches,
    job_precision,
    job_runtime,
    memory_params,
    planned_total,
    trained_gpus,
    worker_batches,
)
from orchestrator.costmodel.cluster import ClusterEstimate, estimate_from_compute
from orchestrator.costmodel.compute import Calibration, FloatArray, StepTimeFn
from orchestrator.costmodel.memory import max_batch, memory_bytes
from orchestrator.costmodel.partition import Partitioner
from orchestrator.costmodel.pipeline_plan import plan_pipeline
from orchestrator.costmodel.planner.candidates import Candidate, WorkerPlan
from orchestrator.costmodel.planner.layouts import Layout
from orchestrator.costmodel.planner.strategies import DATA, Revocations, Strategy, choose, pipeline_strategies
from orchestrator.costmodel.profiles import get_profile
from orchestrator.costmodel.risk import load_revocation_rates
from orchestrator.costmodel.split import SplitError
from orchestrator.costmodel.stepmodel import COST_STEPS, StepModel, step_fn
from orchestrator.model import timings
from orchestrator.model.catalog import Catalog, CatalogError, PriceBook
from orchestrator.model.spec import JobSpec, TrainingMode

LOCAL_MACHINE = "local"  # how non-cloud instances are priced (as the spec validation does)


class Evaluator:
    """Per-plan caches: step-time functions, memory caps, splits and cluster estimates. ``steps``: the job's step
    model (a wall-clock one, the local provider's emulated GPUs: this host's CPU step plus the emulated sleeps)."""

    def __init__(self, spec: JobSpec, catalog: Catalog, calibration: Calibration, book: PriceBook,
                 steps: StepModel | None = None) -> None:
        self.spec = spec
        self.steps = steps or COST_STEPS
        self.catalog = catalog
        self.calibration = calibration
        self.book = book
        self.model = spec.training.profile_name
        self.runtime, self.precision = job_runtime(spec.training), job_precision(spec.training)
        self.profile = get_profile(self.model)
        self.mode = str(TrainingMode(spec.mode))
        self.cloud = spec.provider.is_cloud
        self.train_steps = spec.training.train_steps
        # boot, checkpoints, teardown: as the simulator's
        self.accounting = run_accounting(spec, catalog, calibration, steps=self.steps)
        self._fns: dict[str, StepTimeFn] = {}
        self._caps: dict[str, int] = {}
        self._batches: dict[tuple[tuple[str, int | None], ...], tuple[list[int], str | None]] = {}
        self._estimates: dict[tuple[Any, ...], ClusterEstimate] = {}
        self._prices: dict[tuple[str, str | None, bool], float | str] = {}
        self.memory = memory_params(spec)
        self.parallelism = str(getattr(spec.training, "parallelism", DATA))
        self._partitioner: Partitioner | None = None

    def fn(self, gpu: str) -> StepTimeFn:
        if gpu not in self._fns:
            self._fns[gpu] = step_fn(self.model, gpu, self.calibration, self.catalog, self.runtime,
                                     self.precision)
        return self._fns[gpu]

    def cap(self, gpu: str) -> int:
        if gpu not in self._caps:
            self._caps[gpu] = max_batch(self.model, gpu, self.catalog, self.memory)
        return self._caps[gpu]

    def gpus_per_instance(self, machine: str) -> int:
        return trained_gpus(self.spec, self.catalog, machine)

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
        """A pinned cluster runs the batches the controller computes (``orchestrator.costmodel.slots``)."""
        try:
            out = list(worker_batches(self.spec, self.catalog, self.calibration, self.steps))
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
        """Per-worker batches of a searched cluster by the pinned clusters' rule (``batches.gpu_batches``),
        and an error, if the batch cannot be placed (then each worker holds an even share, for the records)."""
        key = tuple(slots)
        if key in self._batches:
            return self._batches[key]
        gpus, fixed = [g for g, _ in slots], [b for _, b in slots]
        err: str | None = None
        try:
            out = gpu_batches(self.spec, gpus, self.calibration, self.catalog, fixed, self._table, self.steps)
        except SplitError as exc:
            err = str(exc)
            out = [max(1, (planned_total(self.spec) or len(slots)) // len(slots))] * len(slots)
        if err is None:
            err = self._check_caps(gpus, out)
        self._batches[key] = (out, err)
        return out, err

    def _table(self, gpu: str, longest: int) -> FloatArray:
        """This plan's cached step function, tabulated to the GPU's memory cap (``batches.split_total``)."""
        return self.fn(gpu).table(max(0, min(self.cap(gpu), longest)))

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
            if self.steps.wall_clock:  # emulated GPUs: host CPU + measured curves
                compute_s = local_worker_steps(self.spec, gpus, batches, self.calibration, steps=self.steps)
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

    def evaluate(self, layout: Layout) -> Candidate:
        """The layout's failure-free rate, time and hourly price; ``reasons`` say what makes it infeasible."""
        slots = layout.workers
        machines = tuple(s.machine_type or self.catalog.gpu(s.gpu).default_machine_type for s in slots)
        # A machine type with k GPUs (a3-highgpu-2g) is one instance, priced once, that trains as k
        # GPU-workers (one process per GPU): the estimate sees k copies, each at the per-GPU batch.
        owner = [i for i, m in enumerate(machines) for _ in range(self.gpus_per_instance(m))]
        batches, err = self._gpu_batches(layout, machines, owner)
        est = self.estimate(
            tuple(slots[i].gpu for i in owner), tuple(batches), tuple(machines[i] for i in owner), layout.ps_count,
            layout.ps_machine_type, tuple(slots[i].zone for i in owner), layout.ps_zone,
        )
        reasons: list[str] = [err] if err else []
        workers = self._worker_plans(layout, machines, owner, batches, est, reasons)
        hourly = sum([w.price_per_hour for w in workers] + self._cpu_prices(layout, reasons))
        rate, bottleneck, strategy = est.steps_per_s, est.bottleneck, DATA
        strategies: tuple[Strategy, ...] = ()
        if self.steps.wall_clock and self.parallelism == "pipeline":
            local = self._local_pipeline([(i, slots[i].gpu, machines[i]) for i in owner], sum(batches))
            if local is not None:
                rate, bottleneck, strategy, strategies = 1.0 / local.step_s, "pipeline stage", local.name, (local,)
        elif self._weighs(layout, err):
            gpus, gpu_machines = [slots[i].gpu for i in owner], [machines[i] for i in owner]
            rates = load_revocation_rates()
            hazards = tuple(rates.hazard_per_s(slots[i].gpu, slots[i].zone) if slots[i].spot else 0.0 for i in owner)
            picked, weighed = self._strategies(gpus, gpu_machines, batches, rate, err, hourly, slots, hazards)
            strategy, strategies = picked.name, tuple(weighed)
            if picked.name != DATA and picked.fits:
                rate, bottleneck = 1.0 / picked.step_s, f"{picked.name} stage"
                reasons = [r for r in reasons if r != err]
            elif not picked.fits and picked.name != DATA:
                reasons.append(f"no {self.parallelism} partition fits: {picked.detail}")
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
            bottleneck=bottleneck,
            base_time_s=self.accounting.failure_free_s(
                self.train_steps, self.spec.training.checkpoint_every, rate,
                layout.ps_spot or layout.chief_spot or all(s.spot for s in slots)),
            hourly_usd=hourly,
            feasible=not reasons,
            reasons=tuple(dict.fromkeys(reasons)),
            strategy=strategy,
            strategies=strategies,
        )

    def _local_pipeline(self, workers: list[tuple[int, str, str]], total: int) -> Strategy | None:
        """The pipeline a local job runs: stages sized to the emulated GPUs (costmodel/pipeline_plan.py)."""
        found = plan_pipeline(self.spec, workers, total, self.calibration, self.catalog, self.steps)
        if found is None:
            return None
        p = found.partition
        return Strategy("pipeline", p.step_s, max(p.memory_gb), math.nan, p.fits,
                        f"{p.stages} stages on emulated GPUs; {p.micro_batches} micro-batches of {p.micro_batch}", p)

    def _weighs(self, layout: Layout, err: str | None) -> bool:
        """Strategies are weighed for synchronous jobs: always for a pinned cluster; in a search, where data
        parallel does not fit or a pipeline is asked for (a partition per searched cluster would be slow)."""
        if self.mode != "sync" or self.steps.wall_clock:
            return False
        return layout.pinned or err is not None or self.parallelism == "pipeline"

    def _restore_s(self) -> float:
        """What a change of the world costs every rank (costmodel.accounting.restore_s)."""
        return restore_s(self.spec, self.accounting, self.steps.wall_clock)

    def _strategies(self, gpus: list[str], machines: list[str], batches: Sequence[int], rate: float,
                    err: str | None, hourly: float, slots: Sequence[Any], hazards: tuple[float, ...]
                    ) -> tuple[Strategy, list[Strategy]]:
        spot = all(s.spot for s in slots)
        total = sum(batches)
        acc = self.accounting
        risk = Revocations(hazards, acc.boot_s + acc.spot_extra_boot_s + acc.startup_s, self._restore_s(),
                           timings.notice_window_s(self.spec.provider))
        shares = [b / total for b in batches] if total > 0 else [0.0] * len(batches)

        def run_s(step_s: float) -> float:
            return acc.failure_free_s(self.train_steps, self.spec.training.checkpoint_every,
                                      1.0 / step_s if step_s > 0 else 0.0, spot)

        def usd(step_s: float) -> float:
            return run_s(step_s) * hourly / 3600.0

        def expected(s: Strategy) -> Strategy:
            t = risk.expected_s(s.name, run_s(s.step_s), shares) if s.fits else math.inf
            return replace(s, expected_s=t, expected_usd=t * hourly / 3600.0)

        need = max(memory_bytes(self.model, b, self.memory) for b in batches) / 1e9
        data_step = 1.0 / rate if rate > 0 else float("inf")
        optimizer = getattr(self.spec.training, "optimizer", "sgd")
        detail = (f"{err}; the whole model needs {need:.1f} GB per GPU with {optimizer} (weights, gradients, "
                  "optimizer state, activations)" if err else f"{len(gpus)} replicas, batches "
                  f"{'/'.join(map(str, batches))}")
        weighed = [Strategy(DATA, data_step, need, usd(data_step), err is None, detail)]
        if self._partitioner is None:
            self._partitioner = Partitioner(self.model, self.calibration, self.catalog, self.memory,
                                           runtime=self.runtime, precision=self.precision)
        for name, p in pipeline_strategies(self._partitioner, self.catalog, gpus, machines, total):
            if p is None:
                weighed.append(Strategy(name, float("inf"), float("inf"), float("inf"), False,
                                        "no order of the GPUs holds every stage in memory"))
                continue
            stages = ", ".join(f"{d.gpu}{'x' + str(d.width) if d.width > 1 else ''} layers {i}-{j - 1}"
                               for d, (i, j) in zip(p.devices, p.layer_ranges(), strict=True))
            weighed.append(Strategy(name, p.step_s, max(p.memory_gb), usd(p.step_s), p.fits,
                                    f"{p.stages} stages ({stages}); {p.micro_batches} micro-batches of "
                                    f"{p.micro_batch}", p))
        weighed = [expected(s) for s in weighed]
        picked = choose(self.parallelism, weighed)
        return picked, [picked, *sorted((s for s in weighed if s is not picked), key=lambda s: s.step_s)]

    def _gpu_batches(
        self, layout: Layout, machines: Sequence[str], owner: Sequence[int]
    ) -> tuple[list[int], str | None]:
        """Each GPU-worker's batch, and why the batches cannot be placed (None: they can)."""
        slots = layout.workers
        if not layout.pinned:
            return self.batches([(slots[i].gpu, slots[i].batch) for i in owner])
        # Batches are per GPU; a global batch the controller splits per instance is shared by its GPUs (evenly:
        # they are the same GPU), so the GPUs' batches still add up to it.
        per_slot, err = self.pinned_batches()
        if planned_total(self.spec) is None:  # each GPU trains its instance's batch
            return [per_slot[i] for i in owner], err
        shares = {i: even_split(per_slot[i], self.gpus_per_instance(machines[i])) for i in set(owner)}
        return [max(1, shares[i].pop(0)) for i in owner], err

    def _worker_plans(
        self, layout: Layout, machines: Sequence[str], owner: Sequence[int], batches: Sequence[int],
        est: ClusterEstimate, reasons: list[str],
    ) -> list[WorkerPlan]:
        """One plan per worker instance: its first GPU's batch and step time, its rate and all its GPUs' share. A
        synchronous instance's GPUs step together (its rate is theirs); an asynchronous one's each count."""
        plans = []
        for i, (s, m) in enumerate(zip(layout.workers, machines, strict=True)):
            copies = [j for j, o in enumerate(owner) if o == i]
            first = copies[0]
            price = self._priced(m, s.gpu, s.spot, reasons)
            rates = [est.worker_steps_per_s[j] for j in copies]
            plans.append(WorkerPlan(
                s.gpu, batches[first], s.spot, s.zone, m, est.compute_s[first], est.comm_s[first],
                min(rates) if self.spec.mode == TrainingMode.SYNC else sum(rates), sum(est.shares[j] for j in copies),
                self.cap(s.gpu), price, flex_start=s.flex_start,
            ))
        return plans

    def _cpu_prices(self, layout: Layout, reasons: list[str]) -> list[float]:
        """USD/h of each parameter server and of the chief's own VM (none when it runs on worker 0)."""
        cpu = [(layout.ps_machine_type, layout.ps_spot)] * layout.ps_count
        if layout.chief_machine_type is not None:
            cpu.append((layout.chief_machine_type, layout.chief_spot))
        return [self._priced(machine, None, spot, reasons) for machine, spot in cpu]

    def _priced(self, machine: str, gpu: str | None, spot: bool, reasons: list[str]) -> float:
        """USD/h; an instance without a price adds why to ``reasons`` and costs infinity."""
        price = self.price(machine, gpu, spot)
        if isinstance(price, str):
            reasons.append(price)
            return math.inf
        return price
