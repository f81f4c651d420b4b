"""Fit the step-time model to measured step times (per GPU x runtime), within physical bounds.

Measurement files (CSV, header row; extra columns ignored). The project's format, as in
``data/measurements/*.csv``::

    gpu,framework,runtime,model,depth,batch,precision,step_ms,peak_gb,source,method
    h100,pytorch,pytorch-eager,resnet_cifar_32,32,128,fp32,13.411,0.507,shared/measurements,...

and the older short one: ``model,gpu,batch,step_time_s`` (runtime ``tf1-graph``). Optional
``ps_count,workers,steps_per_s[,ps_machine_type]`` describe an async cluster's measured global rate
and calibrate the network constants. ``emulated`` (1/0) marks the local provider's emulated GPUs.

Fit: residuals are relative, ``log(predicted / measured)``, over the parameters' logs
``(eff_compute, eff_memory, overhead_s, overhead_per_layer_s, half_batch)`` (and ``overlap`` where
a runtime's points hold a batch curve with a middle point), bounded so that the
efficiencies stay <= 1 (a fit can never claim more than the datasheet) and the overheads >= 0. Each
parameter is pulled towards its prior (the runtime's ``RUNTIME_PRIORS``, or for a GPU the fit shared
by every GPU of that runtime) with weight ``PRIOR_WEIGHT``: with fewer points than parameters the
data move what they constrain and the priors keep the rest, and :func:`fit_calibration` says so in
its ``warnings``. Levels: ``*/runtime`` over every GPU of a runtime, then ``gpu/runtime`` for each
GPU with points, then ``gpu/runtime/model`` where a model has ``MIN_MODEL_POINTS`` or more (two
suffice: the model's own points move its overhead and throughput, the shared fit is their prior; real
host overheads do not grow smoothly with depth, so a model's own points beat the depth trend).
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from orchestrator.core.catalog import Catalog, load_catalog
from orchestrator.core.costmodel.compute import (
    DEFAULT_RUNTIME,
    Calibration,
    Efficiency,
    FloatArray,
    NetParams,
    build_step_fn,
    layer_arrays,
    prior_for,
    runtime_key,
)

N_PARAMS = 5
PRIOR_WEIGHT = 0.15  # pull of each parameter towards its prior, per log unit
MIN_MODEL_POINTS = 2
OVERLAP_MAX = 32.0
_LO = np.log(np.array([1e-3, 1e-3, 1e-6, 1e-8, 0.5, 1.0]))
_HI = np.log(np.array([1.0, 1.0, 10.0, 1e-2, 1e5, OVERLAP_MAX]))


@dataclass(frozen=True)
class Measurement:
    model: str
    gpu: str
    batch: int
    step_time_s: float | None = None
    ps_count: int | None = None
    workers: int | None = None
    steps_per_s: float | None = None
    ps_machine_type: str | None = None
    runtime: str = DEFAULT_RUNTIME
    precision: str = "fp32"
    peak_gb: float | None = None
    source: str = ""
    method: str = ""
    emulated: bool = False

    @property
    def key(self) -> str:
        return runtime_key(self.runtime, self.precision)

    @property
    def is_compute(self) -> bool:
        return self.step_time_s is not None and self.step_time_s > 0 and not self.is_cluster

    @property
    def is_cluster(self) -> bool:
        return bool(self.ps_count and self.workers and self.steps_per_s and self.steps_per_s > 0)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Measurement:
        def opt(key: str) -> str | None:
            v = row.get(key)
            return None if v is None or str(v).strip() == "" else str(v).strip()

        def num(key: str) -> float | None:
            v = opt(key)
            return None if v is None else float(v)

        def integer(key: str) -> int | None:
            v = num(key)
            return None if v is None else int(v)

        model, gpu, batch = opt("model"), opt("gpu"), integer("batch")
        if model is None or gpu is None or batch is None:
            raise ValueError(f"a measurement needs model, gpu and batch: {dict(row)}")
        step_ms = num("step_ms")
        step_s = num("step_time_s") if step_ms is None else step_ms / 1e3
        m = cls(
            model,
            gpu.lower(),
            batch,
            step_s,
            integer("ps_count"),
            integer("workers"),
            num("steps_per_s"),
            opt("ps_machine_type"),
            opt("runtime") or DEFAULT_RUNTIME,
            opt("precision") or "fp32",
            num("peak_gb"),
            opt("source") or "",
            opt("method") or "",
            (opt("emulated") or "0").lower() in ("1", "true", "yes"),
        )
        if not (m.is_compute or m.is_cluster):
            raise ValueError(
                f"a measurement needs step_ms (or step_time_s), or ps_count + workers + steps_per_s: {dict(row)}"
            )
        return m


def load_measurements(path: str | Path) -> list[Measurement]:
    """Rows of one CSV file, or of every ``*.csv`` in a folder (``data/measurements``)."""
    p = Path(path)
    files = sorted(p.glob("*.csv")) if p.is_dir() else [p]
    out = []
    for f in files:
        with f.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        for i, row in enumerate(rows, start=2):
            try:
                out.append(Measurement.from_row(row))
            except ValueError as exc:
                raise ValueError(f"{f}:{i}: {exc}") from None
    return out


def measurements_from_dicts(rows: Iterable[Mapping[str, Any]]) -> list[Measurement]:
    return [Measurement.from_row(r) for r in rows]


# ---------------------------------------------------------------- fitting


def _to_x(e: Efficiency, half_batch: float) -> FloatArray:
    v = [e.eff_compute, e.eff_memory, max(e.overhead_s, 1e-6), max(e.overhead_per_layer_s, 1e-8), half_batch,
         e.overlap]
    return np.clip(np.log(np.array(v, dtype=np.float64)), _LO + 1e-9, _HI - 1e-9)


def _from_x(x: FloatArray) -> Efficiency:
    ec, em, ov, ol, hb, p = (float(v) for v in np.exp(x))
    return Efficiency(min(ec, 1.0), min(em, 1.0), ov, ol, hb, min(max(p, 1.0), OVERLAP_MAX))


def predict(m: Measurement, calibration: Calibration, catalog: Catalog | None = None) -> float:
    cat = catalog or load_catalog()
    g = cat.gpu(m.gpu)
    eff = calibration.for_gpu(g.key, m.key, m.model)
    return build_step_fn(layer_arrays(m.model), g, eff, m.precision).at(float(m.batch))


def _fit_one(
    rows: Sequence[Measurement], prior: Efficiency, catalog: Catalog, fit_overlap: bool = False
) -> Efficiency:
    """One parameter set for these rows (one runtime key; one GPU or all), pulled towards ``prior``.

    The overlap of host and GPU time is fitted only where asked (:func:`_has_curve`): elsewhere a batch
    curve's corners cannot tell it apart from the other terms."""
    gpus = {m.gpu: catalog.gpu(m.gpu) for m in rows}
    hb0 = float(np.exp(np.mean([np.log(prior.half_batch_for(g)) for g in gpus.values()])))
    x_prior = _to_x(prior, hb0)
    free = slice(0, N_PARAMS + 1 if fit_overlap else N_PARAMS)
    measured = np.array([float(m.step_time_s or 0.0) for m in rows])
    # Every (GPU, model) counts once in a shared fit: the depth trend is not the most-measured model's.
    per_model = Counter((m.gpu, m.model) for m in rows)
    weight = np.array([1.0 / math.sqrt(per_model[(m.gpu, m.model)]) for m in rows])
    # Across GPUs the half-occupancy batch stays per GPU (the prior's scaling with peak FLOP/s).
    shared_hb = prior.half_batch is None and len(gpus) > 1

    def eff_of(xf: FloatArray) -> Efficiency:
        x = x_prior.copy()
        x[free] = xf
        eff = _from_x(x)
        return replace(eff, half_batch=None) if shared_hb else eff

    def fun(xf: FloatArray) -> FloatArray:
        eff = eff_of(xf)
        res = [
            math.log(build_step_fn(layer_arrays(m.model), gpus[m.gpu], eff, m.precision).at(float(m.batch)) / t)
            for m, t in zip(rows, measured, strict=True)
        ]
        return np.concatenate([weight * np.array(res), PRIOR_WEIGHT * (xf - x_prior[free])])

    starts = [x_prior[free]]
    if fit_overlap:  # the overlap's cost surface has local minima: also start from "host and GPU add"
        starts += [np.concatenate([x_prior[:N_PARAMS], np.log([p])]) for p in (1.0 + 1e-6, 2.0)]
    sols = [least_squares(fun, x0, bounds=(_LO[free], _HI[free]), diff_step=1e-3) for x0 in starts]
    best = min(sols, key=lambda sol: float(sol.cost))
    return eff_of(np.asarray(best.x, dtype=np.float64))


def _has_curve(rows: Sequence[Measurement]) -> bool:
    """Enough points for every parameter, and one model's batch curve with a middle point (3+ batches):
    only then is the overlap of host and GPU time told apart from the overhead and the throughput."""
    batches: dict[tuple[str, str], set[int]] = {}
    for m in rows:
        batches.setdefault((m.gpu, m.model), set()).add(m.batch)
    return len(rows) >= N_PARAMS and any(len(b) >= 3 for b in batches.values())


@dataclass
class FitReport:
    calibration: Calibration
    warnings: list[str] = field(default_factory=list)


def fit_report(
    measurements: Sequence[Measurement],
    name: str = "fitted",
    source: str = "",
    catalog: Catalog | None = None,
    base: Calibration | None = None,
) -> FitReport:
    """Fit every runtime key, GPU and (with enough points) model present; warn where priors fill in."""
    cat = catalog or load_catalog()
    compute_rows = [m for m in measurements if m.is_compute]
    cluster_rows = [m for m in measurements if m.is_cluster]
    if not compute_rows and not cluster_rows:
        raise ValueError("no step-time measurements (rows with model, gpu, batch, step_ms) to fit")
    kinds = {m.emulated for m in measurements}
    if len(kinds) > 1:
        raise ValueError("emulated (local provider) and real GPU measurements cannot be fitted together")
    warnings: list[str] = []
    per: dict[str, Efficiency] = dict(base.per_gpu) if base else {}
    points: dict[str, int] = dict(base.points) if base else {}
    by_key: dict[str, list[Measurement]] = {}
    for m in compute_rows:
        cat.gpu(m.gpu)  # unknown GPU -> CatalogError naming the known ones
        by_key.setdefault(m.key, []).append(m)
    for key, rows in sorted(by_key.items()):
        shared = _fit_one(rows, per.get(f"*/{key}", prior_for(key)), cat, fit_overlap=_has_curve(rows))
        per[f"*/{key}"], points[f"*/{key}"] = shared, points.get(f"*/{key}", 0) + len(rows)
        if len(rows) < N_PARAMS:
            warnings.append(
                f"{key}: {len(rows)} measured point(s) for {N_PARAMS} parameters: the step-time model keeps "
                f"its priors where the data say nothing (RUNTIME_PRIORS['{key.split('+')[0]}'])"
            )
        by_gpu: dict[str, list[Measurement]] = {}
        for m in rows:
            by_gpu.setdefault(cat.gpu(m.gpu).key, []).append(m)
        for gpu, grows in sorted(by_gpu.items()):
            prior = per.get(f"{gpu}/{key}", shared)  # refining a stored calibration starts from its fit
            own = _fit_one(grows, prior, cat) if (len(by_gpu) > 1 or base) else shared
            per[f"{gpu}/{key}"], points[f"{gpu}/{key}"] = own, points.get(f"{gpu}/{key}", 0) + len(grows)
            by_model: dict[str, list[Measurement]] = {}
            for m in grows:
                by_model.setdefault(m.model, []).append(m)
            for model, mrows in by_model.items():
                if len(mrows) >= MIN_MODEL_POINTS and (len(by_model) > 1 or base):
                    mkey = f"{gpu}/{key}/{model}"
                    per[mkey] = _fit_one(mrows, per.get(mkey, own), cat)
                    points[mkey] = points.get(mkey, 0) + len(mrows)
    default = per.get(f"*/{DEFAULT_RUNTIME}", base.default if base else prior_for(DEFAULT_RUNTIME))
    keys = ", ".join(f"{k} ({len(r)})" for k, r in sorted(by_key.items()))
    calib = Calibration(
        default,
        per,
        base.net if base else NetParams(),
        name,
        source or f"least squares on {len(compute_rows)} step times: {keys}",
        points=points,
        emulated=kinds == {True},
    )
    if cluster_rows:
        calib = replace(calib, net=_fit_net(cluster_rows, calib, cat),
                        source=calib.source + f"; network from {len(cluster_rows)} cluster rows")
        if len(cluster_rows) < 2:
            warnings.append("network: one cluster row for 2 parameters: the other keeps its default")
    return FitReport(calib, warnings)


def fit_calibration(
    measurements: Sequence[Measurement],
    name: str = "fitted",
    source: str = "",
    catalog: Catalog | None = None,
) -> Calibration:
    """Least-squares fit (see the module docstring); :func:`fit_report` also returns the warnings."""
    return fit_report(measurements, name, source, catalog).calibration


def _fit_net(rows: Sequence[Measurement], calib: Calibration, catalog: Catalog) -> NetParams:
    from orchestrator.core.costmodel.cluster import cluster_rate  # local: cluster imports this module's users

    base = calib.net

    def net_of(x: FloatArray) -> NetParams:
        return replace(base, net_efficiency=float(np.exp(x[0])), ps_cpu_per_variable_s=float(np.exp(x[1])))

    def fun(x: FloatArray) -> FloatArray:
        trial = replace(calib, net=net_of(x))
        res = []
        for r in rows:
            assert r.workers is not None and r.ps_count is not None and r.steps_per_s is not None
            pred = cluster_rate(
                r.model, [r.gpu] * r.workers, [r.batch] * r.workers, r.ps_count,
                r.ps_machine_type or "n1-standard-4", "async", trial, catalog,
            )
            res.append(math.log(pred / r.steps_per_s))
        prior = PRIOR_WEIGHT * (x - np.log([base.net_efficiency, base.ps_cpu_per_variable_s]))
        return np.concatenate([np.array(res), prior])

    x0 = np.log([base.net_efficiency, base.ps_cpu_per_variable_s])
    sol = least_squares(fun, x0, bounds=(np.log([1e-3, 1e-7]), np.log([1.0, 1e-2])), diff_step=1e-4)
    return net_of(np.asarray(sol.x, dtype=np.float64))


def mape(rows: Sequence[Measurement], calibration: Calibration, catalog: Catalog | None = None) -> float:
    errs = [
        abs(predict(m, calibration, catalog) - m.step_time_s) / m.step_time_s
        for m in rows
        if m.step_time_s is not None and m.step_time_s > 0 and m.is_compute
    ]
    return float(np.mean(errs)) if errs else float("nan")


@dataclass(frozen=True)
class GpuValidation:
    gpu: str
    rows: int
    mape: float
    max_ape: float


@dataclass(frozen=True)
class Validation:
    per_gpu: tuple[GpuValidation, ...]
    mape: float  # mean absolute percentage error over every held-out row
    in_sample_mape: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "mape": self.mape,
            "in_sample_mape": self.in_sample_mape,
            "per_gpu": [
                {"gpu": v.gpu, "rows": v.rows, "mape": v.mape, "max_ape": v.max_ape} for v in self.per_gpu
            ],
        }


def leave_one_gpu_out(measurements: Sequence[Measurement], catalog: Catalog | None = None) -> Validation:
    """Fit without each GPU type in turn and predict that GPU from its specs; needs two or more GPU types."""
    cat = catalog or load_catalog()
    rows = [m for m in measurements if m.is_compute]
    gpus = sorted({cat.gpu(m.gpu).key for m in rows})
    if len(gpus) < 2:
        raise ValueError(
            f"leave-one-GPU-out needs measurements of two or more GPU types; have: {gpus or 'none'}"
        )
    per: list[GpuValidation] = []
    all_errs: list[float] = []
    for gpu in gpus:
        train = [m for m in rows if cat.gpu(m.gpu).key != gpu]
        test = [m for m in rows if cat.gpu(m.gpu).key == gpu]
        calib = fit_calibration(train, catalog=cat)
        errs = [abs(predict(m, calib, cat) - float(m.step_time_s or 0)) / float(m.step_time_s or 1) for m in test]
        all_errs += errs
        per.append(GpuValidation(gpu, len(test), float(np.mean(errs)), float(np.max(errs))))
    in_sample = mape(rows, fit_calibration(rows, catalog=cat), cat)
    return Validation(tuple(per), float(np.mean(all_errs)), in_sample)
