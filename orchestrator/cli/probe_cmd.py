"""`orchestrator probe SPEC` (and `plan --probe`): what would be measured and at what predicted cost, the question
(or --yes), the probes' progress on stderr, then their figures (a table, or --json). Rendering only:
planning.probe chose the points, control.probe_run runs and folds them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli.listing import Col, print_table
from orchestrator.cli.render import duration, err_console, money
from orchestrator.model.errors import UserError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from orchestrator.control.probe_run import ProbeResult
    from orchestrator.costmodel.launch_plan import LaunchPlan
    from orchestrator.planning.probe import ProbePlan
    from orchestrator.store.models import Job


def probe(
    spec_path: Path = typer.Argument(..., help="job spec (YAML): its model is probed on the plan's candidate points"),
    max_probes: int = typer.Option(4, "--max-probes", min=1,
                                   help="at most this many points (a short job a batch, two batches where they fit)"),
    yes: bool = typer.Option(False, "--yes", help="create the probes without asking"),
    json_out: bool = typer.Option(False, "--json", help="print the figures as JSON"),
    poll: float = typer.Option(1.0, "--poll", help="seconds between reconcile passes", min=0.05),
) -> None:
    """Measure the spec's own job on the candidate GPUs (a few steps each) and fold the step times into the
    calibration the next `plan` uses.

    Exit codes: 0 every probe measured its point; 1 a probe failed (the others' figures are kept); 2 bad input
    or over policy.budget_usd, nothing created; 130 / 143 Ctrl-C / SIGTERM (the running probe is torn down).
    """
    results = probe_command(spec_path, max_probes, yes, poll, json_out)
    if any(r.step_ms is None for r in results):
        raise typer.Exit(1)


def probe_command(spec_path: Path, max_probes: int, yes: bool, poll: float, json_out: bool,
                  to_stderr: bool = False) -> list[ProbeResult]:
    """Plan the probes, ask, run them, print their figures (stdout: the table or the JSON; ``to_stderr``: the
    table on stderr, `plan --probe`'s stdout being the plan)."""
    from orchestrator.cli.model_torch import profile_document  # lazy: the cost model
    from orchestrator.planning.probe import plan_probes  # lazy: the cost model and the providers

    planned = plan_probes(spec_path, max_probes, profile_document)
    for warning in planned.warnings:
        err_console.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)
    _print_planned(planned)
    if not planned.points:
        err_console.print("nothing to probe: every candidate point is measured already", highlight=False)
        _print_results([], json_out, to_stderr)
        return []
    _confirm(planned, yes)
    from orchestrator.control.probe_run import run_probes  # lazy: the control layer

    results = run_probes(planned, poll_s=poll, reporter=_StderrReporter(), on_result=_say_result)
    _print_results(results, json_out, to_stderr)
    return results


def _confirm(planned: ProbePlan, yes: bool) -> None:
    if yes:
        return
    what = (f"create {len(planned.points)} probe job(s), predicted {money(planned.total_cost_usd)} and "
            f"{duration(planned.total_time_s)} in all")
    if not sys.stdin.isatty():
        raise UserError(f"probe: would {what}; pass --yes to go on (no terminal to ask); nothing was created")
    if not typer.confirm(f"{what[0].upper()}{what[1:]}?", default=False, err=True):
        err_console.print("nothing was created", highlight=False)
        raise typer.Exit(0)


def _print_planned(planned: ProbePlan) -> None:
    """The points and each probe's predicted step, wall time and cost (stderr: stdout is the figures)."""
    rows = [[p.gpu, p.machine_type, p.precision, p.batch, "spot" if p.spot else "on-demand", p.zone or "—",
             f"{p.predicted_step_s * 1e3:.1f}", duration(p.predicted_time_s), money(p.predicted_cost_usd)]
            for p in planned.points]
    cols = [Col("GPU", whole=True), Col("machine"), Col("precision"), Col("batch", right=True), Col("billing"),
            Col("zone"), Col("ms", right=True), Col("wall", right=True), Col("cost", right=True)]
    budget = planned.spec.policy.budget_usd
    print_table(f"probes of {planned.spec.name} (predicted; {money(planned.total_cost_usd)} in all"
                + (f" of the {money(budget)} budget)" if budget is not None else ")"), cols, rows, err=True)
    for skipped in planned.skipped:
        err_console.print(f"not probed: {skipped}", highlight=False, markup=False)


def _say_result(r: ProbeResult) -> None:
    what = (f"{r.step_ms:.1f} ms a step ({r.low_ms:.1f} .. {r.high_ms:.1f}) over {r.steps} steps"
            if r.step_ms is not None else f"no figure ({r.error})")
    folded = f"; calibration {r.calibration_id}" if r.calibration_id is not None else ""
    err_console.print(f"probe {r.job_id} ({r.point.gpu} b{r.point.batch}): {what}, {duration(r.wall_s)}, "
                      f"{money(r.cost_usd)}{folded}", highlight=False, markup=False)


def results_doc(results: list[ProbeResult]) -> dict[str, Any]:
    """``probe --json``: ``{"probes": [{gpu, machine_type, precision, batch, step_ms, steps, wall_s, cost_usd}],
    "total_cost_usd"}``."""
    return {"probes": [r.to_dict() for r in results], "total_cost_usd": sum(r.cost_usd for r in results)}


def _print_results(results: list[ProbeResult], json_out: bool, to_stderr: bool = False) -> None:
    if json_out:
        sys.stdout.write(json.dumps(results_doc(results), indent=2) + "\n")
        return
    rows = [[r.point.gpu, r.point.machine_type, r.point.precision, r.point.batch,
             "—" if r.step_ms is None else f"{r.step_ms:.1f}",
             "—" if r.low_ms is None else f"{r.low_ms:.1f} .. {r.high_ms:.1f}", r.steps, duration(r.wall_s),
             money(r.cost_usd), r.job_id] for r in results]
    cols = [Col("GPU", whole=True), Col("machine"), Col("precision"), Col("batch", right=True),
            Col("ms", right=True), Col("spread", right=True), Col("steps", right=True), Col("wall", right=True),
            Col("cost", right=True), Col("job", floor=0)]
    print_table(f"measured ({money(sum(r.cost_usd for r in results))} in all; `orchestrator plan` now plans on "
                "them)", cols, rows, err=to_stderr)


class _StderrReporter:
    """A probe's launch lines on stderr, one a line: stdout is the figures."""

    def say(self, text: str) -> None:
        err_console.print(text, highlight=False, markup=False)

    def recorded(self, job_id: str, plan: LaunchPlan, provider: str, *, detach: bool) -> None:
        err_console.print(f"probe job {job_id} recorded ({plan.shape}, provider {provider})", highlight=False)

    def start(self) -> None:
        pass

    def update(self, session: Session, job: Job) -> None:
        pass

    def stop(self) -> None:
        pass

    def finished(self, session: Session, job_id: str) -> None:
        pass
