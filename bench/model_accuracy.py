"""Held-out accuracy of the step-time model on real GPU measurements (data/measurements), no emulation.

The model is calibrated on a NAMED subset of the real points and then predicts every other measured
point; the error is printed per held-out group (batch sizes, depths, GPU types, runtimes) with the
worst points. Nothing here runs the local provider: its emulated GPUs would only echo the data.

Calibration subset (``--subset``):

* ``corners`` (default): for each H100 runtime (PyTorch eager FP32 / BF16, torch.compile) ResNet-32 at
  batch 32 and 2048 plus ResNet-20 and ResNet-110 at batch 128 (the two ends of the batch curve and of
  the depth range); every other batch and depth is held out. For the 2019 TF runs on GCE, leave-one-GPU-out:
  calibrate on two of K80 / P100 / V100 and predict the third from its datasheet.
* ``one-point``: ResNet-32 at batch 128 only, per runtime (the issue's "one batch at one depth"); the
  priors fill in what one point cannot say (the fit warns).
* ``leave-group-out``: cross-validation by group: each H100 group (a batch size of ResNet-32, or a
  depth) is predicted by a fit to every other H100 point, so no group is ever in its own calibration.

Also printed: predicted against measured peak memory, and predicted parameter-server throughput
against workers for 1 and 2 PS beside the ICAC'19 study's measured figures (ResNet-32, V100 and K80,
from the study's public data, data/measurements/icac19-gce-resnet32-tf.csv).

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

from orchestrator.core.costmodel.calibration import Measurement, fit_report, load_measurements, predict  # noqa: E402
from orchestrator.core.costmodel.cluster import cluster_rate  # noqa: E402
from orchestrator.core.costmodel.compute import Calibration  # noqa: E402
from orchestrator.core.costmodel.memory import fit_memory, memory_bytes  # noqa: E402

DATA = REPO / "data" / "measurements"
Pick = Callable[[Measurement], bool]
SUBSETS: dict[str, Pick] = {
    "corners": lambda m: m.gpu == "h100" and (
        (m.model == "resnet_cifar_32" and m.batch in (32, 2048)) or m.model in ("resnet_cifar_20", "resnet_cifar_110")),
    "one-point": lambda m: m.gpu == "h100" and m.model == "resnet_cifar_32" and m.batch == 128,
}


def depth(m: Measurement) -> int:
    return int(m.model.rsplit("_", 1)[-1])


def group_of(m: Measurement) -> str:
    return f"batch {m.batch}" if m.model == "resnet_cifar_32" else f"depth {depth(m)}"


def held_out(rows: list[Measurement], subset: str) -> tuple[list[tuple[str, Measurement, float]], list[str]]:
    """(group, point, predicted) for every held-out point, and the fit warnings."""
    out: list[tuple[str, Measurement, float]] = []
    warnings: list[str] = []
    h100 = [m for m in rows if m.gpu == "h100"]
    if subset == "leave-group-out":  # each group predicted by a fit to every other H100 point
        for group in sorted({group_of(m) for m in h100}):
            rep = fit_report([m for m in h100 if group_of(m) != group], name=f"without-{group}")
            warnings += rep.warnings
            out += [(group, m, predict(m, rep.calibration)) for m in h100 if group_of(m) == group]
    else:
        pick = SUBSETS[subset]
        rep = fit_report([m for m in h100 if pick(m)], name="subset")
        warnings += rep.warnings
        out += [(group_of(m), m, predict(m, rep.calibration)) for m in h100 if not pick(m)]
    tf = [m for m in rows if m.key == "tf1-graph"]
    for m in tf:  # leave one GPU type out
        rep = fit_report([r for r in tf if r.gpu != m.gpu], name=f"without-{m.gpu}")
        warnings += rep.warnings
        out.append((f"GPU {m.gpu} (TF 2019)", m, predict(m, rep.calibration)))
    return out, sorted(set(warnings))


def report(results: Sequence[tuple[str, Measurement, float]]) -> None:
    by_group: dict[str, list[float]] = defaultdict(list)
    by_runtime: dict[str, list[float]] = defaultdict(list)
    for group, m, p in results:
        err = (p - float(m.step_time_s or 0)) / float(m.step_time_s or 1)
        by_group[group].append(err)
        by_runtime[f"runtime {m.key}"].append(err)
    print(f"{'held-out group':28} {'points':>6} {'MAPE':>7} {'worst':>7}")
    for name, errs in [*sorted(by_group.items(), key=lambda kv: _order(kv[0])), *sorted(by_runtime.items())]:
        a = np.abs(errs)
        flag = "" if a.mean() <= 0.10 else "   > 10%"
        print(f"{name:28} {len(errs):6d} {a.mean():7.1%} {a.max():7.1%}{flag}")
    allerr = np.abs([(p - float(m.step_time_s or 0)) / float(m.step_time_s or 1) for _, m, p in results])
    print(f"{'all held-out points':28} {len(allerr):6d} {allerr.mean():7.1%} {allerr.max():7.1%}")
    print("\nworst held-out points")
    worst = sorted(results, key=lambda r: -abs(r[2] / float(r[1].step_time_s or 1) - 1))[:6]
    for _, m, p in worst:
        t = float(m.step_time_s or 0)
        print(f"  {m.gpu:5} {m.key:20} {m.model:17} batch {m.batch:5}: measured {t * 1e3:7.2f} ms, "
              f"predicted {p * 1e3:7.2f} ms ({p / t - 1:+.1%})")


def _order(name: str) -> tuple[int, int]:
    kind, _, value = name.partition(" ")
    return ({"batch": 0, "depth": 1}.get(kind, 2), int(value) if value.isdigit() else 0)


def memory_check(rows: list[Measurement]) -> None:
    pts = [m for m in rows if m.peak_gb and m.key == "pytorch-eager"]
    ref = [m for m in pts if m.model == "resnet_cifar_32" and m.batch in (32, 2048)]
    params = fit_memory("resnet_cifar_32", [(m.batch, float(m.peak_gb or 0) * 1e9) for m in ref])
    print("\npeak memory, PyTorch eager FP32 on the H100 (measured: torch.cuda.max_memory_allocated); "
          f"activation fraction {params.activation_fraction:.2f} and workspace {params.workspace_bytes / 1e9:.3f} GB "
          "fitted on ResNet-32 at batch 32 and 2048 only (*)")
    print(f"  {'model':17} {'batch':>5} {'measured GB':>11} {'predicted GB':>12} {'error':>7}")
    errs = []
    for m in pts:
        pred = memory_bytes(m.model, m.batch, params) / 1e9
        err = pred / float(m.peak_gb or 1) - 1
        star = " *" if m in ref else ""
        errs += [] if star else [abs(err)]
        print(f"  {m.model:17} {m.batch:5d} {m.peak_gb:11.3f} {pred:12.3f} {err:+7.1%}{star}")
    print(f"  held-out peak-memory MAPE: {np.mean(errs):.1%} over {len(errs)} points")


def ps_table(rows: list[Measurement]) -> None:
    tf = [m for m in rows if m.key == "tf1-graph"]
    calib = fit_report([m for m in tf if m.is_compute], name="tf-2019").calibration
    measured = {(m.gpu, m.ps_count, m.workers): float(m.steps_per_s or 0) for m in tf if m.is_cluster}
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
    compute = [m for m in rows if m.is_compute]
    print(f"{len(compute)} measured step times in {DATA.relative_to(REPO)} "
          f"({len({m.source.split(':')[0] for m in compute})} sources); calibration subset '{args.subset}'\n")
    results, warnings = held_out(compute, args.subset)
    for w in warnings:
        print(f"warning: {w}")
    print()
    report(results)
    memory_check(compute)
    ps_table(rows)


if __name__ == "__main__":
    main()
