"""Entry point: `orchestrator VERB ...`. Bad input exits 2 with field-level messages, never a traceback."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import typer

from orchestrator import __version__
from orchestrator.catalog import CatalogError
from orchestrator.cli import catalog_cmd, db_cmd, jobs_cmd
from orchestrator.cli.render import err_console
from orchestrator.errors import UserError
from orchestrator.spec import SpecError
from orchestrator.store.db import ENV_URL

app = typer.Typer(
    help="Train deep-learning models on transient (spot / preemptible) GPUs: plan, launch, survive "
    "revocations, and record cost, time and accuracy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(
    db: str | None = typer.Option(None, "--db", help=f"SQLAlchemy URL of the results DB (or ${ENV_URL})"),
    version: bool = typer.Option(False, "--version", help="print the version"),
) -> None:
    if version:
        print(__version__)
        raise typer.Exit(0)
    if db:
        os.environ[ENV_URL] = db


app.command("launch")(jobs_cmd.launch)


@app.command("plan")
def plan(
    spec: Path = typer.Argument(..., help="job spec (YAML)"),
    json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
    top: int = typer.Option(8, "--top", help="how many runner-ups to show"),
    calibration: str | None = typer.Option(None, "--calibration", help="calibration id (DB) or JSON file"),
) -> None:
    """Predict step times, PS load, time and cost of candidate clusters; print the Pareto front."""
    from orchestrator.cli.plan_cmd import plan_command

    plan_command(spec, json_out, top, calibration)


app.command("status")(jobs_cmd.status)
app.command("logs")(jobs_cmd.logs)
app.command("cancel")(jobs_cmd.cancel)
app.command("report")(jobs_cmd.report)


@app.command("simulate")
def simulate(
    specs: list[Path] = typer.Argument(None, help="one or more job specs (several: side-by-side comparison)"),
    runs: int = typer.Option(1000, "--runs", help="Monte Carlo runs per spec"),
    seed: int = typer.Option(0, "--seed"),
    price_book: str | None = typer.Option(None, "--price-book", help="override the spec's price book"),
    trace: Path | None = typer.Option(None, "--trace", help="revocation trace CSV (gpu,zone,vm,start,end,...)"),
    json_out: bool = typer.Option(False, "--json"),
    plot: Path | None = typer.Option(None, "--plot", help="write CDFs of time and cost to this PNG"),
    fit: bool = typer.Option(False, "--fit", help="print the fitted revocation models and their goodness of fit"),
    replay: str | None = typer.Option(None, "--replay", help="replay a finished job's revocations; sim vs measured"),
) -> None:
    """What would this cluster cost and how long would it take, under real revocation traces?"""
    from orchestrator.cli.simulate_cmd import simulate_command

    simulate_command(list(specs or []), runs, seed, price_book, trace, json_out, plot, fit, replay)


@app.command("daemon")
def daemon(
    interval: float = typer.Option(2.0, "--interval", help="seconds between reconcile passes"),
    gc_every: float = typer.Option(300.0, "--gc-every", help="seconds between orphan sweeps"),
    once: bool = typer.Option(False, "--once", help="run one pass and exit"),
) -> None:
    """Watch every active job: detect revocations, replace, resume, tear down. Survives restarts."""
    from orchestrator.control.daemon import run_daemon

    run_daemon(interval_s=interval, gc_every_s=gc_every, once=once)


@app.command("gc")
def gc(yes: bool = typer.Option(False, "--yes", help="delete them (default: only list)")) -> None:
    """List (and with --yes delete) labelled instances whose job is finished or unknown."""
    from orchestrator.control.gc import gc_command

    gc_command(delete=yes)


app.command("catalog")(catalog_cmd.catalog_command)
app.add_typer(db_cmd.app, name="db")


def _register_groups() -> None:
    # Sub-command groups that live in their own modules.
    from orchestrator.cli import model_cmd

    app.add_typer(model_cmd.app, name="model", help="Cost model: profile, calibrate, predict, validate.")
    from orchestrator.cli import image_cmd

    app.add_typer(image_cmd.app, name="image", help="Bake worker / parameter-server boot images (GCE).")


def _print_spec_error(exc: SpecError) -> None:
    where = f" in {exc.source}" if exc.source else ""
    err_console.print(f"[bold red]error:[/bold red] the job spec{where} is invalid "
                      f"({len(exc.errors)} problem{'s' if len(exc.errors) != 1 else ''}):", highlight=False)
    for e in exc.errors:
        err_console.print(f"  {e}", highlight=False, markup=False)
    err_console.print("nothing was created.", highlight=False)


def main() -> None:
    _register_groups()
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=sys.argv[1:], prog_name="orchestrator", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except SpecError as exc:
        _print_spec_error(exc)
        sys.exit(2)
    except (UserError, CatalogError) as exc:
        err_console.print(f"[bold red]error:[/bold red] {exc}", highlight=False)
        hint = getattr(exc, "hint", None)
        if hint:
            err_console.print(f"hint: {hint}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
