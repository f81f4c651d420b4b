"""`orchestrator simulate SPEC --availability-trace FILE`: finish by the deadline at the least cost, each
policy replayed on a measured spot availability trace (``sim.availability``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.cli.model_impl import planning_calibration
from orchestrator.cli.render import console, money, table
from orchestrator.core import policy
from orchestrator.core.costmodel import Calibration
from orchestrator.core.errors import UserError
from orchestrator.core.spec import JobSpec, OnRevocation, load_spec
from orchestrator.sim.availability import (
    HISTORY_H,
    AvailabilityTraceError,
    Job,
    Outlook,
    bundled_traces,
    deadline_figures,
    load_trace,
    outlook,
    saving_share,
    study,
)
from orchestrator.sim.elastic import run_elastic
from orchestrator.sim.from_spec import SimSpecError, cluster_from_spec
from orchestrator.sim.multizone import zones_outlook


def availability_command(specs: list[Path], trace_path: Path, start_tick: int, policy_name: str, json_out: bool,
                         work_h: float | None, deadline_h: float | None, overhead_min: float | None,
                         price_book: str | None, history_h: float | None = None) -> None:
    if len(specs) != 1:
        raise UserError("--availability-trace takes exactly one job spec",
                        hint="orchestrator simulate examples/local-deadline.yaml --availability-trace FILE.json")
    names = policy.DEADLINE_POLICIES if policy_name == "all" else (policy_name,)
    known = (*policy.DEADLINE_POLICIES, *policy.TRIAL_POLICIES, "elastic")
    if policy_name != "all" and policy_name not in known:
        raise UserError(f"--policy '{policy_name}' is not a policy; use one of: all, {', '.join(known)}")
    for flag, v in (("--work-h", work_h), ("--deadline-h", deadline_h), ("--restart-overhead-min", overhead_min),
                    ("--history-h", history_h)):
        if v is not None and not 0 <= v < 1e6:
            raise UserError(f"{flag} must be a number of hours/minutes between 0 and 1e6, not {v}")
    spec = load_spec(specs[0])
    try:
        trace = load_trace(trace_path)
        fig = deadline_figures(spec, price_book, planning_calibration(spec))  # as `plan` and `launch` plan it
    except AvailabilityTraceError as exc:
        raise UserError(str(exc)) from None
    except SimSpecError as exc:
        raise UserError(f"{specs[0]}: {exc}") from None
    scale = fig.time_scale / 60.0  # seconds of the job's clock -> minutes of the trace's (cloud) clock
    deadline_s = spec.policy.deadline
    if deadline_h is None and deadline_s is None:
        raise UserError("the spec has no policy.deadline; add one (e.g. deadline: 52h) or give --deadline-h")
    work = round(work_h * 60) if work_h is not None else round(fig.work_s * scale)
    dl = round(deadline_h * 60) if deadline_h is not None else round((deadline_s or 0.0) * scale)
    ovh = round(overhead_min) if overhead_min is not None else round(fig.overhead_s * scale)
    if work < 1 or dl < 1:
        raise UserError(f"work ({work} min) and deadline ({dl} min) must be at least a minute of cloud time")
    job = Job(work, dl, ovh, fig.spot_usd_per_h, fig.on_demand_usd_per_h)
    seen_h = HISTORY_H if history_h is None else history_h
    workers = 1
    try:
        if policy_name == "elastic":  # the cluster's workers shrink onto the spot VMs there are (sim.elastic)
            workers = len(cluster_from_spec(spec, price_book=price_book).slots)
            per_vm = replace(job, spot_usd_per_h=job.spot_usd_per_h / workers,
                             on_demand_usd_per_h=job.on_demand_usd_per_h / workers)
            outcomes = [run_elastic(per_vm, workers, trace, start_tick, ("elastic",))["elastic"]]
        else:
            outcomes = study(job, trace, start_tick, names, history_h=seen_h)
    except AvailabilityTraceError as exc:
        raise UserError(str(exc)) from None
    costs = {o.policy: o.cost_usd for o in outcomes}
    doc: dict[str, Any] = {
        "spec": spec.name, "trace": str(trace_path), "start_tick": start_tick, "tick_min": trace.tick_min,
        "work_h": work / 60, "deadline_h": dl / 60, "restart_overhead_h": ovh / 60,
        "spot_usd_per_h": fig.spot_usd_per_h, "on_demand_usd_per_h": fig.on_demand_usd_per_h,
        "policies": [o.as_dict() for o in outcomes],
        # the trace before start_tick the learning policies read (a launch's daemon reads only what earlier jobs in
        # its spot market recorded; plan's outlook reads none)
        "history_h": min(start_tick * trace.tick_min / 60, seen_h),
    }
    if policy_name == "elastic":
        doc["workers"] = workers  # the prices above stay the whole cluster's; the timeline's modes: "<spot>s+<od>od"
    if "on-demand" in costs and "optimal" in costs:
        for d in doc["policies"]:
            d["saving_share"] = saving_share(d["cost_usd"], costs["on-demand"], costs["optimal"])
    if json_out:
        print(json.dumps(doc, indent=2))
        return
    rows = [[o.policy, money(o.cost_usd), f"{o.finish_min / 60:.2f} h", "yes" if o.deadline_met else "MISSED",
             _share(d.get("saving_share")), _mix(o.as_dict())] for o, d in zip(outcomes, doc["policies"], strict=True)]
    console.print(table(
        f"{spec.name}: {work / 60:.2f} h of work, deadline {dl / 60:.2f} h, restart overhead {ovh} min, on "
        f"{trace.name} from tick {start_tick} ({money(fig.spot_usd_per_h)}/h spot, "
        f"{money(fig.on_demand_usd_per_h)}/h on-demand; the deadline policy has seen "
        f"{doc['history_h']:.4g} h of the trace before it{_history_hint(doc['history_h'])})",
        ["policy", "cost", "finish", "deadline", "share of saving", "timeline"], rows))


def _history_hint(seen_h: float) -> str:
    if seen_h <= 0:
        return ", as a launch's daemon that no earlier job in its spot market told anything"
    return ("; a launch's daemon sees only what earlier jobs in its spot market recorded: --history-h 0 replays a "
            "first job")


def _share(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _mix(d: dict[str, Any]) -> str:
    """The timeline in short: s(pot) o(n-demand) .(waiting) e(lastic membership), one letter per change."""
    letters = {"spot": "s", "on-demand": "o", "idle": ".", "done": "|"}
    return "".join(letters.get(c["mode"], "e") for c in d["timeline"])[:40]  # e: an elastic membership


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
    local = spec.provider.as_local()
    paths = list(local.traces.values()) if local is not None and local.traces else bundled_traces()
    fig = deadline_figures(spec, calibration=calibration)
    scale = fig.time_scale / 60.0
    job = Job(max(1, round(fig.work_s * scale)), max(1, round(spec.policy.deadline * scale)),
              round(fig.overhead_s * scale), fig.spot_usd_per_h, fig.on_demand_usd_per_h)
    traces = [load_trace(p) for p in paths]
    # Zones replayed together (zone_availability_traces): also the policy that moves between them, as the daemon.
    zoned = local is not None and bool(local.zone_availability_traces)

    def rows(j: Job) -> list[Outlook]:
        return outlook(j, traces) + ([zones_outlook(j, traces)] if zoned else [])

    found = DeadlineOutlook(job, rows(job), [p.name for p in paths])
    if slow_by is None or slow_by <= 0:
        return found
    slow = replace(job, work_min=max(1, round(job.work_min * (1 + slow_by))))
    return replace(found, slow_by=slow_by, slow_rows=rows(slow))


def print_outlook(found: DeadlineOutlook) -> None:
    job, rows = found.job, found.rows
    slow = {o.policy: o for o in found.slow_rows}
    head = ["policy", "mean cost", "P(deadline met)"]
    if slow:
        head += [f"cost, work +{found.slow_by:.0%}", f"P(met), work +{found.slow_by or 0.0:.0%}"]
    console.print(table(
        f"Deadline policies on measured spot availability ({', '.join(found.traces)}; {rows[0].runs} start times): "
        f"{job.work_min / 60:.2f} h of work, deadline {job.deadline_min / 60:.2f} h, restart overhead "
        f"{job.overhead_min} min (cloud time); deadline as the daemon runs a first job, learning spot only during "
        f"it (on gce, a later job in the same zones also learns from what earlier ones saw in the 24 h before it)"
        + (f"; the last two columns: the work at the prediction interval's slow end (+{found.slow_by:.0%}), as the "
           "daemon plans once the job has measured its pace" if slow else "")
        + "".join(f"; deadline-zones: every zone's trace at once from the {o.runs} start ticks, moving spot between "
                  "the zones as the daemon does" for o in rows if o.policy == "deadline-zones"),
        head,
        [[o.policy, money(o.mean_cost_usd), f"{100 * o.p_deadline_met:.0f}%"]
         + ([money(slow[o.policy].mean_cost_usd), f"{100 * slow[o.policy].p_deadline_met:.0f}%"] if slow else [])
         for o in rows]))
    missed = [o.policy for o in found.slow_rows if o.p_deadline_met < 1.0 and o.policy != "on-demand"]
    if slow and slow.get("on-demand") is not None and slow["on-demand"].p_deadline_met < 1.0:
        console.print(f"[yellow]the deadline is within the prediction interval:[/yellow] at +{found.slow_by:.0%} "
                      "work even on-demand all along misses it; measure the model (model predict --measurements) "
                      "or give the job more time", highlight=False)
    elif missed:
        console.print(f"[yellow]at +{found.slow_by:.0%} work[/yellow] {', '.join(missed)} may miss the deadline",
                      highlight=False)


def outlook_dict(found: DeadlineOutlook) -> dict[str, Any]:
    job, slow = found.job, {o.policy: o for o in found.slow_rows}
    doc: dict[str, Any] = {
        "traces": found.traces, "work_h": job.work_min / 60, "deadline_h": job.deadline_min / 60,
        "restart_overhead_h": job.overhead_min / 60,
        "policies": [{"policy": o.policy, "mean_cost_usd": o.mean_cost_usd, "p_deadline_met": o.p_deadline_met,
                      "runs": o.runs}
                     | ({"mean_cost_usd_slow": slow[o.policy].mean_cost_usd,
                         "p_deadline_met_slow": slow[o.policy].p_deadline_met} if o.policy in slow else {})
                     for o in found.rows]}
    if found.slow_by is not None and slow:
        doc["slow_by"] = found.slow_by  # the prediction interval's relative half-width: the *_slow figures' work
    return doc
