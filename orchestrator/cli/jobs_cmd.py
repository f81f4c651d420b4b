"""`launch`, `status`, `logs`, `cancel`, `report`: the job verbs."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli.listing import check_format, format_option
from orchestrator.cli.options import plot_file, positive_seconds
from orchestrator.cli.render import err_console, print_report
from orchestrator.clock import WALL
from orchestrator.model.errors import UserError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# The verbs' signatures load with every CLI start (`--help`, a usage error); what each verb needs (the cost
# model, the ORM, the providers) is imported in its body, so a start costs typer and little else.


def launch(
    spec_path: Path = typer.Argument(..., help="job spec (YAML); a training.model: {torch: MODULE:FACTORY} factory "
                                     "is run, in a child process without the controller's secrets, to profile the "
                                     "model (also with --dry-run)", exists=False),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and print the cluster and its hourly cost"),
    detach: bool = typer.Option(False, "--detach", help="record the job; a running `orchestrator daemon` drives it"),
    poll: float = typer.Option(1.0, "--poll", help="seconds between reconcile passes (foreground)",
                              callback=positive_seconds),
    quiet: bool = typer.Option(False, "--quiet", help="no live display; print a line per event"),
) -> None:
    """Validate, plan, provision, train, survive revocations, tear down, record cost/time/accuracy.

    Exit codes: 0 the job succeeded (or, with --dry-run / --detach, the spec is valid and the job is
    recorded); 1 the job failed; 2 bad input, nothing created; 3 the job was cancelled; 130 / 143 Ctrl-C /
    SIGTERM (the job is cancelled).
    """
    from orchestrator.cli.launch_checks import print_dry_run, print_notes  # lazy: rich tables, only for launch
    from orchestrator.cli.model_torch import profile_document  # lazy: the cost model
    from orchestrator.planning.admission import AdmitOptions, admit  # lazy: the cost model and the providers

    # the same check, the same calibration and the same plan as `plan`; nothing created before
    admitted = admit(spec_path, AdmitOptions("dry-run" if dry_run else "launch", profile=profile_document))
    if dry_run:
        print_dry_run(admitted)
        return
    print_notes(admitted)
    from orchestrator.cli.launch_view import ConsoleReporter  # lazy: loads the control layer
    from orchestrator.control.launcher import launch_job  # lazy: the control layer

    judged = admitted.judged
    launch_job(judged.spec, judged.planned, judged.plan, detach=detach, poll_s=poll,
               reporter=ConsoleReporter(quiet=quiet), groups=admitted.sources)


def status(
    job: str | None = typer.Argument(None, help="job id or name; all jobs if omitted"),
    json_out: bool = typer.Option(False, "--json", help="same as --format json"),
    fmt: str = format_option("csv: the jobs, or one job's instances"),
    watch: bool = typer.Option(False, "--watch", "-w", help="follow the job until it ends (live view in a terminal, "
                               "else event and progress lines)"),
) -> None:
    """One job (with its instances and recent events) or every job."""
    fmt = "json" if json_out else check_format(fmt)
    if watch:
        _watch(job)
        return
    from orchestrator.cli.status_view import print_job, print_jobs  # lazy: the ORM models (~30 ms)

    if job is None:
        print_jobs(fmt)
    else:
        print_job(job, fmt)


def logs(
    job: str = typer.Argument(..., help="job id or name"),
    instance: str | None = typer.Option(None, "--instance", help="slot such as worker-1, or an instance name"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines"),
    lines: int = typer.Option(50, "--lines", "-n", min=0, help="training-metric lines to show (every event is shown)"),
    fmt: str = format_option("json / csv: the events and metrics recorded so far, one record each"),
) -> None:
    """Print the job's events (naming each instance) and training metrics, or one instance's process log."""
    if check_format(fmt) != "table":
        if follow or instance:
            raise UserError(f"--format {fmt}: prints the job's recorded events and metrics; --follow and "
                            "--instance print text only (drop them, or drop --format)")
        from orchestrator.cli.log_records import print_log_records  # lazy: the ORM models

        print_log_records(job, lines, fmt)
        return
    _logs(job, instance, follow, lines)


def cancel(job: str = typer.Argument(..., help="job id or name")) -> None:
    """Tear down every instance of the job and close its ledger."""
    from orchestrator.cli.launch_view import print_cancel  # lazy: loads the control layer
    from orchestrator.control.launcher import cancel_job  # lazy: the control layer

    print_cancel(cancel_job(job))


def report(
    jobs: list[str] = typer.Argument(None, help="job ids or names; all jobs if omitted"),
    fmt: str = typer.Option("table", "--format", help="table | csv | json"),
    plot: Path | None = typer.Option(None, "--plot", help="also draw the job's timeline, cost and throughput to "
                                     "this .png or .svg (one job)", callback=plot_file),
) -> None:
    """Cost (by role), wall time, accuracy, revocations and replacements per job."""
    from orchestrator.store import queries  # lazy: the ORM models (~30 ms) only for verbs that read the DB
    from orchestrator.store.db import open_session

    if fmt not in {"table", "csv", "json"}:
        raise UserError(f"--format: '{fmt}' is not one of table, csv, json")
    _check_plot_args(plot, jobs)
    with open_session() as session:
        ids: list[str] = []
        for ref in jobs or []:
            found = queries.get_job(session, ref)
            if found is None:
                raise UserError(f"no job '{ref}'; `orchestrator status` lists them")
            ids.append(found.id)
        rows: list[dict[str, Any]] = queries.job_summaries(session, ids or None)
        if plot is not None:
            _write_plot(session, ids[0], plot)
        from orchestrator.cli.torch_report import (  # lazy: the ORM
            quorum_changes,
            resplits,
            stage_losses,
            training_section,
            worker_batches,
        )

        training = training_section(session, rows) if fmt == "table" else []
        from orchestrator.cli.deadline_report import deadline_section  # lazy: the ORM models

        deadlines = deadline_section(session, rows) if fmt == "table" else []
        if fmt == "json":  # the batch each worker was planned and ran, and each re-split of a running sync job
            for r in rows:
                r["worker_batches"] = worker_batches(session, r["job_id"])
                r["resplits"] = resplits(session, r["job_id"])
                r["stage_losses"] = stage_losses(session, r["job_id"])
                r["quorum_changes"] = quorum_changes(session, r["job_id"])
    keys = ["job_id", "name", "provider", "mode", "cluster_shape", "status", "price_book", "train_steps",
            "final_step", "accuracy", "wall_time_s", "cost_usd", "worker_cost_usd", "ps_cost_usd", "chief_cost_usd",
            "revocations", "replacements", "restarts"]
    if fmt == "json":
        keys += ["worker_batches", "resplits", "stage_losses", "quorum_changes"]
        sys.stdout.write(json.dumps([{k: r[k] for k in keys} for r in rows], default=str, indent=2) + "\n")
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        sys.stdout.write(buf.getvalue())
    else:
        print_report(rows, title=f"report ({WALL.now().strftime('%Y-%m-%d %H:%M')})")
        if training:  # framework, world-size timeline (PyTorch elastic), examples/s, accuracy, cost
            sys.stdout.write("training:\n" + "".join(f"  {line}\n" for line in training))
        if deadlines:  # on_revocation: deadline: spot / on-demand / waiting against uniform progress
            sys.stdout.write("deadline policy:\n" + "".join(f"  {line}\n" for line in deadlines))


def _watch(job: str | None) -> None:
    if job is None:
        raise UserError("--watch needs a job: `orchestrator status JOB --watch`")
    from orchestrator.cli.progress import follow_job  # lazy: the ORM models

    follow_job(job, watch_live=True, metrics=True, lines=30, follow=True)


def _logs(job: str, instance: str | None, follow: bool, lines: int) -> None:
    if instance is None:
        from orchestrator.cli.progress import follow_job  # lazy: the ORM models

        follow_job(job, watch_live=False, metrics=True, lines=lines, follow=follow)
        return
    from orchestrator.cli.instance_logs import print_instance_log  # lazy: the ORM models, storage clients

    print_instance_log(job, instance, follow=follow, lines=lines)


def _check_plot_args(plot: Path | None, jobs: list[str] | None) -> None:
    if plot is None:
        return
    from orchestrator.cli.plots import format_for  # lazy: the ORM models

    format_for(plot)
    if len(jobs or []) != 1:
        raise UserError("--plot draws one job: `orchestrator report JOB --plot FILE.png`")


def _write_plot(session: Session, job_id: str, path: Path) -> None:
    from orchestrator.cli.report_plot import write_plot  # lazy: the ORM models, matplotlib

    write_plot(session, job_id, path)
    err_console.print(f"plot written to {path}", highlight=False)
