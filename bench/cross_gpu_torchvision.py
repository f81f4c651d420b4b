"""Cross-GPU step time on a second source, held out: 32 torchvision CNNs at batch 12 (fwd + bwd, no optimizer
step) on Titan Xp, RTX 2080 Ti, Titan RTX and A100-40GB, one script and software on every GPU
(../shared/public-throughput/steptime_ryujaehun.csv, one GPU per run, fp32 and pure fp16).

A question: from model M's measured step on GPU A, its step on GPU B at the same precision. Predictors:

  naive     A's step x peak FLOP/s(A) / peak FLOP/s(B) at the precision.
  model     crossgpu.py with data/crossgpu_fit.json as committed (fitted on throughput.csv only: nothing of
            this table is in it): A's step x gpu_seconds(B) / gpu_seconds(A), GPU time alone.
  shipped   what `model predict --torch ... --runtime pytorch-eager --measurements` computed with no machine
            fit: the same GPU time under the runtime's prior host time (compute.RUNTIME_PRIORS: 2 ms + 20 us a
            kernel), crossgpu.smooth_max of the two. Nothing of this table either. (Since 2026-11-28 a file
            that fits no machine takes the calibration's machine fits instead: bench/plan_user_model.py.)
  host      per machine (GPU x precision): step = host_s x layers + a x compute + b x memory, where
            compute / memory are the model's GPU seconds in its compute- / memory-bound layers. Batch 12 is
            small: PyTorch's eager launch of every layer's kernels (forward + backward) takes longer than
            the GPU's work in half of these steps, and the host's speed belongs to the machine. The
            three coefficients are fitted on THIS table, held out by cross-validation:
              A-model  without the question's model (its sub-family's other models stay in the fit)
              A        without the question's whole sub-family (resnet, vgg, densenet, ...) on every GPU
              B        as A and without the target GPU's rows: its host per layer is the other machines'
                       mean, its compute and memory the committed efficiencies' (x 1)
            The measured GPU (from) is always in the fit through its other models, as the product's case.
  calibrated  what the PRODUCT computes (`model predict --torch M --measurements FILE`, cli/model_torch.py)
            when FILE holds the table's rows of the other models (A-model: every other model; A: all but
            M's sub-family) on every GPU, plus M's one row on the measured GPU: costmodel/host_fit.py fits
            per GPU x precision the host time (overhead + per kernel, the runtime's prior pulling) and three
            GPU-time scales (compute-bound, memory-bound, depthwise convolutions) on those rows, and M's
            prediction is its measured step x model(to) / model(from).
            Fits are cached per (held-out group, machine, with M's row or not). The table times no optimizer
            step: its weights make 3 of crossgpu's 8 passes here.

The table's fp32 is the "tf32" precision class (TF32 on the A100 under PyTorch >= 1.7 defaults, FP32 where a
GPU has no TF32: the convention of bench/cross_gpu_fit.py); its pure .half() is "amp" (16-bit tensors).
Profiles: the project's profiler (meta device; per example, from its batches 2 and 4), x 12 for the step;
cached in bench/torchvision_work.json (with each model's depthwise layers), `--profile` rebuilds it (needs
torchvision; the "host" predictors keep three features and ignore the depthwise layers). Beside the lock's CPU
torch, PyPI's torchvision wheel (CUDA-built) fails in ``torchvision._meta_registrations``; the models need none
of its C ops, so a ``sitecustomize.py`` on PYTHONPATH that sets ``sys.modules["torchvision._meta_registrations"]``
to an empty module lets them load (how the 2026-11-28 work file was built, torchvision 0.28.0).

    python bench/cross_gpu_torchvision.py            # the tables (a few seconds)
    python bench/cross_gpu_torchvision.py --profile  # re-profile the 32 models first (minutes)
    python bench/cross_gpu_torchvision.py --write    # also the interval of a question between two fitted
                                                     # machines (data/crossgpu_intervals.csv, kind
                                                     # other-gpu-fitted): "calibrated A"'s 80th percentile
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import least_squares, nnls

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.costmodel import host_fit  # noqa: E402
from orchestrator.costmodel.compute import RUNTIME_PRIORS  # noqa: E402
from orchestrator.costmodel.crossgpu import (  # noqa: E402
    FITTED_KIND,
    INTERVALS_FILE,
    WEIGHT_PASSES,
    ClassWork,
    Efficiencies,
    arch_gpu,
    layer_seconds,
    load_efficiencies,
    smooth_max,
    transfer_weight,
)

FloatArray = npt.NDArray[np.float64]
ROOT = Path(__file__).resolve().parent.parent
TABLE = next((p / "shared" / "public-throughput" / "steptime_ryujaehun.csv" for p in ROOT.parents
              if (p / "shared" / "public-throughput" / "steptime_ryujaehun.csv").exists()),
             Path("steptime_ryujaehun.csv"))
WORK_FILE = ROOT / "bench" / "torchvision_work.json"
INTERVALS = ROOT / "data" / INTERVALS_FILE
INTERVAL_PREDICTOR = "calibrated A"  # whose held-out errors make the fitted-machines interval
BATCH = 12
RUNTIME = "pytorch-eager"
PRECISIONS = {"fp32": "tf32", "fp16(pure .half())": "amp"}  # the table's label -> the predictor's
GOAL_MEAN, GOAL_PAIR = 0.10, 0.15
SUBFAMILIES = (("resnext", "resnext/wide"), ("wide_resnet", "resnext/wide"), ("resnet", "resnet"),
               ("densenet", "densenet"), ("vgg", "vgg"), ("mnasnet", "mnasnet"), ("mobilenet", "mobilenet"),
               ("shufflenet", "shufflenet"), ("squeezenet", "squeezenet"))
Q = dict[str, Any]
Predict = Callable[["Row", "Row"], tuple[float, float]]  # (from, to) -> their predicted steps (any unit)


def subfamily(model: str) -> str:
    return next(f for prefix, f in SUBFAMILIES if model.startswith(prefix))


@dataclass(frozen=True)
class Row:
    model: str  # torchvision name
    gpu: str  # arch key
    precision: str  # crossgpu precision
    step_s: float


def load_rows(path: Path = TABLE, models: Iterable[str] | None = None) -> list[Row]:
    """One-GPU rows at fp32 and fp16 (median step)."""
    keep = set(models) if models is not None else None
    out = []
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            name = r["model"].removeprefix("tv-")
            if r["num_gpus"] != "1" or r["precision"] not in PRECISIONS or (keep is not None and name not in keep):
                continue
            out.append(Row(name, arch_gpu(r["gpu"]).key, PRECISIONS[r["precision"]], float(r["median_ms"]) / 1e3))
    return out


# ---- profiles: the per-layer arrays crossgpu.layer_seconds needs, cached in WORK_FILE

FIELDS = ("tensor_flops", "conv_flops", "vector_flops", "bytes", "weight_bytes", "ops")


def profile_models(models: list[str]) -> tuple[dict[str, ClassWork], dict[str, float]]:
    """(per-layer arrays, the kernels `model predict --runtime pytorch-eager` charges host time for)."""
    from orchestrator.costmodel.compute import layer_arrays  # noqa: PLC0415
    from orchestrator.costmodel.crossgpu import class_work  # noqa: PLC0415
    from orchestrator.profiler.cache import torch_profile  # noqa: PLC0415

    profiles = {m: torch_profile(f"torchvision:{m}")[0] for m in models}
    return ({m: class_work(p) for m, p in profiles.items()},
            {m: layer_arrays(p.name).kernel_count(RUNTIME, "fp32") for m, p in profiles.items()})


def save_work(work: dict[str, ClassWork], kernels: dict[str, float], path: Path = WORK_FILE) -> None:
    import torch  # noqa: PLC0415
    import torchvision  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

    doc = {"by": "python bench/cross_gpu_torchvision.py --profile",
           "software": f"torch {torch.__version__}, torchvision {torchvision.__version__}",
           "units": "per example (fwd + bwd): FLOPs, bytes; per step: weight bytes, ATen ops",
           "eager_kernels": kernels,
           "models": {m: {**{f: [float(f"{x:.5g}") for x in getattr(w, f)] for f in FIELDS},
                          "depthwise_layers": [] if w.depthwise is None else np.flatnonzero(w.depthwise).tolist()}
                      for m, w in sorted(work.items())}}
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")


def eager_kernels(path: Path = WORK_FILE) -> dict[str, float]:
    return {m: float(k) for m, k in json.loads(path.read_text())["eager_kernels"].items()}


def load_work(path: Path = WORK_FILE) -> dict[str, ClassWork]:
    doc = json.loads(path.read_text())
    arr = {m: [np.array(d[f], dtype=np.float64) for f in FIELDS] for m, d in doc["models"].items()}
    return {m: ClassWork(t, c, v, b, w, (), ops, _mask(len(ops), doc["models"][m].get("depthwise_layers")))
            for m, (t, c, v, b, w, ops) in arr.items()}


def _mask(n: int, layers: list[int] | None) -> FloatArray | None:
    """1.0 at each depthwise convolution's layer index (Layer.depthwise); None: the model has none."""
    if not layers:
        return None
    out = np.zeros(n)
    out[layers] = 1.0
    return out


# ---- predictors: seconds of one step (the ratio between two GPUs is what a question uses)

def peak_step(work: ClassWork, gpu: str, precision: str) -> float:
    return 1.0 / arch_gpu(gpu).tensor_peak(precision)


Features = dict[tuple[str, str, str], FloatArray]


def features(rows: list[Row], work: dict[str, ClassWork], eff: Efficiencies) -> Features:
    """Per row: (leaf layers, GPU seconds of the layers the model finds compute-bound, of the memory-bound
    ones), from crossgpu.layer_seconds with the committed efficiencies."""
    out = {}
    for r in rows:
        w = work[r.model]
        c, m, _ = layer_seconds(w, arch_gpu(r.gpu), r.precision, eff)
        out[(r.model, r.gpu, r.precision)] = np.array(
            [float(len(w.ops)), float(BATCH * c[c >= m].sum()), float(BATCH * m[m > c].sum())])
    return out


def fit_machine(rows: list[Row], feats: Features) -> dict[tuple[str, str], FloatArray]:
    """Per GPU x precision, step = host_s x layers + a x compute + b x memory, coefficients >= 0, least
    squares in log time (from the relative-error NNLS answer). host_s is the machine's eager-mode cost of
    one layer's forward + backward (batch 12 leaves most of these models host-bound); a, b correct the
    committed efficiencies on this software."""
    out = {}
    for key in sorted({(r.gpu, r.precision) for r in rows}):
        mine = [r for r in rows if (r.gpu, r.precision) == key]
        a = np.array([feats[(r.model, r.gpu, r.precision)] / r.step_s for r in mine])
        start = np.maximum(nnls(a, np.ones(len(mine)))[0], 1e-9)
        out[key] = least_squares(lambda c, a=a: np.log(np.maximum(a @ c, 1e-12)), start, bounds=(0.0, np.inf)).x
    return out


def held_out_fit(rows: list[Row], feats: Features, hold: Callable[[str], str], target_gpu: bool) -> Predict:
    """Each question's (from, to) steps from a fit without the question's ``hold`` group of models (every
    GPU) and, ``target_gpu``, without the target GPU's rows (its host per layer: the other machines' mean;
    its compute and memory: the committed efficiencies, x 1)."""
    fits: dict[tuple[str, str], dict[tuple[str, str], FloatArray]] = {}

    def predict(a: Row, b: Row) -> tuple[float, float]:
        key = (hold(b.model), b.gpu if target_gpu else "")
        if key not in fits:
            fits[key] = fit_machine([r for r in rows if hold(r.model) != key[0] and r.gpu != key[1]], feats)
        f = fits[key]

        def step(r: Row) -> float:
            c = f.get((r.gpu, r.precision))
            if c is None:  # a GPU never measured: the other machines' host, the committed efficiencies
                c = np.array([np.mean([v[0] for k, v in f.items() if k[1] == r.precision]), 1.0, 1.0])
            return float(feats[(r.model, r.gpu, r.precision)] @ c)
        return step(a), step(b)

    return predict


def calibrated_fit(rows: list[Row], work: dict[str, ClassWork], kernels: dict[str, float],
                   hold: Callable[[str], str], eff: Efficiencies, never_measured: bool = False,
                   target_fit: bool = True, transfer: bool = True) -> Predict:
    """What `model predict --torch M --measurements FILE` computes when FILE holds every row of the table
    but the question's ``hold`` group (every GPU), plus M's one row on the measured GPU: host_fit's
    per-machine fit (GPU x precision) on those rows, then M's step on each machine. Fits are cached per
    (held-out group, machine, M's row or none): the target machine never holds M's row.
    ``never_measured``: FILE has no row of the target GPU either (protocol B): the target takes its
    architecture's fit, else the other machines' host (host_fit.fit_for); ``target_fit`` False keeps the runtime
    prior's host for it instead (the product before fit_for, 2026-11-28). ``transfer`` False carries M's whole
    departure from the model over (the product before crossgpu.transfer_weight, 2026-11-28)."""
    prior = RUNTIME_PRIORS[RUNTIME]
    # this table times forward + backward without the optimizer: weights read twice, gradient written once,
    # 3 of crossgpu's 8 passes (the predictors above leave the weights out)
    work = {m: replace(w, weight_bytes=w.weight_bytes * 3.0 / WEIGHT_PASSES) for m, w in work.items()}
    samples = {r: host_fit.sample(work[r.model], kernels[r.model], r.gpu, r.precision, BATCH, r.step_s, eff)
               for r in rows}
    cache: dict[tuple[str, str, str, str], host_fit.MachineFit | None] = {}

    def fit(group: str, gpu: str, prec: str, extra: Row | None) -> host_fit.MachineFit | None:
        key = (group, gpu, prec, extra.model if extra else "")
        if key not in cache:
            mine = [samples[r] for r in rows if hold(r.model) != group and (r.gpu, r.precision) == (gpu, prec)]
            cache[key] = host_fit.fit_machines(mine + ([samples[extra]] if extra else []), prior).get((gpu, prec))
        return cache[key]

    def predict(a: Row, b: Row) -> tuple[float, float]:
        group = hold(b.model)
        if never_measured:  # the target GPU has no rows: every other GPU's fit at the precision (host_fit.fit_for)
            machines = sorted({r.gpu for r in rows if r.gpu != b.gpu})
            pairs = [((g, a.precision), fit(group, g, a.precision, a if g == a.gpu else None)) for g in machines]
        else:
            pairs = [((a.gpu, a.precision), fit(group, a.gpu, a.precision, a)),
                     ((b.gpu, b.precision), fit(group, b.gpu, b.precision, None))]
        fits = {k: f for k, f in pairs if f}

        def step(r: Row, fits: host_fit.Fits) -> float:
            return host_fit.machine_step_s(work[r.model], kernels[r.model], r.gpu, r.precision, BATCH, fits,
                                           prior, eff)

        def share(r: Row, fits: host_fit.Fits) -> float:
            return host_fit.machine_host_share(work[r.model], kernels[r.model], r.gpu, r.precision, BATCH, fits,
                                               prior, eff)
        pa, pb = step(a, fits), step(b, fits if target_fit else {})
        if not transfer:
            return pa, pb
        # crossgpu.predict's rule: the prediction is pb x (a's step / pa) ** weight; returned as the pa it implies
        weight = transfer_weight(share(a, fits), share(b, fits if target_fit else {}))
        return a.step_s / (a.step_s / pa) ** weight, pb

    return predict


def questions(rows: list[Row], predict: Predict, name: str) -> list[Q]:
    """Every ordered pair of GPUs of one model and precision: err = A's step x pred(B) / pred(A) / B - 1."""
    by = defaultdict(list)
    for r in rows:
        by[(r.model, r.precision)].append(r)
    out = []
    for rs in by.values():
        for a in rs:
            for b in rs:
                if a.gpu != b.gpu:
                    pa, pb = predict(a, b)
                    out.append({"predictor": name, "from": a.gpu, "to": b.gpu, "precision": b.precision,
                                "model": b.model, "subfamily": subfamily(b.model),
                                "err": a.step_s * pb / pa / b.step_s - 1.0})
    return out


def evaluate(rows: list[Row], work: dict[str, ClassWork], kernels: dict[str, float],
             eff: Efficiencies | None = None) -> dict[str, list[Q]]:
    e = eff or load_efficiencies()
    feats = features(rows, work, e)
    gpu_s = {k: float(v[1:].sum()) for k, v in feats.items()}
    prior = RUNTIME_PRIORS[RUNTIME]
    shipped = {k: smooth_max(prior.host_s(kernels[k[0]]), g) for k, g in gpu_s.items()}
    preds: dict[str, Predict] = {
        "naive": lambda a, b: (peak_step(work[a.model], a.gpu, a.precision),
                               peak_step(work[b.model], b.gpu, b.precision)),
        "model": lambda a, b: (gpu_s[(a.model, a.gpu, a.precision)], gpu_s[(b.model, b.gpu, b.precision)]),
        "shipped": lambda a, b: (shipped[(a.model, a.gpu, a.precision)], shipped[(b.model, b.gpu, b.precision)]),
        "host A-model": held_out_fit(rows, feats, lambda m: m, False),
        "host A": held_out_fit(rows, feats, subfamily, False),
        "host B": held_out_fit(rows, feats, subfamily, True),
        "calibrated A-model": calibrated_fit(rows, work, kernels, lambda m: m, e),
        "calibrated A-model whole ratio": calibrated_fit(rows, work, kernels, lambda m: m, e, transfer=False),
        "calibrated A": calibrated_fit(rows, work, kernels, subfamily, e),
        "calibrated B": calibrated_fit(rows, work, kernels, subfamily, e, never_measured=True),
        "calibrated B prior": calibrated_fit(rows, work, kernels, subfamily, e, never_measured=True,
                                             target_fit=False),
    }
    return {n: questions(rows, p, n) for n, p in preds.items()}


# ---- report

def _mean(qs: list[Q]) -> float:
    return float(np.mean(np.abs([q["err"] for q in qs]))) if qs else float("nan")


def _table(title: str, head: list[str], rows: list[list[Any]]) -> None:
    print(f"\n{title}")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    for line in [head, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=False)))


def _by(qs: list[Q], field: str) -> dict[str, float]:
    return {v: _mean([q for q in qs if q[field] == v]) for v in sorted({q[field] for q in qs})}


def summary(qs: list[Q]) -> dict[str, Any]:
    pairs: dict[str, list[Q]] = defaultdict(list)
    for q in qs:
        pairs[f"{q['from']}->{q['to']} {q['precision']}"].append(q)
    means = {k: _mean(v) for k, v in pairs.items()}
    return {"mean": _mean(qs), "pairs": means, "pair_n": {k: len(v) for k, v in pairs.items()},
            "worst_pair": max(means.values()),
            "pairs_under_15pct": sum(v < GOAL_PAIR for v in means.values()),
            "subfamily": _by(qs, "subfamily"), "precision": _by(qs, "precision"),
            "met": _mean(qs) < GOAL_MEAN and max(means.values()) < GOAL_PAIR}


def report(results: dict[str, list[Q]]) -> None:
    names = list(results)
    s = {n: summary(qs) for n, qs in results.items()}
    _table("mean |error| by precision", ["predictor", "n", "all", *s[names[0]]["precision"]],
           [[n, len(results[n]), f"{s[n]['mean']:.1%}", *(f"{v:.1%}" for v in s[n]["precision"].values())]
            for n in names])
    _table("by ordered GPU pair x precision", ["pair", *names],
           [[k, *(f"{s[n]['pairs'][k]:.1%}" for n in names)] for k in sorted(s[names[0]]["pairs"])])
    _table("by sub-family", ["sub-family", *names],
           [[f, *(f"{s[n]['subfamily'][f]:.1%}" for n in names)] for f in s[names[0]]["subfamily"]])
    for n in names[1:]:
        worst = sorted(results[n], key=lambda q: -abs(q["err"]))[:5]
        _table(f"worst 5 ({n})", ["from", "to", "precision", "model", "err"],
               [[q["from"], q["to"], q["precision"], q["model"], f"{q['err']:+.1%}"] for q in worst])
    print("\nSUMMARY (one measured GPU -> another, same precision; goal < 10% mean and every pair x precision "
          "< 15%)")
    for n in names:
        print(f"  {n:<30} mean {s[n]['mean']:.1%}; pairs x precision under 15%: {s[n]['pairs_under_15pct']}/"
              f"{len(s[n]['pairs'])}; worst pair {s[n]['worst_pair']:.1%}; goal {'MET' if s[n]['met'] else 'NOT met'}")
    print("  held out: naive and model use nothing of this table; host fits three coefficients per GPU x "
          "precision on this table without the question's model (A-model), its sub-family (A), and also the "
          "target GPU (B: its host per layer the other machines' mean, its GPU part the committed efficiencies); "
          "calibrated is the product's host_fit on the same rows as host A-model / A / B (B prior: the target's "
          "host the runtime prior, as before host_fit.fit_for) plus the question's model "
          "on the measured GPU")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--work", type=Path, default=WORK_FILE)
    parser.add_argument("--profile", action="store_true", help="re-profile the models (needs torchvision)")
    parser.add_argument("--models", help="comma-separated subset (default: every model of the table)")
    parser.add_argument("--write", action="store_true", help=f"write the {FITTED_KIND} interval to {INTERVALS}")
    args = parser.parse_args(argv)
    rows = load_rows(args.table, args.models.split(",") if args.models else None)
    if args.profile:
        save_work(*profile_models(sorted({r.model for r in rows})), path=args.work)
    work = load_work(args.work)
    kernels = eager_kernels(args.work)
    rows = [r for r in rows if r.model in work]
    print(f"{len(rows)} rows: {len({r.model for r in rows})} models x {len({r.gpu for r in rows})} GPUs x "
          f"{len({r.precision for r in rows})} precisions, batch {BATCH}, one GPU ({args.table.name})")
    results = evaluate(rows, work, kernels)
    report(results)
    coefs(rows, work)
    row = interval_row(results)
    print(f"\ninterval of a question between two fitted machines ({FITTED_KIND}): +-{row['half_width']:.1%} at the "
          f"same batch (80th percentile of {INTERVAL_PREDICTOR}'s {row['n']} held-out errors); held-out coverage "
          f"{row['held_out_coverage']:.1%} (each sub-family against the other sub-families' width)")
    if args.write:
        write_interval(row)
        print(f"wrote it to {INTERVALS.relative_to(ROOT)}")
    return 0


def interval_row(results: dict[str, list[Q]]) -> dict[str, Any]:
    """``model predict --torch --measurements``' half-width when both machines have fits of their own: the 80th
    percentile of |log(predicted / true)| of "calibrated A" (the question's whole sub-family out of the file,
    as a user's new model's family may be), and that percentile's held-out coverage: each sub-family's
    questions against the width of the other sub-families' errors."""
    qs = results[INTERVAL_PREDICTOR]
    logs: dict[str, list[float]] = defaultdict(list)
    for q in qs:
        logs[q["subfamily"]].append(abs(float(np.log1p(q["err"]))))
    every = [x for v in logs.values() for x in v]
    inside = sum(sum(x <= np.percentile([y for g, v in logs.items() if g != f for y in v], 80) for x in mine)
                 for f, mine in logs.items())
    width = float(np.expm1(np.percentile(every, 80)))
    return {"kind": FITTED_KIND, "batch_doublings": 0, "half_width": round(width, 4), "n": len(every),
            "held_out_coverage": round(float(inside) / len(every), 3)}


def write_interval(row: dict[str, Any], path: Path | None = None) -> None:
    """Replace this kind's rows of data/crossgpu_intervals.csv, keeping bench/cross_gpu.py's."""
    path = path or INTERVALS
    with path.open(newline="") as fh:
        kept = [r for r in csv.DictReader(fh) if r["kind"] != FITTED_KIND]
    with path.open("w", newline="") as fh:
        out = csv.DictWriter(fh, ["kind", "batch_doublings", "half_width", "n", "source", "method"])
        out.writeheader()
        out.writerows(kept)
        out.writerow({**{k: row[k] for k in ("kind", "batch_doublings", "half_width", "n")},
                      "source": "python bench/cross_gpu_torchvision.py --write (on ../shared/public-throughput/"
                                "steptime_ryujaehun.csv)",
                      "method": f"80th percentile of |log(predicted/true)| over the product's held-out questions "
                                f"(\"{INTERVAL_PREDICTOR}\": the question's sub-family out of the measurements file) "
                                f"between two machines fitted on other models' rows; sub-family-held-out coverage "
                                f"{row['held_out_coverage']:.1%}"})


def coefs(rows: list[Row], work: dict[str, ClassWork]) -> None:
    """The host predictor's coefficients fitted on every row (in sample, for reading; not what is scored)."""
    fit = fit_machine(rows, features(rows, work, load_efficiencies()))
    _table("host predictor fitted on every row (in sample, not scored): per GPU x precision",
           ["gpu", "precision", "host ms/layer", "x compute", "x memory"],
           [[g, p, f"{c[0] * 1e3:.3f}", f"{c[1]:.2f}", f"{c[2]:.2f}"] for (g, p), c in fit.items()])


if __name__ == "__main__":
    raise SystemExit(main())
