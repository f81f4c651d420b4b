"""``plan``'s deadline outlook: each deadline policy on real availability traces with the planned work, and at
the prediction interval's slow end, as the daemon replans once the job measured its pace."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from orchestrator.costmodel import Calibration
from orchestrator.decide.deadline_elastic import elastic_spot_workers
from orchestrator.model.spec import JobSpec, OnRevocation
from orchestrator.sim.availability import (
    Job,
    Outlook,
    bundled_traces,
    deadline_figures,
    load_trace,
    on_gpu_figures,
    outlook,
)
from orchestrator.sim.elastic import elastic_outlook
from orchestrator.sim.multizone import Market, zones_outlook


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
    job = Job(max(1, round(fig.work_s * scale)), max(1, round(spec.policy.deadline * scale)),
              round(fig.overhead_s * scale), fig.spot_usd_per_h, fig.on_demand_usd_per_h)
    traces = [load_trace(p) for p in paths]
    # Zones replayed together (zone_availability_traces): also the policy that moves between them, as the daemon;
    # GPU types replayed with the job's own (gpu_availability_traces, policy.also_gpus): the one moving between them.
    zoned = local is not None and bool(local.zone_availability_traces)
    typed = [g for g in spec.policy.also_gpus if local is not None and g in local.gpu_availability_traces]
    markets = (Market(), *(Market(*on_gpu_figures(spec, g, fig.work_s, calibration=calibration)) for g in typed))
    typed_traces = [*traces, *(load_trace(local.gpu_availability_traces[g]) for g in typed if local is not None)]


    def rows(j: Job) -> list[Outlook]:
        return outlook(j, traces) + ([zones_outlook(j, traces)] if zoned else []) + (
            [zones_outlook(j, typed_traces, markets=markets, name="deadline-markets")] if typed else []) + (
            [elastic_outlook(j, elastic, traces)] if elastic else [])

    found = DeadlineOutlook(job, rows(job), [p.name for p in paths])
    if slow_by is None or slow_by <= 0:
        return found
    slow = replace(job, work_min=max(1, round(job.work_min * (1 + slow_by))))
    return replace(found, slow_by=slow_by, slow_rows=rows(slow))
