"""`orchestrator model profile|predict --torch MODULE:FACTORY`: a user's own PyTorch model."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from orchestrator.cli.render import console, table
from orchestrator.costmodel import host_fit
from orchestrator.costmodel.compute import (
    DEFAULT_CALIBRATION,
    RUNTIME_PRIORS,
    RUNTIMES,
    Calibration,
    layer_arrays,
    model_profile,
)
from orchestrator.costmodel.crossgpu import (
    Point,
    PrecisionError,
    Prediction,
    arch_gpu,
    check_precision,
    class_work,
    layer_times,
    predict,
)
from orchestrator.costmodel.machine_fit import Fits
from orchestrator.costmodel.profiles import ModelProfile, UnknownModelError
from orchestrator.costmodel.stepmodel import MachineFitStep
from orchestrator.model.errors import UserError
from orchestrator.store.env import db_exists


def load_torch_profile(ref: str, use_cache: bool = True) -> tuple[ModelProfile, bool]:
    # a cache miss profiles the factory in a child process (profiler/sandbox.py), never in this one
    from orchestrator.profiler.cache import torch_profile  # lazy: the profiler, only for a torch model
    from orchestrator.profiler.factory_ref import ProfileError  # lazy: the profiler, only for a torch model

    try:
        return torch_profile(ref, use_cache=use_cache)
    except ProfileError as exc:
        raise UserError(f"--torch: {exc}") from None


def _totals(p: ModelProfile) -> dict[str, Any]:
    w = class_work(p)
    return {
        "params": p.params,
        "forward_macs": p.macs,
        "forward_gflops": p.flops / 1e9,
        "forward_macs_g": p.macs / 1e9,
        "train_gflops_by_class": {"tensor": float(w.tensor_flops.sum()) / 1e9,
                                  "vector_and_memory": float(w.vector_flops.sum()) / 1e9},
        "train_bytes_per_example": float(w.bytes.sum()),
        "activation_bytes_per_example": p.activation_bytes,
        "param_bytes": p.param_bytes,
        "layers": len(p.layers),
        "depthwise_layers": sum(layer.depthwise for layer in p.layers),
    }


def profile_torch(ref: str, json_out: bool, gpu: str | None, batch: int, precision: str, no_cache: bool) -> None:
    p, cached = load_torch_profile(ref, use_cache=not no_cache)
    times = _layer_times(p, gpu, precision, batch) if gpu else None
    if json_out:
        doc = {**p.to_dict(), "totals": _totals(p), "cached": cached}
        if times is not None:
            doc["layer_times_s"] = {"gpu": gpu, "batch": batch, "precision": precision, "seconds": times}
        print(json.dumps(doc, indent=1))
        return
    rows = []
    for i, layer in enumerate(p.layers):
        ops = {w.op_class: w for w in layer.train_ops}
        kind = f"{layer.kind} dw" if layer.depthwise else layer.kind  # host_fit scales depthwise apart
        row: list[Any] = [layer.name, kind, f"{layer.params:,}", f"{layer.macs / 1e6:,.2f}"]
        row += [f"{ops[c].flops / 1e6:,.1f}" if c in ops else "" for c in ("tensor", "vector")]
        row += [f"{sum(w.bytes for w in layer.train_ops) / 2**20:,.2f}", f"{layer.saved_bytes / 2**20:,.2f}"]
        if times is not None:
            row.append(f"{times[i] * 1e3:.3f}")
        rows.append(row)
    cols = ["layer", "kind", "params", "fwd MMACs", "train MFLOPs tensor", "train MFLOPs vector", "train MiB moved",
            "saved MiB"] + ([f"ms on {gpu} b={batch} {precision}"] if times is not None else [])
    console.print(table(f"{p.name}: per example, forward + backward", cols, rows))
    t = _totals(p)
    console.print(
        f"total: {t['params']:,} parameters, forward {t['forward_macs_g']:.3f} GMACs = {t['forward_gflops']:.3f} "
        f"GFLOPs per example; a training step moves {t['train_bytes_per_example'] / 2**20:,.1f} MiB and keeps "
        f"{t['activation_bytes_per_example'] / 2**20:,.1f} MiB of activations per example"
        + (f"; {t['depthwise_layers']} depthwise convolutions (kind 'conv dw')" if t["depthwise_layers"] else "")
        + (" (cached profile)" if cached else "")
    )


def _layer_times(p: ModelProfile, gpu: str | None, precision: str, batch: int) -> list[float]:
    try:
        return layer_times(p, gpu or "", check_precision(precision), batch)
    except (KeyError, PrecisionError) as exc:
        raise UserError(str(exc).strip("'\"")) from None


def latest_real_calibration() -> Calibration:
    """The results DB's newest calibration of real GPUs (what the daemon's fold refines and `plan` reads for a
    cloud's GPUs), else the shipped one."""
    if not db_exists():
        return DEFAULT_CALIBRATION
    from sqlalchemy.exc import SQLAlchemyError  # lazy: SQLAlchemy only where a DB is there to read

    from orchestrator.store.calibrations import newest_real_calibration
    from orchestrator.store.db import open_session

    try:
        with open_session() as session:
            return newest_real_calibration(session)
    except SQLAlchemyError:  # a DB this version cannot read: predict with the shipped fits, as with no DB
        return DEFAULT_CALIBRATION


def read_rows(path: Path) -> list[tuple[str, str, Point]]:
    """(model, runtime, point) of every row of a data/measurements-style CSV."""
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise UserError(f"--measurements: cannot read {path}: {exc.strerror}") from None
    out = []
    for i, r in enumerate(rows, start=2):
        try:
            out.append((r.get("model") or "", (r.get("runtime") or "").strip(), Point(
                r["gpu"], int(r["batch"]), check_precision(r.get("precision") or "fp32"), float(r["step_ms"]))))
            arch_gpu(r["gpu"])
        except (KeyError, ValueError, TypeError) as exc:
            raise UserError(f"--measurements {path}:{i}: needs gpu, batch, precision, step_ms ({exc})") from None
    return out


def read_points(path: Path, ref: str) -> list[Point]:
    """Rows of a data/measurements-style CSV whose ``model`` is ``ref`` (or ``torch:ref``)."""
    return [pt for model, _, pt in read_rows(path) if model in (ref, f"torch:{ref}")]


def _machine_fits(ref: str, p: ModelProfile, own: list[Point], rows: list[tuple[str, str, Point]], runtime: str,
                  skipped: list[str]) -> host_fit.Fits:
    """host_fit's per-machine fit on the file's rows of other models at this runtime (a row without a
    runtime column counts as this one) and the model's own points; a model that cannot be profiled is
    skipped (named in ``skipped``)."""
    others = [(m, pt) for m, rt, pt in rows if m not in (ref, f"torch:{ref}") and rt in ("", runtime)]
    if not others:
        return {}
    prior = RUNTIME_PRIORS[runtime]
    profiles: dict[str, ModelProfile | None] = {}
    for m in sorted({m for m, _ in others}):
        try:
            profiles[m] = load_torch_profile(m.removeprefix("torch:"))[0] if ":" in m else model_profile(m)
        except (UserError, UnknownModelError):
            profiles[m] = None
            skipped.append(m)
    samples = [host_fit.sample(class_work(q), layer_arrays(q.name).kernel_count(runtime, pt.precision),
                               arch_gpu(pt.gpu).key, pt.precision, pt.batch, pt.step_ms / 1e3)
               for q, pt in [*((profiles[m], pt) for m, pt in others), *((p, pt) for pt in own)] if q is not None]
    return host_fit.fit_machines(samples, prior)


def predict_torch(ref: str, gpu: str, batch: int, precision: str, runtime: str, measurements: Path | None,
                  json_out: bool) -> None:
    if runtime not in RUNTIMES:
        raise UserError(f"--runtime '{runtime}' is not one of {', '.join(RUNTIMES)}")
    try:
        prec = check_precision(precision)
        target = arch_gpu(gpu)
    except (KeyError, PrecisionError) as exc:
        raise UserError(str(exc).strip("'\"")) from None
    p, _ = load_torch_profile(ref)
    rows = read_rows(measurements) if measurements else []
    points = [pt for m, _, pt in rows if m in (ref, f"torch:{ref}")]
    skipped: list[str] = []
    fits = _machine_fits(ref, p, points, rows, runtime, skipped)
    fits_source = f"other models' rows of {measurements}"
    if not fits:  # no file, or none of its machines has enough rows: the machines the calibration `plan` uses fits
        calib = latest_real_calibration()
        fits, fits_source = calib.machine_fits(runtime), f"calibration {calib.name}"
    prior, work = RUNTIME_PRIORS[runtime], class_work(p)
    steps = MachineFitStep(fits=fits)  # the step `plan` takes for a user's model with a machine fit

    def kernels(precision: str) -> float:
        return layer_arrays(p.name).kernel_count(runtime, precision)

    def model_s(gpu_key: str, precision: str, b: int) -> float:
        return steps.curve(p.name, gpu_key, precision, runtime).at(float(b))

    def host_share(gpu_key: str, precision: str, b: int) -> float:
        return host_fit.machine_host_share(work, kernels(precision), gpu_key, precision, b, fits, prior)

    fit = host_fit.fit_for(fits, target.key, prec)
    host = fit.host_s(kernels(prec)) if fit else prior.host_s(kernels(prec))
    fit_from = next((f"{g}/{pr}" for (g, pr), f in fits.items() if f is fit), None)
    if fit is not None and fit_from is None:  # no machine of its architecture: the measured machines' host
        fit_from = "host of " + ", ".join(f"{g}/{pr}" for g, pr in fits
                                          if pr == prec or prec not in {q for _, q in fits})
    pred = predict(p, target.key, batch, prec, points, host, model_s=model_s if fits else None,
                   fitted=frozenset(fits), host_share=host_share if fits else None)
    result = {**pred.to_dict(), "model": p.name, "gpu": target.key, "batch": batch, "precision": prec,
              "runtime": runtime, "measured_points": len(points), "host_overhead_ms": host * 1e3,
              "machine_fits": {f"{g}/{pr}": {"overhead_ms": f.overhead_s * 1e3, "kernel_us": f.per_kernel_s * 1e6,
                                             "compute_scale": f.compute_scale, "memory_scale": f.memory_scale,
                                             "depthwise_scale": f.depthwise_scale, "points": f.points}
                               for (g, pr), f in fits.items()},
              "target_fit": fit_from, "machine_fits_from": fits_source if fits else None, "skipped_models": skipped}
    if json_out:
        print(json.dumps(result, indent=2))
        return
    _print_prediction(result, pred, ref, fits, fits_source, fit_from, skipped)


def _print_prediction(result: dict[str, Any], pred: Prediction, ref: str, fits: Fits,
                      fits_source: str, fit_from: str | None, skipped: list[str]) -> None:
    """``predict_torch``'s text output: the step time and its interval, its basis, the machine fits it used."""
    name, key, prec = result["model"], result["gpu"], result["precision"]
    console.print(
        f"{name} on {key} at batch {result['batch']} {prec} ({result['runtime']}): [bold]{pred.step_ms:.1f} ms[/bold] "
        f"a step, interval {pred.low_ms:.1f} .. {pred.high_ms:.1f} ms (+-{pred.relative:.0%}, {pred.kind})"
    )
    points = result["measured_points"]
    console.print(f"basis: {pred.basis}" + ("" if points else f" ({points} measured points of {ref})"))
    if fits:
        console.print(f"host and GPU scales fitted per machine ({fits_source}): " + ", ".join(
            f"{g}/{pr} {f.overhead_s * 1e3:.2f} ms + {f.per_kernel_s * 1e6:.0f} us/kernel ({f.points} rows)"
            for (g, pr), f in fits.items()))
    if fit_from is not None and fit_from.startswith("host of "):
        console.print(f"{key} has no rows of its own and none of its architecture: it takes the {fit_from} "
                      "(geometric mean) and the committed GPU efficiencies")
    elif fit_from is not None and fit_from != f"{key}/{prec}":
        console.print(f"{key} has no rows of its own: it takes {fit_from}'s fit (the same architecture)")
    if skipped:
        console.print(f"skipped (could not be profiled): {', '.join(skipped)}")

def prepare_spec(spec_path: Path) -> None:
    """Profile (or take from the cache) the PyTorch model a spec names in ``training.model: {torch: ...}``,
    before the spec is loaded (its batch check and the planner need the profile). The factory runs in a child
    process without the controller's secrets (profiler/sandbox.py); how that ends is one error naming the field."""
    from orchestrator.profiler.cache import prepare_spec_model  # lazy: the profiler, only for a torch model
    from orchestrator.profiler.factory_ref import ProfileError  # lazy: the profiler, only for a torch model

    try:
        prepare_spec_model(spec_path)
    except ProfileError as exc:
        raise UserError(f"training.model.torch: {exc}") from None


def profile_document(document: Any, folder: Path) -> None:
    """The same for a spec document already read (planning.admission's profile step)."""
    from orchestrator.profiler.cache import prepare_document_model  # lazy: the profiler, only for a torch model
    from orchestrator.profiler.factory_ref import ProfileError  # lazy: the profiler, only for a torch model

    try:
        prepare_document_model(document, folder)
    except ProfileError as exc:
        raise UserError(f"training.model.torch: {exc}") from None
