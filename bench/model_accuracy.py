"""Held-out accuracy of the step-time model on real GPU measurements (data/measurements), no emulation.

The model is calibrated on a NAMED subset of the real points and then predicts every other measured
point; the error is printed per held-out group (batch sizes, depths, GPU types, runtimes) with the
worst points. Nothing here runs the local provider: its emulated GPUs would only echo the data.

Calibration subset (``--subset``), always drawn from the 2026-11-23 H100 session
(data/measurements/h100-torch-resnet-cifar.csv):

* ``corners`` (default): for each H100 runtime (PyTorch eager FP32 / BF16, torch.compile) ResNet-32 at
  batch 32 and 2048 plus ResNet-20 and ResNet-110 at batch 128 (the two ends of the batch curve and of
  the depth range); every other batch and depth is held out. For the 2019 TF runs on GCE, leave-one-GPU-out:
  calibrate on two of K80 / P100 / V100 and predict the third from its datasheet.
* ``one-point``: ResNet-32 at batch 128 only, per runtime (the issue's "one batch at one depth"); the
  priors fill in what one point cannot say (the fit warns).
* ``leave-group-out``: cross-validation by group: each H100 group (a batch size of ResNet-32, or a
  depth) is predicted by a fit to every other H100 point of that session, so no group is ever in its
  own calibration.

Additional held-out data: the H100 grid measured in another session (2026-11-24,
data/measurements/h100-torch-resnet-cifar-grid.csv: ResNet-20/44/56/110 x batch 32..2048, eager FP32 /
BF16, torch.compile) is never in a calibration subset; every grid point is predicted by the same fit and
reported per depth, batch and runtime, with a depth x batch table. Its errors include the host's
session-to-session drift (the same ResNet-20 batch-128 step: 11.65 ms on 2026-11-23, 9.84 ms on
2026-11-24), so a second table calibrates on the grid's own corners (``GRID_CORNERS``: per runtime the
shallowest and deepest model at the smallest and largest batch) and predicts the rest of the grid, and a
third calibrates on the corners of both sessions (as the shipped calibration is fitted on every session)
and predicts every other point of either. An in-sample line (marked as such: not a held-out figure) shows
each session fitted on all its own points and the host cost each implies.

Also printed: predicted against measured steady peak memory (the grid's timed steps), and predicted
parameter-server throughput against workers for 1 and 2 PS beside the ICAC'19 study's measured figures
(ResNet-32, V100 and K80, from the study's public data, data/measurements/icac19-gce-resnet32-tf.csv).

    python bench/model_accuracy.py [--subset corners|one-point|leave-group-out]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.costmodel.calibration import Measurement, fit_report, load_measurements, predict  # noqa: E402
from orchestrator.costmodel.cluster import cluster_rate  # noqa: E402
from orchestrator.costmodel.compute import Calibration  # noqa: E402
from orchestrator.costmodel.memory import MemoryParams, fit_memory, memory_bytes  # noqa: E402

DATA = REPO / "data" / "measurements"
SESSION = DATA / "h100-torch-resnet-cifar.csv"  # the calibration subsets come from this session only
GRID = DATA / "h100-torch-resnet-cifar-grid.csv"  # another session: held out, never calibrated on
TF2019 = DATA / "icac19-gce-resnet32-tf.csv"
Pick = Callable[[Measurement], bool]
SUBSETS: dict[str, Pick] = {
    "corners": lambda m: m.gpu == "h100" and (
        (m.model == "resnet_cifar_32" and m.batch in (32, 2048)) or m.model in ("resnet_cifar_20", "resnet_cifar_110")),
    "one-point": lambda m: m.gpu == "h100" and m.model == "resnet_cifar_32" and m.batch == 128,
}
Result = tuple[str, Measurement, float]


def depth(m: Measurement) -> int:
    return int(m.model.rsplit("_", 1)[-1])


def group_of(m: Measurement) -> str:
    return f"batch {m.batch}" if m.model == "resnet_cifar_32" else f"depth {depth(m)}"


def held_out(session: list[Measurement], tf: list[Measurement], grid: list[Measurement], subset: str
             ) -> tuple[list[Result], list[Result], list[str]]:
    """(group, point, predicted) for every held-out point of the calibration session and of the grid,
    and the fit warnings."""
    out: list[Result] = []
    on_grid: list[Result] = []
    warnings: list[str] = []
    h100 = [m for m in session if m.gpu == "h100"]
    if subset == "leave-group-out":  # each group predicted by a fit to every other H100 point
        for group in sorted({group_of(m) for m in h100}):
            rep = fit_report([m for m in h100 if group_of(m) != group], name=f"without-{group}")
            warnings += rep.warnings
            out += [(group, m, predict(m, rep.calibration)) for m in h100 if group_of(m) == group]
        rep = fit_report(h100, name="session")  # the grid: predicted by the whole session
    else:
        pick = SUBSETS[subset]
        rep = fit_report([m for m in h100 if pick(m)], name="subset")
        warnings += rep.warnings
        out += [(group_of(m), m, predict(m, rep.calibration)) for m in h100 if not pick(m)]
    on_grid += [(f"grid depth {depth(m)}", m, predict(m, rep.calibration)) for m in grid]
    for m in tf:  # leave one GPU type out
        rep = fit_report([r for r in tf if r.gpu != m.gpu], name=f"without-{m.gpu}")
        warnings += rep.warnings
        out.append((f"GPU {m.gpu} (TF 2019)", m, predict(m, rep.calibration)))
    return out, on_grid, sorted(set(warnings))


def grid_corners(grid: list[Measurement]) -> list[Measurement]:
    """Per runtime key, the shallowest and deepest model at the smallest and largest batch measured."""
    picked: list[Measurement] = []
    for key in sorted({m.key for m in grid}):
        rows = [m for m in grid if m.key == key]
        depths = (min(map(depth, rows)), max(map(depth, rows)))
        for d in depths:
            at = [m for m in rows if depth(m) == d]
            picked += [m for m in at if m.batch in (min(x.batch for x in at), max(x.batch for x in at))]
    return picked


def within_grid(grid: list[Measurement]) -> list[Result]:
    corners = grid_corners(grid)
    cal = fit_report(corners, name="grid-corners").calibration
    return [(f"grid depth {depth(m)}", m, predict(m, cal)) for m in grid if m not in corners]


def pooled(session: list[Measurement], grid: list[Measurement]) -> list[Result]:
    """Calibrated on the named corners of BOTH H100 sessions ('corners' of the 2026-11-23 session and the
    grid's corners), as the shipped calibration is fitted on every session measured; every other point of
    either session predicted. Groups pool both sessions."""
    calib = [m for m in session if SUBSETS["corners"](m)] + grid_corners(grid)
    cal = fit_report(calib, name="both-sessions").calibration
    return [(f"both depth {depth(m)}", m, predict(m, cal)) for m in session + grid
            if m.gpu == "h100" and m not in calib]


def _err(r: Result) -> float:
    _, m, p = r
    return p / float(m.step_time_s or 1) - 1


def report(results: Sequence[Result], title: str, extra: Sequence[str] = ("runtime",)) -> None:
    by_group: dict[str, list[float]] = defaultdict(list)
    for r in results:
        group, m, _ = r
        by_group[group].append(_err(r))
        if "runtime" in extra:
            by_group[f"runtime {m.key}"].append(_err(r))
        if "batch" in extra:
            by_group[f"{group.split(' depth')[0]} batch {m.batch}"].append(_err(r))
    print(title)
    print(f"{'held-out group':28} {'points':>6} {'MAPE':>7} {'worst':>7}")
    for name, errs in sorted(by_group.items(), key=lambda kv: _order(kv[0])):
        a = np.abs(errs)
        flag = "" if a.mean() <= 0.10 else "   > 10%"
        print(f"{name:28} {len(errs):6d} {a.mean():7.1%} {a.max():7.1%}{flag}")
    allerr = np.abs([_err(r) for r in results])
    print(f"{'all held-out points':28} {len(allerr):6d} {allerr.mean():7.1%} {allerr.max():7.1%}")


def worst(results: Sequence[Result], n: int = 8) -> None:
    print("\nworst held-out points")
    for r in sorted(results, key=lambda r: -abs(_err(r)))[:n]:
        _, m, p = r
        t = float(m.step_time_s or 0)
        print(f"  {m.gpu:5} {m.key:20} {m.model:17} batch {m.batch:5}: measured {t * 1e3:7.2f} ms, "
              f"predicted {p * 1e3:7.2f} ms ({p / t - 1:+.1%})")


def matrix(results: Sequence[Result]) -> None:
    """Signed error per depth x batch, one block per runtime."""
    for key in sorted({m.key for _, m, _ in results}):
        rows = [r for r in results if r[1].key == key]
        batches = sorted({r[1].batch for r in rows})
        print(f"  {key:20} " + " ".join(f"{'b' + str(b):>7}" for b in batches))
        for d in sorted({depth(r[1]) for r in rows}):
            cells = {r[1].batch: _err(r) for r in rows if depth(r[1]) == d}
            print(f"  {'ResNet-' + str(d):20} " + " ".join(f"{cells[b]:+7.1%}" if b in cells else f"{'':>7}"
                                                          for b in batches))


def _order(name: str) -> tuple[int, int, str]:
    words = name.split(" ")
    value = words[-1]
    rank = {"batch": 0, "depth": 1, "GPU": 2, "grid": 3, "both": 3, "runtime": 5}.get(words[0], 4)
    if words[0] in ("grid", "both"):
        rank += words[1] == "batch"
    return (rank, int(value) if value.isdigit() else 0, name)


MEMORY_REF = ("resnet_cifar_32", (128, 2048))  # the fitted variant's points: the grid's ResNet-32, steady peaks


def host_drift(session: list[Measurement], grid: list[Measurement], tf: list[Measurement]) -> None:
    """NOT held out: each session fitted on all its own points, to show what the model's form can fit and how
    far apart the two sessions' host costs are (the same H100 model and software on two different VMs)."""
    print("\nin-sample (NOT a held-out figure): each H100 session fitted on all its own points; the host cost of "
          "an eager FP32 step, per session")
    for name, rows in (("2026-11-23 session", session), ("2026-11-24 grid", grid)):
        cal = fit_report([m for m in rows + tf if m.is_compute], name=name).calibration
        errs: dict[str, list[float]] = defaultdict(list)
        for m in rows:
            e = abs(predict(m, cal) / float(m.step_time_s or 1) - 1)
            errs[f"depth {depth(m)}"].append(e)
            errs[f"batch {m.batch}"].append(e)
        worst_group = max(errs, key=lambda g: float(np.mean(errs[g])))
        eff = cal.per_gpu["h100/pytorch-eager"]
        print(f"  {name:19} worst group {worst_group} {np.mean(errs[worst_group]):.1%}; host cost "
              f"{eff.overhead_s * 1e3:.2f} ms + {eff.overhead_per_kernel_s * 1e6:.1f} us a kernel")


def memory_check(rows: list[Measurement], grid: list[Measurement]) -> None:
    """Peak memory of a training step, predicted two ways, against the grid's steady peaks (the timed steps
    alone). The first steps' cuDNN autotuning adds a transient on top (``peak_gb``); PyTorch sizes those
    trial workspaces to the memory left free, so it never decides whether a batch fits."""
    steady = [m for m in grid if m.peak_steady_gb and m.key == "pytorch-eager"]
    prior = MemoryParams(needed_only=True)
    ref = [m for m in steady if m.model == MEMORY_REF[0] and m.batch in MEMORY_REF[1]]
    fitted = fit_memory(MEMORY_REF[0], [(m.batch, float(m.peak_steady_gb or 0) * 1e9) for m in ref])
    print("\npeak memory of a training step, PyTorch eager FP32, H100 grid (measured: torch.cuda.max_memory_allocated "
          "over the timed steps)\n  prior: weights + gradients + momentum + the activations backward needs, counted "
          "from the layers; nothing fitted\n  fitted: the same with the kept share "
          f"(x {fitted.activation_fraction:.2f}) and a workspace ({fitted.workspace_bytes / 1e9:.3f} GB) fitted on "
          f"{MEMORY_REF[0]} at batch {' and '.join(map(str, MEMORY_REF[1]))} only (*)")
    print(f"  {'model':17} {'batch':>5} {'steady GB':>9} {'prior GB':>8} {'error':>7} {'fitted GB':>9} {'error':>7} "
          f"{'first steps GB':>14}")
    errs: dict[str, list[float]] = {"prior": [], "fitted": []}
    for m in steady:
        meas = float(m.peak_steady_gb or 1)
        pp, pf = memory_bytes(m.model, m.batch, prior) / 1e9, memory_bytes(m.model, m.batch, fitted) / 1e9
        errs["prior"].append(abs(pp / meas - 1))
        if m not in ref:
            errs["fitted"].append(abs(pf / meas - 1))
        print(f"  {m.model:17} {m.batch:5d} {meas:9.3f} {pp:8.3f} {pp / meas - 1:+7.1%} {pf:9.3f} {pf / meas - 1:+7.1%}"
              f"{' *' if m in ref else '  '} {float(m.peak_gb or 0):12.3f}")
    print(f"  steady-peak MAPE: prior {np.mean(errs['prior']):.1%} over {len(errs['prior'])} points (worst "
          f"{max(errs['prior']):.1%}); fitted {np.mean(errs['fitted']):.1%} over {len(errs['fitted'])} held-out points "
          f"(worst {max(errs['fitted']):.1%})")
    session = [m for m in rows if m.peak_gb and m.key == "pytorch-eager"]
    extra = [float(m.peak_gb or 0) - memory_bytes(m.model, m.batch, fitted) / 1e9 for m in session]
    print(f"  the 2026-11-23 session logged only whole-point peaks (first steps included): {len(session)} points, "
          f"{min(extra):+.3f} to {max(extra):+.3f} GB above the fitted steady prediction")


def ps_table(rows: list[Measurement]) -> None:
    tf = [m for m in rows if m.key == "tf1-graph"]
    calib = fit_report([m for m in tf if m.is_compute], name="tf-2019").calibration
    measured = {(m.gpu, int(m.ps_count or 0), int(m.workers or 0)): float(m.steps_per_s or 0)
                for m in tf if m.is_cluster}
    print("\nparameter-server throughput, ResNet-32 batch 128, async (global steps/s): predicted vs measured "
          "by S. Li, R. J. Walls, L. Xu, T. Guo, 'Speeding up Deep Learning with Transient Servers', ICAC 2019 "
          "(arXiv:1903.00045, Fig. 6, the PS bottleneck), from the study's public data "
          "github.com/cake-lab/transient-deep-learning data/training/experiment_1ps_vs_2ps; the network "
          "constants are the defaults (NetParams: PS CPU per variable fitted on the 1-PS 8-V100 point only)")
    print(f"  {'GPU':4} {'workers':>7} {'1 PS pred':>9} {'1 PS meas':>9} {'2 PS pred':>9} {'2 PS meas':>9}")
    for gpu in ("k80", "v100"):
        for n in (1, 2, 4, 6, 8):
            cells = []
            for ps in (1, 2):
                pred = _rate(calib, gpu, n, ps)
                meas = measured.get((gpu, ps, n))
                cells += [f"{pred:9.1f}", f"{meas:9.1f}" if meas else f"{'-':>9}"]
            print(f"  {gpu:4} {n:7d} " + " ".join(cells))
    errs = [abs(_rate(calib, g, n, ps) / v - 1) for (g, ps, n), v in measured.items()]
    print(f"  MAPE over the {len(errs)} measured cluster points: {np.mean(errs):.1%} (default network constants)")


def _rate(calib: Calibration, gpu: str, n: int, ps: int) -> float:
    return cluster_rate("resnet_cifar_32", [gpu] * n, [128] * n, ps, "n1-standard-4", "async", calib)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subset", choices=[*sorted(SUBSETS), "leave-group-out"], default="corners")
    args = ap.parse_args()
    rows = load_measurements(DATA)
    session = [m for m in load_measurements(SESSION) if m.is_compute]
    tf = [m for m in load_measurements(TF2019) if m.is_compute]
    grid = [m for m in load_measurements(GRID) if m.is_compute] if GRID.exists() else []
    compute = [m for m in rows if m.is_compute]
    print(f"{len(compute)} measured step times in {DATA.relative_to(REPO)} "
          f"({len({m.source.split(':')[0] for m in compute})} sources); calibration subset '{args.subset}' "
          f"of {SESSION.name}; " + (f"{len(grid)} grid points of {GRID.name} held out" if grid else
                                     f"no {GRID.name} yet") + "\n")
    results, on_grid, warnings = held_out(session, tf, grid, args.subset)
    for w in warnings:
        print(f"warning: {w}")
    print()
    report(results, f"held out: the 2026-11-23 H100 session (calibrated on '{args.subset}') and the 2019 TF GPUs")
    worst(results)
    if on_grid:
        print()
        report(on_grid, f"held out: the 2026-11-24 H100 grid, another session (the same '{args.subset}' calibration)",
               extra=("runtime", "batch"))
        print("\nsigned error per depth x batch (grid, same calibration)")
        matrix(on_grid)
        worst(on_grid)
        inside = within_grid(grid)
        print()
        report(inside, "within the grid's session: calibrated on the grid's corners "
               f"({len(grid_corners(grid))} points: per runtime the shallowest and deepest model at the smallest and "
               "largest batch), predicting the other grid points", extra=("runtime", "batch"))
        print("\nsigned error per depth x batch (grid, calibrated on its corners)")
        matrix(inside)
        print()
        report(pooled(session, grid), "held out, calibrated on the corners of both H100 sessions (the 2026-11-23 "
               "'corners' and the grid's): every other H100 point of either session", extra=("runtime", "batch"))
        host_drift(session, grid, tf)
    memory_check(session, grid)
    ps_table(rows)


if __name__ == "__main__":
    main()
