"""`orchestrator simulate SPEC --availability-trace FILE`: finish by the deadline at the least cost, each
policy replayed on a measured spot availability trace (``sim.availability``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.cli.render import console, money, table
from orchestrator.decide import policies
from orchestrator.decide.policies import MARKET_POLICIES
from orchestrator.model.catalog import load_catalog
from orchestrator.model.errors import UserError
from orchestrator.model.names import unknown_name
from orchestrator.model.spec import JobSpec, load_spec
from orchestrator.planning.calibration import planning_calibration
from orchestrator.planning.outlook import DeadlineOutlook
from orchestrator.sim.availability import (
    HISTORY_H,
    AvailabilityTrace,
    AvailabilityTraceError,
    DeadlineFigures,
    Job,
    Outcome,
    deadline_figures,
    load_trace,
    on_gpu_figures,
    saving_share,
    spot_on_gpu,
    study,
)
from orchestrator.sim.elastic import run_elastic
from orchestrator.sim.from_spec import SimSpecError, cluster_from_spec
from orchestrator.sim.multizone import Market, study_multi


def availability_command(specs: list[Path], trace_path: Path, start_tick: int, policy_name: str, json_out: bool,
                         work_h: float | None, deadline_h: float | None, overhead_min: float | None,
                         price_book: str | None, history_h: float | None = None,
                         also: list[str] | None = None) -> None:
    names = _check_args(specs, policy_name, also, {"--work-h": work_h, "--deadline-h": deadline_h,
                                                   "--restart-overhead-min": overhead_min, "--history-h": history_h})
    spec = load_spec(specs[0])
    try:
        trace = load_trace(trace_path)
        fig = deadline_figures(spec, price_book, planning_calibration(spec))  # as `plan` and `launch` plan it
    except AvailabilityTraceError as exc:
        raise UserError(str(exc)) from None
    except SimSpecError as exc:
        raise UserError(f"{specs[0]}: {exc}") from None
    job = _job_minutes(spec, fig, work_h, deadline_h, overhead_min)
    seen_h = HISTORY_H if history_h is None else history_h
    workers = 1
    try:
        if policy_name == "elastic":  # the cluster's workers shrink onto the spot VMs there are (sim.elastic)
            workers = len(cluster_from_spec(spec, price_book=price_book).slots)
            per_vm = replace(job, spot_usd_per_h=job.spot_usd_per_h / workers,
                             on_demand_usd_per_h=job.on_demand_usd_per_h / workers)
            outcomes = [run_elastic(per_vm, workers, trace, start_tick, ("elastic",), seen_h)["elastic"]]
        else:
            outcomes = study(job, trace, start_tick, names, history_h=seen_h)
        markets = _also_markets(spec, also or [], trace, fig.work_s, price_book) if also else []
        if markets:
            outcomes += _market_outcomes(job, trace, markets, start_tick, round(seen_h * 60 / trace.tick_min))
    except AvailabilityTraceError as exc:
        raise UserError(str(exc)) from None
    doc = _availability_doc(spec.name, trace_path, trace, start_tick, job, outcomes, seen_h)
    if policy_name == "elastic":
        doc["workers"] = workers  # the prices above stay the whole cluster's; the timeline's modes: "<spot>s+<od>od"
    if markets:  # each other market: its GPU, trace, speed (the job's work there) and spot price
        doc["markets"] = [{"gpu": g, "trace": str(p), "speed": m.speed, "spot_usd_per_h": m.spot_usd_per_h}
                          for g, p, _, m in markets]
    if json_out:
        print(json.dumps(doc, indent=2))
        return
    _print_availability(spec.name, trace, start_tick, job, outcomes, doc, markets)


def _check_args(specs: list[Path], policy_name: str, also: list[str] | None,
                numbers: dict[str, float | None]) -> tuple[str, ...]:
    """The policies ``--policy`` names; a one-line error for a wrong count of specs, an unknown policy,
    ``--also-trace`` with a policy it does not go with, or a number (``numbers``: flag -> value) out of range."""
    if len(specs) != 1:
        raise UserError("--availability-trace takes exactly one job spec",
                        hint="orchestrator simulate examples/local-deadline.yaml --availability-trace FILE.json")
    names = policies.DEADLINE_POLICIES if policy_name == "all" else (policy_name,)
    known = (*policies.DEADLINE_POLICIES, *policies.TRIAL_POLICIES, "elastic")
    if policy_name != "all" and policy_name not in known:
        raise UserError(f"--policy '{policy_name}' is not a policy; use one of: all, {', '.join(known)}")
    if also and policy_name not in ("all", "deadline"):
        raise UserError(f"--also-trace adds the deadline policy's markets rows; it goes with --policy all or deadline, "
                        f"not {policy_name}")
    for flag, v in numbers.items():
        if v is not None and not 0 <= v < 1e6:
            raise UserError(f"{flag} must be a number of hours/minutes between 0 and 1e6, not {v}")
    return names


def _job_minutes(spec: JobSpec, fig: DeadlineFigures, work_h: float | None, deadline_h: float | None,
                 overhead_min: float | None) -> Job:
    """The job in minutes of cloud time: the flags where given, else the plan's figures (``fig``) scaled from the
    job's clock to the trace's."""
    scale = fig.time_scale / 60.0  # seconds of the job's clock -> minutes of the trace's (cloud) clock
    deadline_s = spec.policy.deadline
    if deadline_h is None and deadline_s is None:
        raise UserError("the spec has no policy.deadline; add one (e.g. deadline: 52h) or give --deadline-h")
    work = round(work_h * 60) if work_h is not None else round(fig.work_s * scale)
    dl = round(deadline_h * 60) if deadline_h is not None else round((deadline_s or 0.0) * scale)
    ovh = round(overhead_min) if overhead_min is not None else round(fig.overhead_s * scale)
    if work < 1 or dl < 1:
        raise UserError(f"work ({work} min) and deadline ({dl} min) must be at least a minute of cloud time")
    return Job(work, dl, ovh, fig.spot_usd_per_h, fig.on_demand_usd_per_h)


def _availability_doc(name: str, trace_path: Path, trace: AvailabilityTrace, start_tick: int, job: Job,
                      outcomes: list[Outcome], seen_h: float) -> dict[str, Any]:
    """The replay as ``--json`` prints it: the job, each policy's outcome and, where the on-demand and optimal rows
    are there to measure it against, its share of the saving."""
    costs = {o.policy: o.cost_usd for o in outcomes}
    doc: dict[str, Any] = {
        "spec": name, "trace": str(trace_path), "start_tick": start_tick, "tick_min": trace.tick_min,
        "work_h": job.work_min / 60, "deadline_h": job.deadline_min / 60, "restart_overhead_h": job.overhead_min / 60,
        "spot_usd_per_h": job.spot_usd_per_h, "on_demand_usd_per_h": job.on_demand_usd_per_h,
        "policies": [o.as_dict() for o in outcomes],
        # the trace before start_tick the learning policies read (a launch's daemon reads only what earlier jobs in
        # its spot market recorded; plan's outlook reads none)
        "history_h": min(start_tick * trace.tick_min / 60, seen_h),
    }
    if "on-demand" in costs and "optimal" in costs:
        for d in doc["policies"]:
            best = costs.get(MARKET_POLICIES[1], 0.0) if d["policy"] in MARKET_POLICIES else costs["optimal"]
            d["saving_share"] = saving_share(d["cost_usd"], costs["on-demand"], best)
    return doc


def _print_availability(name: str, trace: AvailabilityTrace, start_tick: int, job: Job, outcomes: list[Outcome],
                        doc: dict[str, Any], markets: list[tuple[str, Path, AvailabilityTrace, Market]]) -> None:
    rows = [[o.policy, money(o.cost_usd), f"{o.finish_min / 60:.2f} h", "yes" if o.deadline_met else "MISSED",
             _share(d.get("saving_share")), _mix(o.as_dict())] for o, d in zip(outcomes, doc["policies"], strict=True)]
    console.print(table(
        f"{name}: {job.work_min / 60:.2f} h of work, deadline {job.deadline_min / 60:.2f} h, restart overhead "
        f"{job.overhead_min} min, on {trace.name} from tick {start_tick} ({money(job.spot_usd_per_h)}/h spot, "
        f"{money(job.on_demand_usd_per_h)}/h on-demand; the deadline policy has seen "
        f"{doc['history_h']:.4g} h of the trace before it{_history_hint(doc['history_h'])})",
        ["policy", "cost", "finish", "deadline", "share of saving", "timeline"], rows))
    if markets:
        console.print("deadline-markets / optimal-markets hold these at once (spot@0 the job's own, share against "
                      "optimal-markets): " + "; ".join(
                          f"spot@{k + 1} {g} {p.name} ({m.speed:.2f}x the work rate, {money(m.spot_usd_per_h or 0.0)}"
                          f"/h spot)" for k, (g, p, _, m) in enumerate(markets)), highlight=False)




def _also_markets(spec: JobSpec, also: list[str], trace: AvailabilityTrace, work_s: float,
                  price_book: str | None) -> list[tuple[str, Path, AvailabilityTrace, Market]]:
    """Each ``--also-trace GPU=FILE``: another market's trace, and the job there as the planner predicts it (its
    spot workers on that GPU type: ``sim.availability.spot_on_gpu``): the speed (the job's predicted work on its
    own GPU over the work there) and the spot price. GPU may be the spec's own (another zone)."""
    if spec.cluster is None:
        raise UserError("--also-trace needs a spec with a cluster (its workers move to the other GPU type); this one "
                        "has a search", hint="pin the cluster, or drop --also-trace")
    out = []
    for item in also:
        gpu, sep, path = item.partition("=")
        if not sep or not gpu.strip() or not path:
            raise UserError(f"--also-trace '{item}': give GPU=FILE.json, e.g. k80=us-west-2a_k80_1.json")
        gpu = gpu.strip().lower()
        if gpu not in (known := load_catalog().gpus):
            raise UserError(f"--also-trace {item}: {unknown_name(gpu, 'a GPU type', known)}")
        other = load_trace(Path(path))
        if other.tick_min != trace.tick_min:
            raise UserError(f"--also-trace {item}: ticks of {other.tick_min} min, the main trace's are "
                            f"{trace.tick_min} min; the traces are replayed tick for tick")
        try:
            speed, price = on_gpu_figures(spec, gpu, work_s, price_book, planning_calibration(spot_on_gpu(spec, gpu)))
        except (SimSpecError, UserError, KeyError, ValueError) as exc:
            raise UserError(f"--also-trace {item}: the job cannot be planned on GPU '{gpu}' ({exc})") from None
        out.append((gpu, Path(path), other, Market(speed, price)))
    return out


def _market_outcomes(job: Job, trace: AvailabilityTrace,
                     markets: list[tuple[str, Path, AvailabilityTrace, Market]], start: int,
                     history_ticks: int) -> list[Outcome]:
    """The deadline policy holding the job's own market and every ``--also-trace`` one at once, and the optimum over
    the same (``sim.multizone``), from the same start tick of every trace."""
    avails = (trace.available(), *(t.available() for _, _, t, _ in markets))
    online, best = study_multi(job, avails, trace.tick_min, start, history_ticks,
                               markets=(Market(), *(m for _, _, _, m in markets)))
    return [replace(online, policy=MARKET_POLICIES[0]), replace(best, policy=MARKET_POLICIES[1])]


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
    # e: an elastic membership; spot@N: spot in another market (--also-trace)
    return "".join(letters.get(c["mode"].split("@")[0], "e") for c in d["timeline"])[:40]


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
                  "the zones as the daemon does" for o in rows if o.policy == "deadline-zones")
        + "".join(f"; deadline-markets: every GPU type's trace at once from the {o.runs} start ticks, moving the spot "
                  "workers between the types (policy.also_gpus) as the daemon does" for o in rows
                  if o.policy == "deadline-markets")
        + "".join(f"; elastic: the {o.runs} start ticks with the spot workers shrunk onto the spot VMs the trace "
                  "counts and topped up with on-demand, as the daemon runs this job" for o in rows
                  if o.policy == "elastic"),
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
