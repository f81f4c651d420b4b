"""`orchestrator plan SPEC`: the planner's choice, its runner-ups and the time/cost Pareto front."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from orchestrator.cli.listing import Col, check_format, print_csv, print_table
from orchestrator.cli.model_torch import profile_document
from orchestrator.cli.render import console, duration, err_console, money, pct
from orchestrator.costmodel import Candidate, PlanResult
from orchestrator.planning.admission import Admission, AdmitOptions, admit
from orchestrator.planning.host_load import HostLoad
from orchestrator.planning.judge import NotLaunchable, PlanRefused
from orchestrator.planning.local_run import RunFigures


def _time(c: Candidate | RunFigures) -> str:
    return duration(c.time_s) if math.isfinite(c.time_s) else "never"


def _no_revocation_s(c: Candidate) -> float:
    """The scored time less its revocation overhead: the parts add up (a local run's simulated time has its own
    no-revocation time, not quite the cost model's ``base_time_s``)."""
    return c.time_s - c.revocation_overhead_s if math.isfinite(c.time_s) else c.base_time_s


def _cost(c: Candidate | RunFigures) -> str:
    return money(c.cost_usd) if math.isfinite(c.cost_usd) else "unpriced"


def _workers_cell(c: Candidate) -> str:
    parts: dict[tuple[str, int], int] = {}
    for w in c.workers:
        parts[(w.shown, w.batch)] = parts.get((w.shown, w.batch), 0) + 1
    return ", ".join(f"{n}x {g} b{b}" for (g, b), n in parts.items())


def _step_cell(c: Candidate) -> str:
    seen: dict[str, float] = {}
    for w in c.workers:
        seen.setdefault(w.gpu, w.step_time_s)
    return ", ".join(f"{g} {t * 1e3:.0f}ms" for g, t in seen.items())


def _row(rank: str, c: Candidate, front: set[int]) -> list[Any]:
    return [
        rank + (" *" if id(c) in front else ""),
        _workers_cell(c),
        c.ps_count or "—",
        f"{c.steps_per_s:.1f}",
        _time(c),
        _cost(c),
        pct(c.revocation_risk),
        c.billing,
        "" if c.feasible else "; ".join(c.reasons),
    ]


def _billing(c: Candidate) -> str:
    kinds = {w.spot for w in c.workers}
    return "mixed" if len(kinds) > 1 else "spot" if c.spot else "od"


# The table's columns; step times, PS load and zones are in --format json / csv.
_COLUMNS = [Col("#", whole=True), Col("workers (GPU, batch)", words=True), Col("PS", right=True),
            Col("steps/s", right=True), Col("time", right=True), Col("cost", right=True), Col("risk", right=True),
            Col("bill"), Col("why not", floor=0)]


def _csv_row(rank: str, c: Candidate, front: set[int]) -> dict[str, Any]:
    d = c.to_dict()
    return {"rank": rank, "pareto": id(c) in front, "workers": _workers_cell(c), "step_compute": _step_cell(c),
            **{k: d[k] for k in ("label", "ps_count", "ps_load", "steps_per_s", "time_s", "cost_usd",
                                 "revocation_risk", "hourly_usd", "feasible")},
            "zone": c.zone, "billing": _billing(c), "reasons": "; ".join(c.reasons)}


def _print_chosen(c: Candidate, result: PlanResult) -> None:
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for w in c.workers:
        key = (w.gpu, w.batch, w.billing, w.zone, w.machine_type)
        if key in groups:
            groups[key][1] += 1
            groups[key][6] += w.share
        else:
            groups[key] = [
                w.gpu,
                1,
                w.batch,
                f"{w.step_time_s * 1e3:.1f}",
                f"{w.comm_s * 1e3:.1f}",
                f"{w.steps_per_s:.2f}",
                w.share,
                f"{w.max_batch:,}",
                w.billing,
                w.zone or "—",
                money(w.price_per_hour),
            ]
    rows = [[*g[:6], pct(g[6]), *g[8:]] for g in groups.values()]  # max batch (g[7]): --format json
    columns = [Col("GPU", whole=True), Col("n", right=True), Col("batch", right=True), Col("ms", right=True),
               Col("comm", right=True), Col("steps/s", right=True), Col("share", right=True), Col("billing"),
               Col("zone", floor=0), Col("$/h each", right=True)]
    # PS jobs pull and push the weights each step; the others (torchrun DDP, Horovod-style sync) all-reduce them
    comm_meaning = "PS round trip" if c.ps_count else "gradient all-reduce per step"
    per_gpu = "; batch: each GPU's" if any(w.multi_gpu for w in c.workers) else ""
    print_table(f"chosen: {c.label}", columns, rows,
                note=f"ms: compute time per step; comm: {comm_meaning} (ms); steps/s and $/h: each worker{per_gpu}")
    ps = (
        f"{c.ps_count} x {c.ps_machine_type} PS ({'spot' if c.ps_spot else 'on-demand'}), load "
        f"{pct(c.ps_load)} of {c.ps_capacity:.1f} steps/s; "
        if c.ps_count
        else ""
    )
    console.print(f"{ps}cluster {c.steps_per_s:.2f} steps/s ({c.bottleneck} bound)")
    steps = "global steps" if result.mode == "async" else "synchronous steps"
    _print_strategies(c)
    console.print(
        f"predicted: [bold]{_time(c)}[/bold] for {result.train_steps:,} {steps} "
        f"({duration(_no_revocation_s(c))} + {duration(c.revocation_overhead_s)} expected "
        "revocation overhead), "
        f"[bold]{_cost(c)}[/bold] at {money(c.hourly_usd)}/h; expected revocations "
        f"{c.expected_revocations:.2f} (risk of any {pct(c.revocation_risk)})"
    )


def _print_strategies(c: Candidate) -> None:
    """Which strategy runs (data parallel, pipeline, hybrid), and why not the others."""
    from orchestrator.costmodel.planner.strategies import why_not  # the planner's own words

    if not c.strategies:
        return
    chosen = c.strategies[0]
    console.print(f"strategy: [bold]{chosen.name}[/bold] ({escape(chosen.detail)}); "
                  f"{chosen.step_s:.3g} s a step, {chosen.memory_gb_per_gpu:.1f} GB on the fullest GPU")
    for other in c.strategies[1:]:
        console.print(f"  not {escape(why_not(chosen, other))}")


def plan_command(spec_path: Path, json_out: bool, top: int, calibration: str | None, fmt: str = "table",
                 load_option: str = "measure") -> None:
    """Check the spec as `launch` does, plan, print the chosen cluster and the runner-ups (or JSON, or CSV: one
    row a candidate)."""
    fmt = "json" if json_out else check_format(fmt)
    try:
        admitted = admit(spec_path, AdmitOptions("plan", calibration=calibration, host_load=load_option,
                                                profile=profile_document))
    except NotLaunchable as refused:  # a plan-only spec (a pipeline model): the plan, and why launch refuses it
        _print_warnings(refused.warnings)
        _print_result(refused.name, refused.result, top, fmt == "json")
        err_console.print(f"note: `orchestrator launch` refuses this spec: {escape(refused.message)}", soft_wrap=True)
        return
    except PlanRefused as refused:  # show what the planner saw, then refuse as launch would
        _print_warnings(refused.warnings)
        if fmt == "json":  # the plan as JSON, and exit 1: a script reads "chosen" and its "reasons"
            print(json.dumps(refused.result.to_dict(top=top), indent=2))
            raise typer.Exit(1) from None
        _print_plan(refused.name, refused.result, top)
        raise
    _print_warnings(admitted.warnings)
    if fmt == "csv":
        _print_csv(admitted.judged.result, top)
    elif fmt == "json":
        print(json.dumps(_plan_doc(admitted, top), indent=2))
    else:
        _print_admitted(admitted, top)


def _print_warnings(warnings: tuple[str, ...]) -> None:
    for warning in warnings:
        err_console.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)


def _print_csv(result: PlanResult, top: int) -> None:
    front = {id(c) for c in result.front}
    ranked = ([("chosen", result.chosen)] if result.chosen is not None else []) + [
        (str(i), c) for i, c in enumerate(result.runner_ups(top), start=1)]
    print_csv([_csv_row(rank, c, front) for rank, c in ranked])


def _plan_doc(admitted: Admission, top: int) -> dict[str, Any]:
    """`plan --format json`: the plan, its interval, and what admission found."""
    judged, load, idle = admitted.judged, admitted.load, admitted.judged.idle
    doc = {**judged.result.to_dict(top=top), "prediction_interval": admitted.interval}
    if admitted.sources:  # each chosen worker group's step: measured by a probe, or predicted
        doc["worker_groups"] = [s.to_dict() for s in admitted.sources]
    if judged.notes:
        doc["inventory_notes"] = list(judged.notes)
    if admitted.outlook is not None:
        from orchestrator.cli.deadline_cmd import outlook_dict  # lazy: the availability simulator, deadline specs

        doc["deadline_policies"] = outlook_dict(admitted.outlook)
    if load is not None:
        doc["host_load"] = {"background": load.background, "loadavg_1m": load.loadavg_1m, "cores": load.cores,
                            "measured": load.measured, "idle_time_s": _finite(idle.time_s) if idle else None,
                            "idle_cost_usd": _finite(idle.cost_usd) if idle else None,
                            "note": _load_note(load, idle, judged.result.chosen)}
    return doc


def _print_admitted(admitted: Admission, top: int) -> None:
    judged = admitted.judged
    _print_plan(judged.spec.name, judged.result, top)
    for note in judged.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if admitted.interval is not None:
        _print_interval(judged.result, admitted.interval)
    if any(s.step_source == "measured" or s.through for s in admitted.sources):
        console.print("step times: " + "; ".join(
            f"{s.gpu} b{s.batch} {s.step_source}" + (f" (probe: {s.measured_step_s * 1e3:.1f} ms alone, "
                                                     f"{s.samples} windows)" if s.measured_step_s else "")
            + (f" (through the probes of {', '.join(s.through)})" if s.through else "")
            + f" {s.step_low_s * 1e3:.1f} .. {s.step_high_s * 1e3:.1f} ms" for s in admitted.sources), highlight=False)
    if admitted.outlook is not None:
        from orchestrator.cli.deadline_cmd import print_outlook  # lazy: the availability simulator, deadline specs

        print_outlook(admitted.outlook)
    if admitted.load is not None:
        note = _load_note(admitted.load, judged.idle, judged.result.chosen)
        console.print(f"[yellow]host load:[/yellow] {note}", highlight=False)


def _print_result(name: str, result: PlanResult, top: int, json_out: bool) -> None:
    if json_out:
        print(json.dumps(result.to_dict(top=top), indent=2))
    else:
        _print_plan(name, result, top)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _load_note(load: HostLoad, idle: RunFigures | None, loaded: Candidate | None) -> str:
    """How far the local prediction depends on what else runs on this host."""
    said = load.describe()
    if idle is None or loaded is None or not (math.isfinite(idle.time_s) and math.isfinite(loaded.time_s)):
        return said
    if load.background < 0.05:
        return f"{said}: the prediction assumes the host stays this idle"
    more = loaded.time_s / idle.time_s - 1
    return (f"{said}: the prediction counts them as sharing the cores ({'+' if more >= 0 else ''}{more:.0%} over "
            f"an idle host's {_time(idle)} / {_cost(idle)}); if they stop, expect the idle figures")


def _print_interval(result: PlanResult, interval: dict[str, Any]) -> None:
    why = {"measured": "every GPU probed: the probes' own spread",
           "same-gpu": "measured on these GPUs", "other-gpu": "measured on other GPUs only",
           "other-gpu-precision": "measured at another precision", "none": "no measured step of this model"}
    console.print(
        f"prediction interval: +-{interval['relative']:.0%} ({why[interval['kind']]}; held-out error, "
        f"bench/cross_gpu.py): time {duration(interval['time_low_s'])} .. {duration(interval['time_high_s'])}, "
        f"cost {money(interval['cost_low_usd'])} .. {money(interval['cost_high_usd'])}"
    )
    if interval["flips_to"]:
        console.print(f"[yellow]the choice may flip inside the interval:[/yellow] {interval['flips_to']} is within "
                      f"it by {result.objective}; measure the model (model predict --measurements) to decide")


def _print_plan(name: str, result: PlanResult, top: int) -> None:
    """The plan as text: limits and notes, the chosen cluster, the runner-ups and the Pareto front."""
    limits = []
    if result.budget_usd is not None:
        limits.append(f"budget {money(result.budget_usd)}")
    if result.deadline_s is not None:
        limits.append(f"deadline {duration(result.deadline_s)}")
    console.print(
        f"[bold]{name}[/bold]: {result.model}, {result.mode} training, {result.train_steps:,} steps; "
        f"{len(result.candidates):,} candidate{'s' if len(result.candidates) != 1 else ''} in "
        f"{result.elapsed_s * 1e3:.0f} ms; objective {result.objective}"
        + (f"; {', '.join(limits)}" if limits else "")
        + f"; calibration {result.calibration}"
    )
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    for warning in result.warnings:
        console.print(f"[bold red]warning:[/bold red] {warning}")
    front = {id(c) for c in result.front}
    if result.chosen is not None:
        _print_chosen(result.chosen, result)
    runner_ups = result.runner_ups(top)
    if runner_ups:
        print_table(f"runner-ups by {result.objective} (* = on the time/cost Pareto front)", _COLUMNS,
                    [_row(str(i), c, front) for i, c in enumerate(runner_ups, start=1)])
    if len(result.front) > 1:
        print_table("Pareto front (fastest first): no other feasible candidate is both faster and cheaper",
                    _COLUMNS, [_row(str(i), c, front) for i, c in enumerate(result.front, start=1)])
    if runner_ups or len(result.front) > 1:
        console.print("PS: parameter servers; risk: of any revocation; bill: spot, od (on-demand) or mixed; "
                      "step times, PS load, zones: --format json or csv", style="dim", highlight=False)
