"""Fit the compute (and optionally network) efficiencies to measured step times; validate the fit.

Measurements CSV (header row, one measurement a row; extra columns are ignored)::

    model,gpu,batch,step_time_s,ps_count,workers,steps_per_s,ps_machine_type
    resnet_cifar_32,k80,128,0.212,,,,
    resnet_cifar_32,k80,128,,1,4,15.3,n1-standard-4

* ``model``: a profile name (``resnet_tiny``, ``resnet_cifar_15/32/56``, ``vgg16``, ``transformer_base``)
* ``gpu``: a catalog GPU key (``k80``, ``p100``, ...)
* ``batch``: the per-worker batch
* ``step_time_s``: one worker's compute step time in seconds (no parameter-server wait: a single-worker
  run with a local PS, or the job's own per-step compute timer). Rows with it fit the compute model.
* optional ``ps_count``, ``workers``, ``steps_per_s`` (and ``ps_machine_type``, default n1-standard-4):
  the global steps/s of an async cluster of ``workers`` identical workers. Rows with these fit the
  network constants (``NetParams.net_efficiency`` and ``ps_cpu_per_variable_s``).

Fit: residuals are relative, ``log(predicted / measured)``, parameters are fitted in log space with
``scipy.optimize.least_squares`` (a few starting points; the roofline's max() makes the loss piecewise
smooth). First one shared ``(eff_compute, eff_memory, overhead_s)`` over every row: the default for GPUs
without data, so one measured GPU predicts the others from their datasheet specs. Then, for each GPU
with at least ``MIN_ROWS_PER_GPU`` rows, its own triple, weakly pulled towards the shared one so that
parameters the data do not constrain (say, memory efficiency when every layer is compute-bound) stay
sensible. Validation: leave one GPU type out, fit on the rest, predict it; report the MAPE.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from orchestrator.catalog import Catalog, load_catalog
from orchestrator.costmodel.compute import (
    TRAINING_FACTOR,
    WEIGHT_TRAFFIC_FACTOR,
    Calibration,
    Efficiency,
    FloatArray,
    NetParams,
    build_step_fn,
    layer_arrays,
)

MIN_ROWS_PER_GPU = 3
PRIOR_WEIGHT = 0.05  # pull of a per-GPU parameter towards the shared one, per log unit
_STARTS = ((0.35, 0.6, 0.005), (0.15, 0.3, 0.02), (0.7, 0.9, 0.001))


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

    @property
    def is_compute(self) -> bool:
        return self.step_time_s is not None and self.step_time_s > 0

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
        m = cls(
            model,
            gpu.lower(),
            batch,
            num("step_time_s"),
            integer("ps_count"),
            integer("workers"),
            num("steps_per_s"),
            opt("ps_machine_type"),
        )
        if not (m.is_compute or m.is_cluster):
            raise ValueError(
                f"a measurement needs step_time_s, or ps_count + workers + steps_per_s: {dict(row)}"
            )
        return m


def load_measurements(path: str | Path) -> list[Measurement]:
    p = Path(path)
    with p.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for i, row in enumerate(rows, start=2):
        try:
            out.append(Measurement.from_row(row))
        except ValueError as exc:
            raise ValueError(f"{p}:{i}: {exc}") from None
    return out


def measurements_from_dicts(rows: Iterable[Mapping[str, Any]]) -> list[Measurement]:
    return [Measurement.from_row(r) for r in rows]


# ---------------------------------------------------------------- fitting


def _to_x(e: Efficiency) -> FloatArray:
    return np.log(np.array([e.eff_compute, e.eff_memory, max(e.overhead_s, 1e-6)], dtype=np.float64))


def _from_x(x: FloatArray) -> Efficiency:
    ec, em, ov = np.exp(x)
    return Efficiency(float(ec), float(em), float(ov))


_LO = np.log(np.array([1e-3, 1e-3, 1e-6]))
_HI = np.log(np.array([1.5, 1.5, 10.0]))


@dataclass(frozen=True)
class _Group:
    """Rows of one (model, GPU): per-layer work scaled by the GPU's peaks, and the measured batches."""

    compute: FloatArray  # layers x rows: seconds at eff_compute = 1
    memory: FloatArray  # layers x rows: seconds at eff_memory = 1
    measured: FloatArray  # rows


def _groups(rows: Sequence[Measurement], catalog: Catalog) -> list[_Group]:
    by_key: dict[tuple[str, str], list[Measurement]] = {}
    for r in rows:
        by_key.setdefault((r.model, catalog.gpu(r.gpu).key), []).append(r)
    out = []
    for (model, gpu), members in by_key.items():
        a = layer_arrays(model)
        g = catalog.gpu(gpu)
        b = np.array([float(m.batch) for m in members])
        compute = TRAINING_FACTOR * np.outer(a.flops, b) / (g.fp32_tflops * 1e12)
        memory = (
            TRAINING_FACTOR * np.outer(a.act_bytes, b) + WEIGHT_TRAFFIC_FACTOR * a.weight_bytes[:, None]
        ) / (g.memory_bw_gbs * 1e9)
        measured = np.array([float(m.step_time_s or 0.0) for m in members])
        out.append(_Group(compute, memory, measured))
    return out


def _model_and_jac(groups: Sequence[_Group], x: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Residuals log(pred / measured) and their Jacobian w.r.t. x = log(eff_compute, eff_memory, overhead)."""
    ec, em, ov = np.exp(x)
    res, jac = [], []
    for grp in groups:
        c = grp.compute / ec
        m = grp.memory / em
        bound = c >= m
        t = ov + np.where(bound, c, m).sum(axis=0)
        res.append(np.log(t / grp.measured))
        d_ec = -np.where(bound, c, 0.0).sum(axis=0) / t
        d_em = -np.where(bound, 0.0, m).sum(axis=0) / t
        d_ov = np.full_like(t, ov) / t
        jac.append(np.stack([d_ec, d_em, d_ov], axis=1))
    return np.concatenate(res), np.concatenate(jac, axis=0)


def _fit_triple(rows: Sequence[Measurement], catalog: Catalog, prior: Efficiency | None) -> Efficiency:
    groups = _groups(rows, catalog)
    prior_x = _to_x(prior) if prior is not None else None

    def fun(x: FloatArray) -> FloatArray:
        res, _ = _model_and_jac(groups, x)
        if prior_x is not None:
            res = np.concatenate([res, PRIOR_WEIGHT * (x - prior_x)])
        return res

    def jac(x: FloatArray) -> FloatArray:
        _, j = _model_and_jac(groups, x)
        if prior_x is not None:
            j = np.concatenate([j, PRIOR_WEIGHT * np.eye(3)], axis=0)
        return j

    starts = [np.clip(_to_x(Efficiency(*s)), _LO + 1e-9, _HI - 1e-9) for s in _STARTS]
    if prior_x is not None:
        starts.insert(0, np.clip(prior_x, _LO + 1e-9, _HI - 1e-9))
    best: tuple[float, FloatArray] | None = None
    for x0 in starts:
        sol = least_squares(fun, x0, jac=jac, bounds=(_LO, _HI), x_scale=1.0)
        cost = float(sol.cost)
        if best is None or cost < best[0]:
            best = (cost, np.asarray(sol.x, dtype=np.float64))
    assert best is not None
    return _from_x(best[1])


def _fit_net(rows: Sequence[Measurement], calib: Calibration, catalog: Catalog) -> NetParams:
    from orchestrator.costmodel.cluster import cluster_rate  # local: cluster imports this module's users

    base = calib.net

    def net_of(x: FloatArray) -> NetParams:
        return replace(base, net_efficiency=float(np.exp(x[0])), ps_cpu_per_variable_s=float(np.exp(x[1])))

    def fun(x: FloatArray) -> FloatArray:
        trial = Calibration(calib.default, calib.per_gpu, net_of(x))
        res = []
        for r in rows:
            assert r.workers is not None and r.ps_count is not None and r.steps_per_s is not None
            pred = cluster_rate(
                r.model,
                [r.gpu] * r.workers,
                [r.batch] * r.workers,
                r.ps_count,
                r.ps_machine_type or "n1-standard-4",
                "async",
                trial,
                catalog,
            )
            res.append(math.log(pred / r.steps_per_s))
        prior = PRIOR_WEIGHT * (x - np.log([base.net_efficiency, base.ps_cpu_per_variable_s]))
        return np.concatenate([np.array(res), prior])

    x0 = np.log([base.net_efficiency, base.ps_cpu_per_variable_s])
    sol = least_squares(fun, x0, bounds=(np.log([1e-3, 1e-7]), np.log([1.0, 1e-2])), diff_step=1e-4)
    return net_of(np.asarray(sol.x, dtype=np.float64))


def fit_calibration(
    measurements: Sequence[Measurement],
    name: str = "fitted",
    source: str = "",
    catalog: Catalog | None = None,
) -> Calibration:
    """Least-squares fit of the efficiencies (shared default + per measured GPU) and network constants."""
    cat = catalog or load_catalog()
    compute_rows = [m for m in measurements if m.is_compute]
    cluster_rows = [m for m in measurements if m.is_cluster]
    if not compute_rows:
        raise ValueError("no step-time measurements (rows with model, gpu, batch, step_time_s) to fit")
    for m in compute_rows:
        cat.gpu(m.gpu)  # unknown GPU -> CatalogError naming the known ones
    shared = _fit_triple(compute_rows, cat, prior=None)
    per_gpu: dict[str, Efficiency] = {}
    by_gpu: dict[str, list[Measurement]] = {}
    for m in compute_rows:
        by_gpu.setdefault(cat.gpu(m.gpu).key, []).append(m)
    for gpu, rows in sorted(by_gpu.items()):
        if len(rows) >= MIN_ROWS_PER_GPU:
            per_gpu[gpu] = _fit_triple(rows, cat, prior=shared)
    gpus = ", ".join(f"{g} ({len(r)})" for g, r in sorted(by_gpu.items()))
    calib = Calibration(
        shared,
        per_gpu,
        NetParams(),
        name,
        source or f"least squares on {len(compute_rows)} step times: {gpus}",
    )
    if cluster_rows:
        calib = Calibration(
            shared,
            per_gpu,
            _fit_net(cluster_rows, calib, cat),
            calib.name,
            calib.source + f"; network from {len(cluster_rows)} cluster rows",
        )
    return calib


def predict(m: Measurement, calibration: Calibration, catalog: Catalog | None = None) -> float:
    cat = catalog or load_catalog()
    g = cat.gpu(m.gpu)
    return build_step_fn(layer_arrays(m.model), g, calibration.for_gpu(g.key)).at(float(m.batch))


def mape(rows: Sequence[Measurement], calibration: Calibration, catalog: Catalog | None = None) -> float:
    errs = [
        abs(predict(m, calibration, catalog) - m.step_time_s) / m.step_time_s
        for m in rows
        if m.step_time_s is not None and m.step_time_s > 0
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
        errs = [
            abs(predict(m, calib, cat) - float(m.step_time_s or 0)) / float(m.step_time_s or 1) for m in test
        ]
        all_errs += errs
        per.append(GpuValidation(gpu, len(test), float(np.mean(errs)), float(np.max(errs))))
    in_sample = mape(rows, fit_calibration(rows, catalog=cat), cat)
    return Validation(tuple(per), float(np.mean(all_errs)), in_sample)
