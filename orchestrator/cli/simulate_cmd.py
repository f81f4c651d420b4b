"""`orchestrator simulate`: Monte Carlo of time and cost under revocations, fits, comparisons, replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.cli.model_torch import prepare_spec
from orchestrator.cli.render import console, duration, money, pct, table
from orchestrator.costmodel import Calibration
from orchestrator.costmodel.revocation.model import KINDS, FitSummary, RevocationModel, load_revocation_model
from orchestrator.costmodel.revocation.traces import TraceError
from orchestrator.model.errors import UserError
from orchestrator.model.spec import load_spec
from orchestrator.planning.calibration import planning_calibration, resolve_calibration
from orchestrator.sim.engine import NoRevocations, simulate
from orchestrator.sim.from_spec import SimSpecError, cluster_from_spec
from orchestrator.sim.montecarlo import MonteCarloResult, run_monte_carlo
from orchestrator.sim.replay_db import replay_job
from orchestrator.store.db import open_session


def simulate_command(
    specs: list[Path],
    runs: int,
    seed: int,
    price_book: str | None,
    trace: Path | None,
    json_out: bool,
    plot: Path | None,
    fit: bool,
    replay: str | None,
    model_kind: str = "bathtub",
    calibration: str | None = None,
    cloud: bool = False,
    strategies: bool = False,
) -> None:
    """Simulate each spec ``runs`` times; print (or --json) the distributions of time and cost (``strategies``:
    each spec's cluster as data parallel, pipeline and hybrid)."""
    _check_args(specs, runs, fit, replay, model_kind)
    try:
        model = load_revocation_model(trace)
    except TraceError as exc:
        raise UserError(str(exc)) from None
    out = _fits_and_replay(model, fit, replay, json_out)
    calib = resolve_calibration(calibration)
    if strategies:
        from orchestrator.cli.simulate_strategies import strategies_command  # lazy: the planner's partitioner

        strategies_command(specs, runs, seed, price_book, calib, cloud, model, model_kind, json_out)
        return
    results = [(path, _monte_carlo(path, runs, seed, price_book, calib, cloud, model, model_kind)) for path in specs]
    summaries = [_summary(path, mc) for path, mc in results]
    for s, (_, mc) in zip(summaries, results, strict=True):
        # Which lifetime model each GPU type gets: GPUs the 2019 trace lacks (L4, A100, H100...) use the pooled fit.
        gpus = sorted({slot.gpu for slot in mc.cluster.slots if slot.gpu and slot.spot})
        s["revocation_model_by_gpu"] = {g: model.coverage(g, model_kind) for g in gpus}
    if json_out:
        if summaries and not out:
            print(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2))
        else:
            if summaries:
                out["simulations"] = summaries
            print(json.dumps(out, indent=2))
    elif summaries:
        _print_summaries(summaries)
    if plot is not None and results:
        write_cdf_plot(results, plot)
        if not json_out:
            console.print(f"wrote {plot}")


def _check_args(specs: list[Path], runs: int, fit: bool, replay: str | None, model_kind: str) -> None:
    if runs < 1:
        raise UserError("--runs must be at least 1")
    if model_kind not in KINDS:
        raise UserError(f"'{model_kind}' is not a revocation model; use one of: {', '.join(KINDS)}")
    if not specs and not fit and replay is None:
        raise UserError(
            "give one or more job specs to simulate (or --fit, or --replay JOB_ID)",
            hint="orchestrator simulate examples/reproduce-icac19.yaml --runs 2000",
        )


def _fits_and_replay(model: RevocationModel, fit: bool, replay: str | None, json_out: bool) -> dict[str, Any]:
    """--fit and --replay: printed now, or returned for the JSON document."""
    out: dict[str, Any] = {}
    if fit:
        if json_out:
            out["fits"] = [_fit_dict(f) for f in model.fits()]
        else:
            _print_fits(model)
    if replay is not None:
        with open_session() as session:
            result = replay_job(session, replay)
        if json_out:
            out["replay"] = result
        else:
            _print_replay(result)
    return out


def _monte_carlo(
    path: Path, runs: int, seed: int, price_book: str | None, calibration: Calibration | None, cloud: bool,
    model: RevocationModel, model_kind: str,
) -> MonteCarloResult:
    prepare_spec(path)  # training.model: {torch: ...} is profiled (cached) before the spec is checked
    spec = load_spec(path)
    try:
        calib = calibration if calibration is not None else planning_calibration(spec, as_cloud=cloud)
        cluster = cluster_from_spec(spec, price_book=price_book, calibration=calib, as_cloud=cloud)
    except SimSpecError as exc:
        raise UserError(f"{path}: {exc}") from None
    return run_monte_carlo(cluster, runs, seed, model=model, kind=model_kind)


def _summary(path: Path, mc: MonteCarloResult) -> dict[str, Any]:
    s = mc.summary()
    base = simulate(mc.cluster, NoRevocations())
    s["path"] = str(path)
    s["no_revocations"] = {"time_s": base.wall_time_s, "cost_usd": base.cost_usd}
    s["hourly_price_usd"] = mc.cluster.hourly_price()
    return s


def _print_summaries(summaries: list[dict[str, Any]]) -> None:
    def p(x: float | None) -> str:
        return "—" if x is None else pct(x)

    rows: list[list[Any]] = []

    def add(label: str, fn: Any) -> None:
        rows.append([label, *(fn(s) for s in summaries)])

    for q in ("mean", "p10", "p50", "p90"):
        add(f"wall time {q}", lambda s, q=q: duration(s["time_s"][q]))
    for q in ("mean", "p10", "p50", "p90"):
        add(f"cost {q}", lambda s, q=q: money(s["cost_usd"][q]))
    add("cost ps/chief/workers", lambda s: "/".join(money(v) for v in s["cost_by_role_usd"].values()))
    add("no revocation: time/cost", lambda s: f"{duration(s['no_revocations']['time_s'])}/"
        f"{money(s['no_revocations']['cost_usd'])}")
    add("revocations mean/p90", lambda s: f"{s['revocations']['mean']:.2f}/{s['revocations']['p90']:.0f}")
    add("replacements (mean)", lambda s: f"{s['replacements_mean']:.2f}")
    add("steps lost (mean)", lambda s: f"{s['steps_lost_mean']:.0f}")
    add("P(finished)", lambda s: pct(s["p_finished"]))
    add("P(miss deadline)", lambda s: p(s["p_miss_deadline"]) + (f" ({duration(s['deadline_s'])})"
                                                                  if s["deadline_s"] else ""))
    add("P(over budget)", lambda s: p(s["p_over_budget"]) + (f" ({money(s['budget_usd'])})"
                                                             if s["budget_usd"] else ""))
    add("failures", lambda s: ", ".join(f"{k}: {v}" for k, v in s["failures"].items()) or "none")
    add("policy / model", lambda s: f"{s['policy']} / {s['revocation_model']}"
        + (", 24 h cap" if s["preemptible_24h_cap"] else ""))
    runs = summaries[0]["runs"]
    title = f"Simulated {runs} runs per spec (seed {summaries[0]['seed']})"
    console.print(table(title, ["", *(s["spec"] for s in summaries)], rows))
    for s in summaries:
        for line in s.get("revocation_model_by_gpu", {}).values():
            console.print(f"[dim]{s['spec']}: revocation model for {line}[/dim]")
        if not s["preemptible_24h_cap"]:
            console.print(f"[dim]{s['spec']}: spot VMs, no 24 h cap (only legacy preemptible VMs had one; "
                          "the 2019-02 book simulates those)[/dim]")


_SHORT = {"empirical": "KM", "exponential": "exp"}


def _fmt_params(f: FitSummary) -> str:
    p = f.params
    if "hazard_multiplier" in p:
        return f"x{p['hazard_multiplier']:.2f}"
    if f.kind == "exponential":
        return f"mean {p['mean_h']:.0f} h"
    if f.kind == "weibull":
        return f"k={p['shape']:.2f} s={p['scale_h']:.0f} h"
    if f.kind == "bathtub":
        early = f"k={p['shape_early']:.2f} s={p['scale_early_h']:.0f} h"
        if (24.0 / p["scale_late_h"]) ** p["shape_late"] < 1e-3:
            return early + " + no late surge"
        return early + f" + late k={p['shape_late']:.0f} s={p['scale_late_h']:.1f} h"
    return f"{p.get('steps', 0):.0f} steps"


def _fit_dict(f: FitSummary) -> dict[str, Any]:
    return {
        "gpu": f.gpu,
        "zone": f.zone,
        "kind": f.kind,
        "params": f.params,
        "n": f.n,
        "revoked": f.events,
        "loglik": f.loglik,
        "aic": f.aic,
        "ks": f.ks,
        "revoked_before_23_9h": {"trace": f.revoked_observed, "model": f.revoked_model},
        "revoked_first_hour": {"trace": f.first_hour_observed, "model": f.first_hour_model},
        "note": f.note,
    }


def _pct0(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "" if x is None else format(x, fmt)


def _print_fits(model: RevocationModel) -> None:
    fits = model.fits()
    pooled = [f for f in fits if f.zone is None]
    rows = [
        [
            f.gpu,
            _SHORT.get(f.kind, f.kind),
            _fmt_params(f),
            f"{f.events}/{f.n}" if f.n else "",
            _num(f.aic),
            _num(f.ks, ".3f"),
            f"{_pct0(f.revoked_observed)}/{_pct0(f.revoked_model)}",
            f"{_pct0(f.first_hour_observed)}/{_pct0(f.first_hour_model)}",
        ]
        for f in pooled
    ]
    cols = ["type", "model", "parameters", "revoked", "AIC", "KS", "<23.9h", "<1h"]
    console.print(table(f"Revocation models fitted to {model.trace.path.name} (censored MLE; "
                        "last columns: trace/model)", cols, rows))
    zrows = [
        [f.gpu, f.zone, f"{f.events}/{f.n}", f"{f.params.get('hazard_multiplier', 1.0):.2f}",
         _num(f.ks, ".3f"), f"{_pct0(f.revoked_observed)}/{_pct0(f.revoked_model)}"]
        for f in fits
        if f.zone is not None and f.kind == "bathtub"
    ]
    if zrows:
        console.print(table("Zones: pooled bathtub x hazard multiplier = (revoked + 2) / (expected + 2)",
                            ["type", "zone", "revoked", "multiplier", "KS", "<23.9h trace/model"], zrows))
    console.print("[dim]KM: Kaplan-Meier. KS: largest gap to the KM CDF. cpu: no trace rows, fitted to "
                  "revocation_summary.csv. GPU types absent from the trace use 'all'. Weekends: hazard x "
                  f"{model.calendar.weekend:g} when a start time is given.[/dim]")


def _print_replay(result: dict[str, Any]) -> None:
    m, s = result["measured"], result["simulated"]
    rows = [
        ["wall time", duration(m["wall_time_s"]), duration(s["wall_time_s"])],
        ["cost", money(m["cost_usd"]), money(s["cost_usd"])],
        *([f"cost {k}", money(m["cost_by_role_usd"].get(k)), money(s["cost_by_role_usd"].get(k))]
          for k in ("ps", "chief", "workers")),
        ["revocations", m["revocations"], s["revocations"]],
        ["replacements", m["replacements"], s["replacements"]],
        ["steps", m["steps_done"], f"{s['steps_done']:.0f}"],
        ["steps lost", "", f"{s['steps_lost']:.0f}"],
        ["outcome", m["status"], "finished" if s["finished"] else f"failed ({s['failure']})"],
    ]
    console.print(table(f"Replay of job {result['job_id']} ({result['spec']}): measured vs simulated",
                        ["", "measured", "simulated"], rows))
    d = result.get("delays") or {}
    delays = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.2f} s" for k, v in d.items())
    console.print(f"[dim]boot delay {result['boot_delay_s']:.1f} s (median measured); "
                  f"{len(result['schedule'])} revocations replayed; measured step rates for "
                  f"{len(result['step_rates'])} workers and {len(result.get('set_rates') or {})} sets of "
                  f"live workers; measured delays: {delays or 'none'}[/dim]")


def cdf_notes(mc: MonteCarloResult) -> tuple[str | None, str | None]:
    """What to say instead of drawing a CDF of identical values (one vertical line that tells nothing): for
    the time panel and the cost panel, None where the runs differ and the CDF is drawn."""
    name, deadline = mc.cluster.name, mc.cluster.deadline_s
    all_hit = deadline is not None and bool(np.all(mc.deadline_missed))
    time_note = (f"{name}: all runs hit the deadline ({duration(deadline)}); none finished" if all_hit
                 else f"{name}: every run took {duration(float(mc.time_s[0]))}" if float(np.ptp(mc.time_s)) == 0
                 else None)
    cost_note = (f"{name}: every run cost {money(float(mc.cost_usd[0]))}"
                 + (" (stopped at the deadline)" if all_hit else "") if float(np.ptp(mc.cost_usd)) == 0 else None)
    return time_note, cost_note


def write_cdf_plot(results: list[tuple[Path, MonteCarloResult]], path: Path) -> None:
    """PNG or SVG (the --plot option checked which) with the empirical CDFs of wall time (hours) and cost (USD),
    one line per spec."""
    import matplotlib  # lazy: matplotlib (~0.3 s) loads only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib; after use("Agg"), so no display is needed

    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(11, 4.2))
    t_max = max(float(np.max(mc.time_s)) for _, mc in results)
    unit, scale = ("h", 3600.0) if t_max > 7200 else ("min", 60.0)
    said: dict[Any, int] = {ax_t: 0, ax_c: 0}

    def say(ax: Any, text: str, colour: str) -> None:
        # A CDF of identical values is one vertical line that tells nothing: say it in the panel instead.
        ax.text(0.03, 0.92 - 0.1 * said[ax], text, transform=ax.transAxes, fontsize=9, color=colour, va="top")
        said[ax] += 1

    for i, (_, mc) in enumerate(results):
        n = len(mc.time_s)
        y = np.arange(1, n + 1) / n
        colour = f"C{i}"
        deadline, budget = mc.cluster.deadline_s, mc.cluster.budget_usd
        time_note, cost_note = cdf_notes(mc)
        if time_note:
            say(ax_t, time_note, colour)
        else:
            ax_t.step(np.sort(mc.time_s) / scale, y, where="post", label=mc.cluster.name, color=colour)
        if cost_note:
            say(ax_c, cost_note, colour)
        else:
            ax_c.step(np.sort(mc.cost_usd), y, where="post", label=mc.cluster.name, color=colour)
        # Every limit stays on its axis (x from 0 covers it), even far beyond the runs: how far is the point.
        if deadline:
            ax_t.axvline(deadline / scale, linestyle=":", linewidth=1, color=colour)
        if budget:
            ax_c.axvline(budget, linestyle=":", linewidth=1, color=colour)
    ax_t.set_xlabel(f"wall time ({unit}); dotted: deadline")
    ax_c.set_xlabel("cost (USD); dotted: budget")
    for ax in (ax_t, ax_c):
        ax.set_xlim(left=0, right=ax.get_xlim()[1])  # autoscale already covers the limit lines
        ax.ticklabel_format(axis="x", useOffset=False)
        ax.set_ylabel("fraction of runs")
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 1.05)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="lower right")
    runs = results[0][1].runs
    fig.suptitle(f"Simulated time and cost under revocations ({runs} runs per spec)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
