"""Entry point: `orchestrator VERB ...`. Bad input exits 2 with field-level messages, never a traceback."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
import typer.core
from rich.markup import escape

from orchestrator import __version__
from orchestrator.cli import catalog_cmd, dashboard, db_cmd, image_cmd, jobs_cmd, model_cmd, probe_cmd
from orchestrator.cli.options import PORT_MAX, finite, plot_file, positive_seconds
from orchestrator.cli.render import err_console
from orchestrator.model.catalog import CatalogError
from orchestrator.model.errors import UserError
from orchestrator.store.env import ENV_URL

if TYPE_CHECKING:
    from orchestrator.model.spec import SpecError

app = typer.Typer(
    help="Train deep-learning models on transient (spot / preemptible) GPUs: plan, launch, survive "
    "revocations, and record cost, time and accuracy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    # Eager: runs while parsing, so `orchestrator --version` needs no command after it.
    if value:
        print(f"orchestrator {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    db: str | None = typer.Option(None, "--db", help=f"SQLAlchemy URL of the results DB (or ${ENV_URL})"),
    version: bool = typer.Option(False, "--version", help="print the version and exit", is_eager=True,
                                 callback=_print_version),
) -> None:
    if db:
        os.environ[ENV_URL] = db


app.command("launch")(jobs_cmd.launch)


@app.command("plan")
def plan(
    spec: Path = typer.Argument(..., help="job spec (YAML); a training.model: {torch: MODULE:FACTORY} factory is run, "
                                "in a child process without the controller's secrets, to profile the model"),
    json_out: bool = typer.Option(False, "--json", help="same as --format json"),
    top: int = typer.Option(8, "--top", min=0, help="how many runner-ups to show"),
    calibration: str | None = typer.Option(None, "--calibration", help="calibration id (DB) or JSON file"),
    fmt: str = typer.Option("table", "--format", help="table | json | csv (csv: one row a candidate)"),
    load: str = typer.Option("measure", "--host-load", help="local provider: other runnable processes sharing "
                             "this host's cores: measure (now) or a number (0 = an idle host)"),
    probe_first: bool = typer.Option(False, "--probe", help="first measure the candidate points (`orchestrator "
                                     "probe`: short jobs, billed), then plan on the measured figures"),
    max_probes: int = typer.Option(4, "--max-probes", min=1, help="with --probe: at most this many points"),
    yes: bool = typer.Option(False, "--yes", help="with --probe: create the probes without asking"),
) -> None:
    """Predict step times, PS load, time and cost of candidate clusters; print the Pareto front."""
    from orchestrator.cli.plan_cmd import plan_command  # lazy: the simulator loads only for this verb

    if probe_first:  # the probes' figures on stderr: stdout is the plan
        from orchestrator.cli.probe_cmd import probe_command  # lazy: the control layer

        probe_command(spec, max_probes, yes, 1.0, json_out=False, to_stderr=True)
    plan_command(spec, json_out, top, calibration, fmt, load)


app.command("probe")(probe_cmd.probe)
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
    plot: Path | None = typer.Option(None, "--plot", help="write CDFs of time and cost to this .png or .svg",
                                      callback=plot_file),
    fit: bool = typer.Option(False, "--fit", help="print the fitted revocation models and their goodness of fit"),
    replay: str | None = typer.Option(None, "--replay", help="replay a finished job's revocations; sim vs measured"),
    calibration: str | None = typer.Option(None, "--calibration", help="cost-model calibration ID (DB) or JSON"),
    cloud: bool = typer.Option(False, "--cloud", help="a local spec: simulate the cloud cluster it emulates"),
    strategies: bool = typer.Option(False, "--strategies",
                                    help="a sync spec: its cluster as data parallel, pipeline and hybrid side by side"),
    availability_trace: Path | None = typer.Option(
        None, "--availability-trace", help="spot availability trace (JSON): replay the deadline policies on it"),
    start_tick: int = typer.Option(0, "--start-tick", help="with --availability-trace: the job starts at this tick"),
    policy_name: str = typer.Option("all", "--policy", help="with --availability-trace: one policy, or all"),
    work_h: float | None = typer.Option(None, "--work-h", callback=finite,
                                        help="with --availability-trace: override the work"),
    deadline_h: float | None = typer.Option(None, "--deadline-h", callback=finite,
                                            help="override policy.deadline (hours)"),
    overhead_min: float | None = typer.Option(None, "--restart-overhead-min", callback=finite,
                                              help="override the restart overhead"),
    history_h: float | None = typer.Option(
        None, "--history-h", callback=finite,
        help="with --availability-trace: hours of the trace before the start the deadline policy has seen "
             "(default 24; 0: as a launch's daemon that no earlier job in its spot market told anything)"),
    also_trace: list[str] = typer.Option(
        [], "--also-trace", metavar="GPU=FILE",
        help="with --availability-trace: another market the job may move to, its GPU type (or the spec's own: another "
             "zone) and its trace over the same days (repeatable); adds the deadline-markets and optimal-markets rows"),
) -> None:
    """What would this cluster cost and how long would it take, under real revocation traces?"""
    if availability_trace is not None:
        from orchestrator.cli.deadline_cmd import availability_command  # lazy: the simulator loads only here

        availability_command(list(specs or []), availability_trace, start_tick, policy_name, json_out, work_h,
                             deadline_h, overhead_min, price_book, history_h, also_trace)
        return
    trace_only = {"--policy": policy_name != "all", "--start-tick": start_tick != 0, "--work-h": work_h is not None,
                  "--deadline-h": deadline_h is not None, "--restart-overhead-min": overhead_min is not None,
                  "--history-h": history_h is not None, "--also-trace": bool(also_trace)}
    if given := [flag for flag, used in trace_only.items() if used]:
        raise UserError(f"{', '.join(given)}: only with --availability-trace FILE.json (the deadline policies' "
                        "replay); drop it, or add the trace")
    from orchestrator.cli.simulate_cmd import simulate_command  # lazy: the simulator loads only for this verb

    simulate_command(list(specs or []), runs, seed, price_book, trace, json_out, plot, fit, replay,
                     calibration=calibration, cloud=cloud, strategies=strategies)


@app.command("daemon")
def daemon(
    interval: float = typer.Option(2.0, "--interval", help="seconds between reconcile passes",
                                    callback=positive_seconds),
    gc_every: float = typer.Option(300.0, "--gc-every", help="seconds between orphan sweeps",
                                    callback=positive_seconds),
    once: bool = typer.Option(False, "--once", help="run one pass and exit"),
    metrics_port: int | None = typer.Option(None, "--metrics-port", min=1, max=PORT_MAX,
                                             help="serve Prometheus metrics on this port"),
    metrics_host: str | None = typer.Option(None, "--metrics-host",
                                             help="address the metrics listen on (default 127.0.0.1; "
                                                  "0.0.0.0: every interface)"),
) -> None:
    """Watch every active job: detect revocations, replace, resume, tear down. Survives restarts."""
    if metrics_host is not None and metrics_port is None:
        raise UserError("--metrics-host: only with --metrics-port P (the metrics are served only then)")
    from orchestrator.control.daemon import run_daemon  # lazy: apscheduler, prometheus (~0.3 s of start-up)

    run_daemon(interval_s=interval, gc_every_s=gc_every, once=once, metrics_port=metrics_port,
               metrics_host=metrics_host)


@app.command("gc")
def gc(yes: bool = typer.Option(False, "--yes", help="delete them (default: only list)")) -> None:
    """List (and with --yes delete) labelled instances whose job is finished or unknown."""
    from orchestrator.cli.gc_cmd import gc_command  # lazy: the control layer loads only for this verb

    gc_command(delete=yes)


app.command("catalog")(catalog_cmd.catalog_command)
app.command("dashboard")(dashboard.dashboard_command)
app.add_typer(db_cmd.app, name="db")


def _register_groups() -> None:
    # Sub-command groups that live in their own modules.
    app.add_typer(model_cmd.app, name="model", help="Cost model: profile, calibrate, predict, validate.")
    app.add_typer(image_cmd.app, name="image", help="Bake worker / parameter-server boot images (GCE).")


def _click_exception() -> type[Exception]:
    """The ClickException class of the click that typer runs on, without importing click ourselves.

    typer >= 0.2x vendors click as ``typer._click`` (and no longer depends on click); older typer
    imports the click package. Both are reachable from typer.core, so whichever the lock installs works.
    """
    for name in ("_click", "click"):
        found = getattr(getattr(typer.core, name, None), "ClickException", None)
        if isinstance(found, type) and issubclass(found, Exception):
            return found
    return _NeverRaised


class _NeverRaised(Exception):
    """Stands in for ClickException if typer ever stops exposing one (then typer's own Exit still works)."""


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


def _usage_error(exc: Exception) -> int:
    """Print a click usage error as one line naming the command's --help; return its exit code."""
    code = getattr(exc, "exit_code", 2)
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":  # a bare `orchestrator` or group: show the help
        err_console.print(exc.format_message() if hasattr(exc, "format_message") else str(exc),
                          highlight=False, markup=False)
        return int(code) if isinstance(code, int) else 2
    where = getattr(ctx, "command_path", None) or "orchestrator"
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    err_console.print(f"{where}: error: {_one_line(message)} (see '{where} --help')", highlight=False, markup=False,
                      soft_wrap=True)
    return int(code) if isinstance(code, int) else 2


def _print_spec_error(exc: SpecError) -> None:
    what = exc.what
    if len(exc.errors) == 1:  # one problem, one line: the field, what is wrong and the fix
        msg = str(exc.errors[0]) if exc.errors[0].path else exc.errors[0].message
        text = msg if exc.source and exc.source in msg else f"{what} {exc.source}: {msg}"
        err_console.print(f"error: {text}; nothing was created", highlight=False, markup=False, soft_wrap=True)
        return
    where = f" in {escape(exc.source)}" if exc.source else ""
    err_console.print(f"[bold red]error:[/bold red] the {what}{where} is invalid "
                      f"({len(exc.errors)} problem{'s' if len(exc.errors) != 1 else ''}):", highlight=False,
                      soft_wrap=True)
    for e in exc.errors:  # one line each, however narrow the terminal
        err_console.print(f"  {e}", highlight=False, markup=False, soft_wrap=True)
    err_console.print("nothing was created.", highlight=False)


def main() -> None:
    _register_groups()
    command = typer.main.get_command(app)
    click_exception = _click_exception()
    try:
        rv = command.main(args=sys.argv[1:], prog_name="orchestrator", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except (UserError, CatalogError) as exc:
        _print_user_error(exc)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except click_exception as exc:
        sys.exit(_usage_error(exc))
    except Exception as exc:
        code = _spec_error(exc) or _db_error(exc)
        if code is None:
            raise
        sys.exit(code)
    sys.exit(rv if isinstance(rv, int) else 0)


def _spec_error(exc: Exception) -> int | None:
    """An invalid spec or inventory (exit 2); None for any other error. Like ``_db_error``, the class is looked
    up: the spec's models (pydantic, ~0.3 s) load only for a verb that reads a spec."""
    base = sys.modules.get("orchestrator.model.spec.base")
    if base is None or not isinstance(exc, base.SpecError):
        return None
    _print_spec_error(exc)
    return 2


def _db_error(exc: Exception) -> int | None:
    """A results-DB error as one line and its exit code; None for any other error. SQLAlchemy is looked up,
    not imported: a command that never opened the DB cannot raise its errors, and the CLI starts faster."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None:
        return None
    if isinstance(exc, sa_exc.ArgumentError):  # the URL itself is never echoed: it may hold a password
        err_console.print(f"error: cannot parse the results-DB URL given by --db or ${ENV_URL}; use e.g. "
                          "sqlite:////abs/path/orchestrator.db or postgresql://user@host:5432/db", highlight=False,
                          markup=False, soft_wrap=True)
        return 2
    if isinstance(exc, sa_exc.OperationalError):
        reason = _one_line(str(exc.orig) if exc.orig is not None else str(exc), 200)
        err_console.print(f"error: the results DB is unreachable ({reason}); check --db / ${ENV_URL} and that the "
                          "server is running", highlight=False, markup=False, soft_wrap=True)
        return 1
    return None


def _print_user_error(exc: Exception) -> None:
    # One line: what is wrong, then the fix. Multi-line details (a quota table) keep their own lines.
    hint = getattr(exc, "hint", None)
    text = str(exc) + (f" — fix: {hint}" if hint else "")
    err_console.print(f"[bold red]error:[/bold red] {escape(text)}", highlight=False, soft_wrap=True, emoji=False)


if __name__ == "__main__":
    main()
