"""`orchestrator plan SPEC`: the planner's choice, its runner-ups and the time/cost Pareto front."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from orchestrator.cli.model_cmd import latest_calibration, resolve_calibration
from orchestrator.cli.model_torch import prepare_spec
from orchestrator.cli.render import console, duration, err_console, money, pct, table
from orchestrator.core.costmodel import DEFAULT_CALIBRATION, Candidate, PlanResult
from orchestrator.core.costmodel.interval import plan_interval
from orchestrator.core.spec import load_spec


def _time(c: Candidate) -> str:
    return duration(c.time_s) if math.isfinite(c.time_s) else "never"


def _cost(c: Candidate) -> str:
    return money(c.cost_usd) if math.isfinite(c.cost_usd) else "unpriced"


def _workers_cell(c: Candidate) -> str:
    parts: dict[tuple[str, int], int] = {}
    for w in c.workers:
        parts[(w.gpu, w.batch)] = parts.get((w.gpu, w.batch), 0) + 1
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
        _step_cell(c),
        c.ps_count or "—",
        pct(c.ps_load) if c.ps_count else "—",
        f"{c.steps_per_s:.1f}",
        _time(c),
        _cost(c),
        pct(c.revocation_risk),
        c.zone or "—",
        c.billing,
        "" if c.feasible else "; ".join(c.reasons),
    ]


_COLUMNS = [
    "#",
    "workers (GPU, batch)",
    "step (compute)",
    "PS",
    "PS load",
    "steps/s",
    "time",
    "cost",
    "revocation risk",
    "zone",
    "billing",
    "why not",
]


def _print_chosen(c: Candidate, result: PlanResult) -> None:
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for w in c.workers:
        key = (w.gpu, w.batch, w.spot, w.zone, w.machine_type)
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
                "spot" if w.spot else "on-demand",
                w.zone or "—",
                money(w.price_per_hour),
            ]
    rows = [[*g[:6], pct(g[6]), *g[7:]] for g in groups.values()]
    columns = [
        "worker GPU",
        "count",
        "batch",
        "compute ms",
        "comm ms",
        "steps/s each",
        "share of steps",
        "max batch",
        "billing",
        "zone",
        "$/h each",
    ]
    console.print(table(f"chosen: {c.label}", columns, rows))
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
        f"({duration(c.base_time_s)} + {duration(c.revocation_overhead_s)} expected revocation overhead), "
        f"[bold]{_cost(c)}[/bold] at {money(c.hourly_usd)}/h; expected revocations "
        f"{c.expected_revocations:.2f} (risk of any {pct(c.revocation_risk)})"
    )


def _print_strategies(c: Candidate) -> None:
    """Which strategy runs (data parallel, pipeline, hybrid), and why not the others."""
    from orchestrator.core.costmodel.planner.strategies import why_not  # the planner's own words

    if not c.strategies:
        return
    chosen = c.strategies[0]
    console.print(f"strategy: [bold]{chosen.name}[/bold] ({escape(chosen.detail)}); "
                  f"{chosen.step_s:.3g} s a step, {chosen.memory_gb_per_gpu:.1f} GB on the fullest GPU")
    for other in c.strategies[1:]:
        console.print(f"  not {escape(why_not(chosen, other))}")


def plan_command(spec_path: Path, json_out: bool, top: int, calibration: str | None) -> None:
    """Check the spec as `launch` does, plan, print the chosen cluster and the runner-ups (or JSON)."""
    from orchestrator.control.validate import NotLaunchable, PlanRefused, validate_launch  # lazy: the control layer

    prepare_spec(spec_path)  # training.model: {torch: ...} is profiled (cached) before the spec is checked
    calib = resolve_calibration(calibration) if calibration is not None else latest_calibration()
    if calib is not None and calib.emulated and not load_spec(spec_path).provider.emulates_gpus:
        console.print(f"warning: calibration {calib.name} was fitted on emulated (local) GPUs; "
                      "planning real GPUs with the shipped one (data/calibration.json) instead")
        calib = None
    try:
        checked = validate_launch(spec_path, calibration=calib)  # the same check as `launch` and its dry run
    except NotLaunchable as refused:  # a plan-only spec (a pipeline model): the plan, and why launch refuses it
        _print_result(load_spec(spec_path).name, refused.result, top, json_out)
        err_console.print(f"note: `orchestrator launch` refuses this spec: {escape(refused.message)}", soft_wrap=True)
        return
    except PlanRefused as refused:  # show what the planner saw, then refuse as launch would
        if json_out:  # the plan as JSON, and exit 1: a script reads "chosen" and its "reasons"
            print(json.dumps(refused.result.to_dict(top=top), indent=2))
            raise typer.Exit(1) from None
        _print_plan(load_spec(spec_path).name, refused.result, top)
        raise
    interval = plan_interval(checked.result, calib or DEFAULT_CALIBRATION)
    from orchestrator.cli.deadline_cmd import deadline_outlook, outlook_dict, print_outlook  # lazy: deadline specs

    found = deadline_outlook(checked.spec)  # on_revocation: deadline: each policy on real traces
    if json_out:
        doc = {**checked.result.to_dict(top=top), "prediction_interval": interval}
        if found is not None:
            doc["deadline_policies"] = outlook_dict(found)
        print(json.dumps(doc, indent=2))
        return
    _print_plan(checked.spec.name, checked.result, top)
    if interval is not None:
        _print_interval(checked.result, interval)
    if found is not None:
        print_outlook(found)


def _print_result(name: str, result: PlanResult, top: int, json_out: bool) -> None:
    if json_out:
        print(json.dumps(result.to_dict(top=top), indent=2))
    else:
        _print_plan(name, result, top)


def _print_interval(result: PlanResult, interval: dict[str, Any]) -> None:
    why = {"same-gpu": "measured on these GPUs", "other-gpu": "measured on other GPUs only",
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
        console.print(
            table(
                f"runner-ups by {result.objective} (* = on the time/cost Pareto front)",
                _COLUMNS,
                [_row(str(i), c, front) for i, c in enumerate(runner_ups, start=1)],
            )
        )
    if len(result.front) > 1:
        console.print(
            table(
                "Pareto front (fastest first): no other feasible candidate is both faster and cheaper",
                _COLUMNS,
                [_row(str(i), c, front) for i, c in enumerate(result.front, start=1)],
            )
        )
