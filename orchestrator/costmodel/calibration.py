"""Fit the step-time model to measured step times (per GPU x runtime), within physical bounds.

Measurement files (CSV, header row; extra columns ignored). The project's format, as in
``data/measurements/*.csv``::

    gpu,framework,runtime,model,depth,batch,precision,step_ms,peak_gb,source,method
    h100,pytorch,pytorch-eager,resnet_cifar_32,32,128,fp32,13.411,0.507,shared/measurements,...

and the older short one: ``model,gpu,batch,step_time_s`` (runtime ``tf1-graph``). Optional
``ps_count,workers,steps_per_s[,ps_machine_type]`` describe an async cluster's measured global rate
and calibrate the network constants. ``peak_steady_gb`` (optional) is the peak of the timed steps alone,
without the first steps' cuDNN autotuning workspace that ``peak_gb`` includes. ``emulated`` (1/0) marks
the local provider's emulated GPUs.

A row with ``ps_count`` and ``workers`` but no ``steps_per_s`` is one worker's step measured inside a
PS cluster (the ICAC'19 runs: 1 worker + 1 PS): its prediction adds the worker's push and pull
(``comm.worker_ps_comm_time``), so the compute fit does not absorb the network.

Fit: residuals are relative, ``log(predicted / measured)``, over the parameters' logs
``(eff_compute, eff_memory, overhead_s, overhead_per_kernel_s, half_batch)`` (and ``overlap`` where
a runtime's points hold a batch curve with a middle point), bounded so that the efficiencies stay
<= 1 (a fit can never claim more than the datasheet), the overheads >= 0 and the rest in physical
ranges (``_LO`` / ``_HI``). Each parameter is pulled towards its prior (the runtime's
``RUNTIME_PRIORS``, or the fit one level up) with weight ``PRIOR_WEIGHT``: with fewer points than
parameters the data move what they constrain and the priors keep the rest, and :func:`fit_report`
says so in its ``warnings``.

Which parameters are whose: ``eff_compute`` and ``half_batch`` belong to the GPU (the same cuDNN
convolutions and the same silicon under every runtime) and are fitted jointly over all of a GPU's
runtimes; ``eff_memory`` (which kernels move the bytes: eager, fused, 16-bit), the host overheads and
the overlap belong to the runtime key. Levels: ``*/runtime`` for a runtime measured on two or more
GPUs (one parameter set as fractions of each GPU's datasheet: the spec ratios tie the GPUs, and the
half-occupancy batch keeps the prior's scaling with peak FLOP/s; this predicts a GPU never measured),
then ``gpu/runtime`` jointly per GPU, then ``gpu/runtime/model`` where a model has
``MIN_MODEL_POINTS`` or more on a GPU with other models too (the model's own points move its
parameters, the GPU's fit is their prior).
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

from orchestrator.costmodel.compute import (
    DEFAULT_RUNTIME,
    PRIOR_WEIGHT,
    Calibration,
    Efficiency,
    FloatArray,
    NetParams,
    build_step_fn,
    layer_arrays,
    prior_for,
    runtime_key,
    step_basis,
)
from orchestrator.costmodel.host_fit import fit_runtimes
from orchestrator.costmodel.machine_fit import MachineFit
from orchestrator.costmodel.profiles import UnknownModelError, get_profile
from orchestrator.model.catalog import Catalog, load_catalog

N_PARAMS = 5  # eff_compute, eff_memory, half_batch (the GPU's); overhead_s, overhead_per_kernel_s (the runtime's)
MIN_MODEL_POINTS = 2
OVERLAP_MAX = 32.0
# Physical bounds of (eff_compute, eff_memory, overhead_s, overhead_per_kernel_s, half_batch, overlap).
_LO = np.log(np.array([1e-3, 1e-3, 1e-6, 1e-8, 0.5, 1.0]))
_HI = np.log(np.array([1.0, 1.0, 10.0, 1e-2, 1e5, OVERLAP_MAX]))
GPU_PARAMS = (0, 4)  # shared by every runtime on one GPU: the convolutions' efficiency, the occupancy
RUNTIME_PARAMS = (1, 2, 3)  # per runtime key: its memory-bound kernels, its host overheads
OVERLAP = 5  # per runtime key too, where a batch curve shows it (_has_curve)
DEFAULT_PS_MACHINE = "n1-standard-4"


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
    peak_gb: float | None = None  # the point's whole peak, first steps (cuDNN autotuning) included
    source: str = ""
    method: str = ""
    emulated: bool = False
    peak_steady_gb: float | None = None  # the peak of the timed steps alone: what every training step needs

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
            num("peak_steady_gb"),
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


def unprofiled_models(models: Iterable[str]) -> list[str]:
    """The models without a cost-model profile here (a user's ``torch:MODULE:FACTORY`` never profiled on this
    machine): their step times cannot be fitted, and one of them must not stop the others' fit."""
    out = []
    for model in sorted(set(models)):
        try:
            get_profile(model)
        except UnknownModelError:
            out.append(model)
    return out


# ---------------------------------------------------------------- fitting


def _to_x(e: Efficiency, half_batch: float) -> FloatArray:
    v = [e.eff_compute, e.eff_memory, max(e.overhead_s, 1e-6), max(e.overhead_per_kernel_s, 1e-8), half_batch,
         e.overlap]
    return np.clip(np.log(np.array(v, dtype=np.float64)), _LO + 1e-9, _HI - 1e-9)


def _from_x(x: FloatArray, half_batch: bool = True) -> Efficiency:
    ec, em, ov, ok, hb, p = (float(v) for v in np.exp(x))
    return Efficiency(min(ec, 1.0), min(em, 1.0), ov, ok, hb if half_batch else None, min(max(p, 1.0), OVERLAP_MAX))


def comm_s(m: Measurement, calibration: Calibration, catalog: Catalog) -> float:
    """The parameter-server round trip inside a step measured in a PS cluster (``ps_count`` and
    ``workers`` given with ``step_ms``: the ICAC'19 runs' worker steps include their push and pull)."""
    if not (m.ps_count and m.workers) or m.is_cluster:
        return 0.0
    from orchestrator.costmodel.comm import worker_ps_comm_time  # local: comm imports compute only

    return worker_ps_comm_time(
        m.model, catalog.gpu(m.gpu).default_machine_type, m.ps_count, m.ps_machine_type or DEFAULT_PS_MACHINE,
        calibration.net, catalog=catalog,
    )


def _step(m: Measurement, eff: Efficiency, catalog: Catalog) -> float:
    g = catalog.gpu(m.gpu)
    return build_step_fn(layer_arrays(m.model), g, eff, m.precision, m.runtime).at(float(m.batch))


def predict(m: Measurement, calibration: Calibration, catalog: Catalog | None = None) -> float:
    """The measured quantity: a worker's step time (with its PS round trip where it was measured in one)."""
    cat = catalog or load_catalog()
    eff = calibration.for_gpu(cat.gpu(m.gpu).key, m.key, m.model)
    return _step(m, eff, cat) + comm_s(m, calibration, cat)


def _fit_joint(
    rows: Sequence[Measurement],
    priors: Mapping[str, Efficiency],
    catalog: Catalog,
    net: NetParams,
    overlap_keys: frozenset[str] = frozenset(),
) -> dict[str, Efficiency]:
    """One parameter set per runtime key in ``rows``, the GPU's parameters (``GPU_PARAMS``) shared by
    every key, each parameter pulled towards its prior.

    Rows of several GPUs share the efficiencies as fractions of each GPU's datasheet (the spec ratios
    tie the GPUs together); the half-occupancy batch then stays per GPU, the prior's scaling with peak
    FLOP/s. The overlap of host and GPU time is fitted only for ``overlap_keys`` (:func:`_has_curve`):
    elsewhere a batch curve's corners cannot tell it apart from the other terms."""
    keys = sorted({m.key for m in rows})
    gpus = {m.gpu: catalog.gpu(m.gpu) for m in rows}
    per_gpu_hb = len(gpus) > 1 and all(priors[k].half_batch is None for k in keys)
    hb0 = {k: float(np.exp(np.mean([np.log(priors[k].half_batch_for(g)) for g in gpus.values()]))) for k in keys}
    x_priors = {k: _to_x(priors[k], hb0[k]) for k in keys}
    shared = [i for i in GPU_PARAMS if not (per_gpu_hb and i == 4)]
    theta0 = np.mean([x_priors[k][shared] for k in keys], axis=0)
    own = {k: [*RUNTIME_PARAMS, *([OVERLAP] if k in overlap_keys else [])] for k in keys}
    x0 = np.concatenate([theta0, *[x_priors[k][own[k]] for k in keys]])
    lo = np.concatenate([_LO[shared], *[_LO[own[k]] for k in keys]])
    hi = np.concatenate([_HI[shared], *[_HI[own[k]] for k in keys]])
    measured = np.array([float(m.step_time_s or 0.0) for m in rows])
    comm = np.array([comm_s(m, Calibration(net=net), catalog) for m in rows])
    # Every (GPU, runtime, model) counts once: the depth trend is not the most-measured model's.
    per_model = Counter((m.gpu, m.key, m.model) for m in rows)
    weight = np.array([1.0 / math.sqrt(per_model[(m.gpu, m.key, m.model)]) for m in rows])

    def effs(xv: FloatArray) -> dict[str, Efficiency]:
        out, pos = {}, len(shared)
        for k in keys:
            x = x_priors[k].copy()
            x[shared] = xv[: len(shared)]
            x[own[k]] = xv[pos : pos + len(own[k])]
            pos += len(own[k])
            out[k] = _from_x(x, half_batch=not per_gpu_hb)
        return out

    bases = [step_basis(layer_arrays(m.model), catalog.gpu(m.gpu), m.precision, m.runtime) for m in rows]
    batches = [float(m.batch) for m in rows]

    def fun(xv: FloatArray) -> FloatArray:
        e = effs(xv)
        pred = np.array([b.with_eff(e[m.key]).at(n) for m, b, n in zip(rows, bases, batches, strict=True)]) + comm
        return np.concatenate([weight * np.log(pred / measured), PRIOR_WEIGHT * (xv - x0)])

    starts = _starts(np.clip(x0, lo + 1e-9, hi - 1e-9), len(shared), [(k in overlap_keys, len(own[k])) for k in keys])
    from scipy.optimize import least_squares  # lazy: SciPy (~0.7 s) only to fit, never for the CLI to start

    sols = [least_squares(fun, s0, bounds=(lo, hi), diff_step=1e-3) for s0 in starts]
    best = min(sols, key=lambda sol: float(sol.cost))
    return effs(np.asarray(best.x, dtype=np.float64))


def _starts(x0: FloatArray, n_shared: int, blocks: Sequence[tuple[bool, int]]) -> list[FloatArray]:
    """Where ``_fit_joint``'s least squares starts: ``x0`` and, where a key fits the overlap, also from "host and GPU
    add" (the overlap's cost surface has local minima). ``blocks``: each runtime key's parameters after the
    ``n_shared`` GPU ones, as (fits the overlap, how many; the overlap last)."""
    starts = [x0]
    if any(fits for fits, _ in blocks):
        for p in (1.0 + 1e-6, 2.0):
            s0 = x0.copy()
            pos = n_shared
            for fits, n in blocks:
                if fits:
                    s0[pos + n - 1] = np.log(p)
                pos += n
            starts.append(s0)
    return starts


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
    """Fit every runtime key, GPU and (with enough points) model present; warn where priors fill in.

    Levels: ``*/runtime`` for a runtime measured on two or more GPUs (one set of efficiencies as
    fractions of each datasheet: what predicts a GPU never measured); ``gpu/runtime`` jointly over a
    GPU's runtimes (the GPU's parameters shared, each runtime's own overheads); ``gpu/runtime/model``
    where a model has ``MIN_MODEL_POINTS`` or more on a GPU that has other models too."""
    cat = catalog or load_catalog()
    compute_rows = [m for m in measurements if m.is_compute]
    cluster_rows = [m for m in measurements if m.is_cluster]
    if not compute_rows and not cluster_rows:
        raise ValueError("no step-time measurements (rows with model, gpu, batch, step_ms) to fit")
    kinds = {m.emulated for m in measurements}
    if len(kinds) > 1:
        raise ValueError("emulated (local provider) and real GPU measurements cannot be fitted together")
    net = base.net if base else NetParams()
    warnings: list[str] = []
    calib = _fit_compute(compute_rows, name, source, cat, base, net, kinds == {True}, warnings)
    if cluster_rows:
        # The ICAC'19 worker steps include their PS round trip, which the network constants set: fit the
        # network on the cluster rows, then the step times again with it (twice: it settles at once).
        prior = net
        for _ in range(2):
            net = _fit_net(cluster_rows, calib, cat, prior)
            calib = _fit_compute(compute_rows, name, source, cat, base, net, kinds == {True}, [])
        calib = replace(calib, source=calib.source + f"; network from {len(cluster_rows)} cluster rows")
        if len(cluster_rows) < 2:
            warnings.append("network: one cluster row for 2 parameters: the other keeps its default")
    if kinds == {False}:
        calib = replace(calib, machines=_fit_machines(compute_rows, base))
    return FitReport(calib, warnings)


def _fit_machines(rows: Sequence[Measurement], base: Calibration | None
                  ) -> dict[str, dict[tuple[str, str], MachineFit]]:
    """host_fit's per-machine fits of the eager PyTorch rows (what a user's model is planned with), over the
    base's: a machine these rows fit replaces the base's, the base's other machines stay."""
    new = fit_runtimes([(m.model, m.gpu, m.runtime, m.precision, m.batch, float(m.step_time_s or 0.0))
                        for m in rows])
    old = base.machines if base else {}
    return {rt: {**old.get(rt, {}), **new.get(rt, {})} for rt in sorted(set(old) | set(new))}


def _fit_compute(
    compute_rows: Sequence[Measurement],
    name: str,
    source: str,
    cat: Catalog,
    base: Calibration | None,
    net: NetParams,
    emulated: bool,
    warnings: list[str],
) -> Calibration:
    per: dict[str, Efficiency] = dict(base.per_gpu) if base else {}
    points: dict[str, int] = dict(base.points) if base else {}
    by_key: dict[str, list[Measurement]] = {}
    for m in compute_rows:
        cat.gpu(m.gpu)  # unknown GPU -> CatalogError naming the known ones
        layer_arrays(m.model)  # unknown model -> UnknownModelError naming the known ones
        by_key.setdefault(m.key, []).append(m)
    for key, rows in sorted(by_key.items()):
        if len(rows) < N_PARAMS:
            warnings.append(
                f"{key}: {len(rows)} measured point(s) for {N_PARAMS} parameters: the step-time model keeps "
                f"its priors where the data say nothing (RUNTIME_PRIORS['{key.split('+')[0]}'])"
            )
        if len({cat.gpu(m.gpu).key for m in rows}) > 1 or f"*/{key}" in per:  # spec ratios tie the GPUs
            prior = per.get(f"*/{key}", prior_for(key))
            per[f"*/{key}"] = _fit_joint(rows, {key: prior}, cat, net, _overlap_keys(rows))[key]
            points[f"*/{key}"] = points.get(f"*/{key}", 0) + len(rows)
    by_gpu: dict[str, list[Measurement]] = {}
    for m in compute_rows:
        by_gpu.setdefault(cat.gpu(m.gpu).key, []).append(m)
    for gpu, grows in sorted(by_gpu.items()):
        keys = sorted({m.key for m in grows})
        priors = {k: per.get(f"{gpu}/{k}", per.get(f"*/{k}", prior_for(k))) for k in keys}
        overlap = frozenset(k for k in keys if _has_curve([m for m in grows if m.key == k]))
        fitted = _fit_joint(grows, priors, cat, net, overlap)
        for k in keys:
            n = sum(m.key == k for m in grows)
            per[f"{gpu}/{k}"], points[f"{gpu}/{k}"] = fitted[k], points.get(f"{gpu}/{k}", 0) + n
            if f"*/{k}" not in per:  # measured on this GPU only: its fit is the runtime's best guess
                per[f"*/{k}"], points[f"*/{k}"] = fitted[k], n
            _fit_models([m for m in grows if m.key == k], f"{gpu}/{k}", fitted[k], per, points, cat, net,
                        base is not None)
    default = per.get(f"*/{DEFAULT_RUNTIME}", base.default if base else prior_for(DEFAULT_RUNTIME))
    keys_text = ", ".join(f"{k} ({len(r)})" for k, r in sorted(by_key.items()))
    return Calibration(
        default,
        per,
        net,
        name,
        source or f"least squares on {len(compute_rows)} step times: {keys_text}",
        points=points,
        emulated=emulated,
    )


def _fit_models(rows: Sequence[Measurement], at: str, fitted: Efficiency, per: dict[str, Efficiency],
                points: dict[str, int], cat: Catalog, net: NetParams, based: bool) -> None:
    """Into ``per`` / ``points``: a fit of its own (key ``at``/MODEL, ``at`` = GPU/runtime key, pulled towards
    ``fitted``, the fit of ``at``) for each model of ``rows`` (one GPU and runtime key) with ``MIN_MODEL_POINTS``
    rows or more, where ``rows`` hold several models or there is a base calibration (``based``) to refine."""
    by_model: dict[str, list[Measurement]] = {}
    for m in rows:
        by_model.setdefault(m.model, []).append(m)
    for model, mrows in by_model.items():
        if len(mrows) >= MIN_MODEL_POINTS and (len(by_model) > 1 or based):
            mkey = f"{at}/{model}"
            mprior = per.get(mkey, fitted)
            key = mrows[0].key
            per[mkey] = _fit_joint(mrows, {key: mprior}, cat, net, _overlap_keys(mrows))[key]
            points[mkey] = points.get(mkey, 0) + len(mrows)


def _overlap_keys(rows: Sequence[Measurement]) -> frozenset[str]:
    return frozenset(m.key for m in rows) if _has_curve(rows) else frozenset()


def fit_calibration(
    measurements: Sequence[Measurement],
    name: str = "fitted",
    source: str = "",
    catalog: Catalog | None = None,
) -> Calibration:
    """Least-squares fit (see the module docstring); :func:`fit_report` also returns the warnings."""
    return fit_report(measurements, name, source, catalog).calibration


def _fit_net(rows: Sequence[Measurement], calib: Calibration, catalog: Catalog, base: NetParams) -> NetParams:
    """Network efficiency and PS CPU per variable from measured cluster rates, pulled towards ``base``."""
    from orchestrator.costmodel.cluster import cluster_rate  # local: cluster imports this module's users


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

    from scipy.optimize import least_squares  # lazy: SciPy only to fit, never for the CLI to start

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
    """Fit without each GPU type in turn and predict that GPU from its specs; needs two or more GPU types.
    Only runtimes also measured on another GPU are predicted (the others would test the priors alone);
    the MAPE is NaN where no runtime was measured on two GPU types."""
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
        keys = {m.key for m in train}  # a runtime measured on no other GPU has nothing to transfer: skipped
        test = [m for m in rows if cat.gpu(m.gpu).key == gpu and m.key in keys]
        if not test:
            continue
        calib = fit_calibration(train, catalog=cat)
        errs = [abs(predict(m, calib, cat) / float(m.step_time_s or 1) - 1) for m in test]
        all_errs += errs
        per.append(GpuValidation(gpu, len(test), float(np.mean(errs)), float(np.max(errs))))
    in_sample = mape(rows, fit_calibration(rows, catalog=cat), cat)
    return Validation(tuple(per), float(np.mean(all_errs)) if all_errs else float("nan"), in_sample)
