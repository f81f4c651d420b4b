"""What `orchestrator model ...` does (its verbs' options: cli/model_cmd.py): the cost model's profiles,
calibration, predictions and validation. Loaded only when a model verb runs (the cost model takes ~0.3 s)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from orchestrator.cli.listing import Col, check_format, print_csv, print_json, print_table
from orchestrator.cli.model_torch import predict_torch, profile_torch
from orchestrator.cli.render import console
from orchestrator.clock import WALL
from orchestrator.costmodel import (
    DEFAULT_CALIBRATION,
    MODEL_NAMES,
    Calibration,
    Efficiency,
    Measurement,
    ModelProfile,
    UnknownModelError,
    Validation,
    get_profile,
    leave_one_gpu_out,
    load_measurements,
    max_batch,
)
from orchestrator.costmodel.accounting import CPU_REFERENCE, fit_local_host
from orchestrator.costmodel.calibration import FitReport, fit_report, measurements_from_dicts, unprofiled_models
from orchestrator.costmodel.calibration import mape as in_sample_mape
from orchestrator.costmodel.compute import runtime_key
from orchestrator.costmodel.memory import memory_bytes, usable_bytes
from orchestrator.costmodel.stepmodel import layer_times, step_fn
from orchestrator.model.catalog import CatalogError, load_catalog
from orchestrator.model.errors import UserError
from orchestrator.planning.calibration import latest_calibration, resolve_calibration
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.store.db import open_session

if TYPE_CHECKING:
    pass

# ---------------------------------------------------------------- shared helpers


def _with_local_host(calib: Calibration) -> Calibration:
    """Add this host's CPU step, start-up and teardown fitted on the DB's finished local jobs."""
    from orchestrator.store.queries import local_run_timings  # lazy: the ORM models (~30 ms) only for DB verbs

    with open_session() as session:
        runs = local_run_timings(session)
    try:
        host = fit_local_host(runs, step_model_for)
    except ValueError as exc:
        console.print(f"warning: {escape(str(exc))}")
        return calib
    steps = ", ".join(
        f"{framework} {host[f'{prefix}cpu_step_s']:.3f} s ({model}, batch {host[f'{prefix}cpu_step_batch']:.0f}, "
        f"alone; start-up {host[f'{prefix}startup_s']:.1f} s)"
        for framework, (model, prefix) in CPU_REFERENCE.items() if f"{prefix}cpu_step_s" in host
    )
    console.print(f"local host from {host['jobs']:.0f} finished local job(s): CPU step {steps}, "
                  f"teardown {host['teardown_s']:.1f} s")
    return replace(calib, local_host=host)


def _measurements(path: Path | None, from_db: bool) -> list[Measurement]:
    rows: list[Measurement] = []
    if path is not None:
        try:
            rows += load_measurements(path)
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror}") from None
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if from_db:
        from orchestrator.store.queries import step_time_measurements  # lazy: the ORM models (~30 ms)

        with open_session() as session:
            found = step_time_measurements(session)
        for r in found:
            if "refused" in r:
                console.print(f"warning: job {escape(r['job_id'])} left out: {escape(r['refused'])}")
        found = [r for r in found if "refused" not in r]
        for model in (unknown := unprofiled_models(r["model"] for r in found)):
            console.print(f"warning: the DB's step times of {escape(model)} left out: no cost-model profile of it "
                          "on this machine (`orchestrator model profile --torch` makes one)")
        found = [r for r in found if r["model"] not in unknown]
        try:
            rows += measurements_from_dicts(found)
        except ValueError as exc:
            raise UserError(f"a measured step time in the DB is unusable: {exc}") from None
    if path is None and not from_db:
        raise UserError(
            "give the measurements: a CSV or a folder of CSVs (`model calibrate data/measurements`, or "
            "--measurements FILE.csv), and/or --from-db",
            hint="CSV columns: model,gpu,batch,step_time_s (see docs/costmodel.md)",
        )
    if not rows:
        raise UserError(
            "no measurements found"
            + (" in the results DB (no finished job logged step times)" if from_db else "")
        )
    return rows


def _check_model(model: str) -> None:
    try:
        get_profile(model)
    except UnknownModelError as exc:
        raise UserError(str(exc)) from None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _calibration_rows(calib: Calibration) -> list[list[Any]]:
    def row(key: str, e: Efficiency) -> list[Any]:
        hb = "prior" if e.half_batch is None else f"{e.half_batch:.0f}"
        return [key, f"{e.eff_compute:.3f}", f"{e.eff_memory:.3f}", _ms(e.overhead_s),
                f"{e.overhead_per_kernel_s * 1e6:.1f}", hb]

    rows = [row("(default)", calib.default)]
    for key, e in sorted(calib.per_gpu.items()):
        rows.append(row(f"{key} ({calib.points.get(key, 0)})", e))
    return rows


# ---------------------------------------------------------------- commands


def calibrate(file: Path | None, measurements: Path | None, from_db: bool, out: Path | None, name: str | None,
              save: bool) -> None:
    """Fit the step-time model (per GPU x runtime x model) and network constants to measured points."""
    measurements = measurements or file
    rows = _without_emulated(_measurements(measurements, from_db))
    label = name or WALL.now().strftime("calibration-%Y%m%d-%H%M%S")
    source = ", ".join(
        s for s in (str(measurements) if measurements else "", "results DB" if from_db else "") if s
    )
    report, validation = _fit(rows, label, from_db)
    for w in report.warnings:
        console.print(f"warning: {escape(w)}")
    calib = report.calibration
    if calib.emulated:
        console.print("note: fitted on emulated (local provider) GPUs: stored apart, never used to plan real GPUs")
        calib = _with_local_host(calib) if from_db else calib
    err = validation.mape if validation else None
    calib = calib.with_meta(source=f"{calib.source} (from {source})", mape=err)
    if out is not None:
        calib.save(out)
    stored: int | None = None
    if from_db or save:
        from orchestrator.store.queries import save_calibration  # lazy: the ORM models (~30 ms)

        with open_session() as session:
            stored = save_calibration(session, label, source, calib.to_dict(), err)
    _print_calibration(label, calib, rows, err)
    if out is not None:
        console.print(f"wrote {out}")
    if stored is not None:
        console.print(f"stored as calibration {stored} (use --calibration {stored})")


def _without_emulated(rows: list[Measurement]) -> list[Measurement]:
    """Mixed rows lose the emulated (local) GPUs' step times; rows of emulated GPUs only are kept."""
    if any(m.emulated for m in rows) and not all(m.emulated for m in rows):
        real = [m for m in rows if not m.emulated]
        console.print(f"warning: {len(rows) - len(real)} step times of emulated (local) GPUs left out: they "
                      "calibrate nothing real")
        return real
    return rows


def _fit(rows: list[Measurement], label: str, from_db: bool) -> tuple[FitReport, Validation | None]:
    """The fitted calibration and, with two GPU types or more, its leave-one-GPU-out validation."""
    base = None
    if from_db and not all(m.emulated for m in rows):  # jobs refine the newest stored (or shipped) calibration
        base = latest_calibration(real=True) or DEFAULT_CALIBRATION
        console.print(f"refining calibration {escape(base.name)}")
    try:
        report = fit_report(rows, name=label, base=base)
        gpus = {load_catalog().gpu(m.gpu).key for m in rows if m.is_compute}
        validation = leave_one_gpu_out(rows) if len(gpus) >= 2 else None
    except (ValueError, CatalogError, UnknownModelError) as exc:
        raise UserError(str(exc)) from None
    return report, validation


def _print_calibration(label: str, calib: Calibration, rows: list[Measurement], err: float | None) -> None:
    print_table(f"calibration {label}: {calib.source}",
                [Col("key (points)", whole=True), Col("eff_compute", right=True), Col("eff_memory", right=True),
                 Col("overhead ms", right=True), Col("kernel us", right=True), Col("half batch", right=True)],
                _calibration_rows(calib))
    for rt, fits in sorted(calib.machines.items()):
        console.print(f"machine fits ({rt}; a user's `torch:` model is planned with these): " + "; ".join(
            f"{g}/{p} {f.overhead_s * 1e3:.2f} ms + {f.per_kernel_s * 1e6:.1f} us a kernel, compute x"
            f"{f.compute_scale:.2f}, memory x{f.memory_scale:.2f} ({f.points} rows)"
            for (g, p), f in sorted(fits.items())))
    net = calib.net
    console.print(
        f"network: efficiency {net.net_efficiency:.2f}, PS CPU per variable "
        f"{net.ps_cpu_per_variable_s * 1e6:.1f} us, request latency {net.request_latency_s * 1e3:.2f} ms"
    )
    console.print(
        f"in-sample MAPE {in_sample_mape([m for m in rows if m.is_compute], calib):.1%}"
        + (
            f"; leave-one-GPU-out MAPE {err:.1%}"
            if err is not None
            else " (one GPU type: no leave-one-GPU-out validation)"
        )
    )


def predict(model: str | None, gpu: str, batch: int, calibration: str | None, runtime: str | None, precision: str,
            torch_ref: str | None, measurements: Path | None, json_out: bool, fmt: str) -> None:
    """Predict one worker's compute step time (and whether the batch fits the GPU's memory)."""
    fmt = "json" if json_out else check_format(fmt)
    if torch_ref is not None:
        predict_torch(torch_ref, gpu, batch, precision, runtime or "pytorch-eager", measurements, fmt == "json")
        return
    if model is None:
        raise UserError("give --model NAME or --torch MODULE:FACTORY")
    runtime = runtime or "tf1-graph"
    _check_model(model)
    # none named: the calibration `plan` reads for a cloud's GPUs (the newest stored of real GPUs, else shipped)
    calib = (resolve_calibration(calibration) if calibration is not None else latest_calibration(real=True)) \
        or DEFAULT_CALIBRATION
    cat = load_catalog()
    g = cat.gpu(gpu)
    t = step_fn(model, g.key, calib, cat, runtime, precision).at(float(batch))
    comp, mem = layer_times(model, g.key, batch, calib, cat)
    result = {
        "model": model,
        "gpu": g.key,
        "batch": batch,
        "step_time_s": t,
        "steps_per_s": 1.0 / t,
        "examples_per_s": batch / t,
        "calibration": calib.describe(g.key, runtime_key(runtime, precision), model),
        "compute_bound_layers": int((comp >= mem).sum()),
        "layers": len(comp),
        "memory_gb": memory_bytes(model, batch) / 1e9,
        "usable_memory_gb": usable_bytes(g.key) / 1e9,
        "max_batch": max_batch(model, g.key),
        "fits": batch <= max_batch(model, g.key),
    }
    if fmt == "json":
        print(json.dumps(result, indent=2))
        return
    if fmt == "csv":
        print_csv([result])
        return
    console.print(
        f"{model} on {g.key} at batch {batch}: [bold]{_ms(t)} ms[/bold] a step "
        f"({result['steps_per_s']:.2f} steps/s, {result['examples_per_s']:.0f} examples/s; "
        f"calibration {result['calibration']})"
    )
    console.print(
        f"{result['compute_bound_layers']} of {result['layers']} layers compute-bound; memory "
        f"{result['memory_gb']:.2f} of {result['usable_memory_gb']:.2f} GB usable "
        f"(max batch {result['max_batch']})" + ("" if result["fits"] else " [red]DOES NOT FIT[/red]")
    )


def validate(measurements: Path | None, json_out: bool, fmt: str) -> None:
    """Leave-one-GPU-out validation: fit without each GPU type, predict it from its specs, report the MAPE."""
    fmt = "json" if json_out else check_format(fmt)
    rows = _measurements(measurements, from_db=measurements is None)
    try:
        v = leave_one_gpu_out(rows)
    except (ValueError, CatalogError, UnknownModelError) as exc:
        raise UserError(str(exc)) from None
    if fmt == "json":
        print(json.dumps(v.to_dict(), indent=2))
        return
    if fmt == "csv":
        print_csv([{"gpu": p.gpu, "rows": p.rows, "mape": p.mape, "max_ape": p.max_ape} for p in v.per_gpu],
                  keys=("gpu", "rows", "mape", "max_ape"))
        return
    print_table("leave-one-GPU-out validation (fit on the other GPUs, predict this one)",
                [Col("held-out GPU", whole=True), Col("rows", right=True), Col("MAPE", right=True),
                 Col("max error", right=True)],
                [[p.gpu, p.rows, f"{p.mape:.1%}", f"{p.max_ape:.1%}"] for p in v.per_gpu])
    console.print(f"overall held-out MAPE [bold]{v.mape:.1%}[/bold] (in-sample {v.in_sample_mape:.1%})")


def profile(model: str | None, gpu: str | None, batch: int, torch_ref: str | None, precision: str, no_cache: bool,
            json_out: bool, fmt: str) -> None:
    """Per-layer FLOPs, bytes, parameters and activation memory of a model (analytic, or --torch: measured)."""
    fmt = "json" if json_out else check_format(fmt)
    if torch_ref is not None:
        profile_torch(torch_ref, fmt == "json", gpu, batch, precision, no_cache)
        return
    if model is None:
        _print_profiles(fmt)
        return
    _check_model(model)
    p = get_profile(model)
    times: tuple[Any, Any] | None = None
    if gpu is not None:
        g = load_catalog().gpu(gpu)
        times = layer_times(model, g.key, batch)
    records = _layer_records(p, times)
    if fmt != "table":
        print_json(records) if fmt == "json" else print_csv(records)
        return
    cols = [Col("layer", whole=True), Col("kind"), Col("output", whole=True)]
    if times is None:
        cols += [Col("params", right=True), Col("MFLOPs", right=True), Col("KiB", right=True)]
    else:  # the times replace params and KiB (still in --format json / csv) so that the row fits
        cols += [Col("MFLOPs", right=True), Col("comp ms", right=True), Col("mem ms", right=True), Col("bound")]
    print_table(f"{p.name}: {p.description}; one example = {p.example}" + (
        f"; times at batch {batch} on {gpu}" if times is not None else ""), cols, [_layer_row(r) for r in records],
        note="KiB: activations kept for the backward pass; every byte count and time: --format json or csv")
    console.print(
        f"total: {p.params:,} trainable + {p.non_trainable_params:,} non-trainable parameters "
        f"({p.param_bytes / 2**20:.2f} MiB), {p.macs / 1e6:,.1f} MMACs = {p.flops / 1e6:,.1f} MFLOPs "
        f"forward, {p.activation_bytes / 2**20:.2f} MiB activations per example"
    )
    if times is not None:
        total = float(sum(max(float(a), float(b)) for a, b in zip(times[0], times[1], strict=True)))
        fn = step_fn(model, gpu or "", DEFAULT_CALIBRATION)
        console.print(
            f"step on {gpu} at batch {batch}: {fn.at(batch) * 1e3:.2f} ms = smooth max of {total * 1e3:.2f} ms of "
            f"GPU layers and {fn.host_s * 1e3:.1f} ms of host overhead (calibration {DEFAULT_CALIBRATION.name})"
        )


def _print_profiles(fmt: str) -> None:
    """One line per model: parameters, MACs, FLOPs, bytes and layers."""
    records = []
    for name in MODEL_NAMES:
        p = get_profile(name)
        records.append({"model": name, "trainable_params": p.params, "all_params": p.total_params,
                        "mmacs": p.macs / 1e6, "mflops": p.flops / 1e6, "param_mib": p.param_bytes / 2**20,
                        "activation_mib": p.activation_bytes / 2**20, "layers": len(p.layers), "example": p.example})
    if fmt != "table":
        print_json(records) if fmt == "json" else print_csv(records)
        return
    print_table("model profiles (forward pass, per example; FLOPs = 2 x MACs + element-wise)",
                [Col("model", whole=True), Col("params", right=True), Col("MFLOPs", right=True),
                 Col("param MiB", right=True), Col("act. MiB", right=True), Col("layers", right=True),
                 Col("one example", floor=0)],
                [[r["model"], f"{r['trainable_params']:,}", f"{r['mflops']:,.1f}", f"{r['param_mib']:,.2f}",
                  f"{r['activation_mib']:,.2f}", r["layers"], r["example"]] for r in records],
                note="all params (non-trainable too) and MACs: --format json or csv")


def _layer_records(p: ModelProfile, times: tuple[Any, Any] | None) -> list[dict[str, Any]]:
    """A record per layer; with ``times`` (compute and memory seconds per layer), which one bounds it."""
    rows = []
    for i, layer in enumerate(p.layers):
        row: dict[str, Any] = {
            "layer": layer.name, "kind": layer.kind, "output": "x".join(map(str, layer.output_shape)),
            "params": layer.params, "mflops": layer.flops / 1e6, "read_kib": layer.read_bytes / 1024,
            "write_kib": layer.write_bytes / 1024, "weight_kib": layer.weight_bytes / 1024,
            "saved_kib": layer.saved_bytes / 1024,
        }
        if times is not None:
            c, m = float(times[0][i]), float(times[1][i])
            row |= {"compute_ms": c * 1e3, "memory_ms": m * 1e3, "bound": "compute" if c >= m else "memory"}
        rows.append(row)
    return rows


def _layer_row(r: dict[str, Any]) -> list[Any]:
    row = [r["layer"], r["kind"], r["output"]]
    if "bound" in r:
        return [*row, f"{r['mflops']:,.3f}", f"{r['compute_ms']:.3f}", f"{r['memory_ms']:.3f}", r["bound"]]
    return [*row, f"{r['params']:,}", f"{r['mflops']:,.3f}", f"{r['saved_kib']:,.1f}"]
