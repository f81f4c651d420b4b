"""``plan``'s deadline outlook: each deadline policy on real availability traces with the planned work, and at
the prediction interval's slow end, as the daemon replans once the job measured its pace; and the daemon's one
planning call for a deadline job's figures (``DeadlinePlans``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from orchestrator.costmodel import Calibration
from orchestrator.costmodel.slots import Slot, on_gpu
from orchestrator.decide.deadline_elastic import elastic_spot_workers
from orchestrator.decide.state import GpuMarket
from orchestrator.model import timings
from orchestrator.model.instances import Role
from orchestrator.model.spec import JobSpec, OnRevocation
from orchestrator.model.torch_spec import replica_groups
from orchestrator.planning.calibration import launched_calibration
from orchestrator.sim.availability import DeadlineFigures as DeadlineFigures  # the daemon's figures, re-exported
from orchestrator.sim.availability import (
    Job,
    Outlook,
    bundled_traces,
    deadline_figures,
    load_trace,
    on_gpu_figures,
)
from orchestrator.sim.deadline_outlook import Markets, outlook_rows
from orchestrator.sim.multizone import Market

if TYPE_CHECKING:  # the daemon's session; `plan` opens none
    from sqlalchemy.orm import Session


@dataclass(frozen=True)
class DeadlineOutlook:
    """``plan``'s view of a deadline spec: each policy on real traces with the predicted work and, where the plan
    has a prediction interval, with the work at its slow end (``slow_by``: the interval's relative half-width)."""

    job: Job
    rows: list[Outlook]
    traces: list[str]
    slow_by: float | None = None
    slow_rows: list[Outlook] = field(default_factory=list)


def deadline_outlook(spec: JobSpec, slow_by: float | None = None,
                     calibration: Calibration | None = None) -> DeadlineOutlook | None:
    """``plan``'s view of an ``on_revocation: deadline`` spec: each policy's mean cost and chance of meeting
    the deadline on the spec's own availability trace (local provider) or the bundled ones; None otherwise.
    ``slow_by``: also with the work that much longer (the prediction interval's slow end), as the daemon plans
    once the job has measured its pace (control/deadline.measured_step_s)."""
    if spec.policy.on_revocation != OnRevocation.DEADLINE or spec.policy.deadline is None:
        return None
    local, elastic = spec.provider.as_local(), elastic_spot_workers(spec)
    # A spec of its own traces replays them; a gce job the daemon runs elastic, the bundled traces that counted the
    # spot VMs (16-node: gce's advice counts them too); any other, the bundled ones that asked for one.
    paths = list(local.traces.values()) if local is not None and local.traces else bundled_traces(
        counted=bool(elastic))
    fig = deadline_figures(spec, calibration=calibration)
    scale = fig.time_scale / 60.0
    # Replica groups (torchft) lose a quorum's pause where torchrun restarts the world: the elastic replay charges it.
    change = timings.TORCHFT_PAUSE_S * scale if elastic and replica_groups(spec) else None
    job = Job(max(1, round(fig.work_s * scale)), max(1, round(spec.policy.deadline * scale)),
              round(fig.overhead_s * scale), fig.spot_usd_per_h, fig.on_demand_usd_per_h, change_min=change)
    traces = [load_trace(p) for p in paths]
    # Zones replayed together (zone_availability_traces): also the policy that moves between them, as the daemon;
    # GPU types replayed with the job's own (gpu_availability_traces, policy.also_gpus): the one moving between them.
    zoned = local is not None and bool(local.zone_availability_traces)
    typed = {g: local.gpu_availability_traces[g] for g in spec.policy.also_gpus
             if local is not None and g in local.gpu_availability_traces}
    markets = Markets(traces, zoned, tuple((Market(*on_gpu_figures(spec, g, fig.work_s, calibration=calibration)),
                                            load_trace(path)) for g, path in typed.items()), elastic)
    found = DeadlineOutlook(job, outlook_rows(job, markets), [p.name for p in paths])
    if slow_by is None or slow_by <= 0:
        return found
    slow = replace(job, work_min=max(1, round(job.work_min * (1 + slow_by))))
    return replace(found, slow_by=slow_by, slow_rows=outlook_rows(slow, markets))


class DeadlinePlans:
    """The daemon's deadline figures of each job, planned once per job in this layer (the daemon's pass never
    calls the planner itself): the work, restart overhead and prices the job was planned with at launch, with the
    calibration it launched with (``planning.calibration``'s one rule), its decision tick, and the GPU types of
    ``policy.also_gpus`` as planned. A job's figures are fixed at launch, so they are kept, by (job id, created),
    in this object: a daemon (or a test) that starts anew makes a fresh one."""

    def __init__(self, max_cached: int = 256) -> None:
        self._figures: dict[tuple[str, float], tuple[DeadlineFigures, float]] = {}
        self._markets: dict[tuple[str, float], tuple[GpuMarket, ...]] = {}
        self._max = max_cached

    def clear(self) -> None:
        self._figures.clear()
        self._markets.clear()

    def figures(self, session: Session, job_id: str, created_at: float, spec: JobSpec
                ) -> tuple[DeadlineFigures, float]:
        """The job's planned figures and its decision tick (seconds of its clock)."""
        key = (job_id, created_at)
        found = self._figures.get(key)
        if found is None:
            fig = deadline_figures(spec, calibration=launched_calibration(session, spec, created_at))
            local = spec.provider.as_local()
            if local is not None and local.traces:  # the replayed traces' pace (one tick length: spec validation)
                tick = load_trace(next(iter(local.traces.values()))).gap_s / local.time_scale
            else:
                tick = timings.DEADLINE_TICK_S / fig.time_scale
            if len(self._figures) >= self._max:
                self._figures.clear()
            found = self._figures[key] = (fig, tick)
        return found

    def gpu_markets(self, session: Session, job_id: str, created_at: float, spec: JobSpec,
                    slots: Sequence[Slot]) -> tuple[GpuMarket, ...]:
        """The GPU types of ``policy.also_gpus`` as the job was planned: its spot workers moved there, planned with
        the calibration it launched with, give the speed (its predicted work over the work there) and the spot
        price."""
        if not spec.policy.also_gpus or not slots:  # no slots to move: no other market to choose
            return ()
        key = (job_id, created_at)
        found = self._markets.get(key)
        if found is None:
            work_s = self.figures(session, job_id, created_at, spec)[0].work_s
            launched_with = launched_calibration(session, spec, created_at)
            out = []
            for gpu in spec.policy.also_gpus:
                speed, price = on_gpu_figures(spec, gpu, work_s, calibration=launched_with)
                out.append(GpuMarket(gpu, speed, price, tuple(on_gpu(spec, s, gpu) for s in slots
                                                              if s.spot and s.role == Role.WORKER)))
            if len(self._markets) >= self._max:
                self._markets.clear()
            found = self._markets[key] = tuple(out)
        return found
