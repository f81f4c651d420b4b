"""Does a calibration on one Hopper GPU carry to another? Fitted on the H100's CIFAR ResNets, tested on the H200's
torchvision training steps (held out: another GPU, other models, another day and script).

Fit: data/measurements/h100-torch-resnet-cifar.csv and h100-torch-resnet-cifar-grid.csv (eager PyTorch, true fp32
and bf16 autocast, depths 20-110, batches 32-2048; bench/gpu/torchbench.py, 2026-11-23/24). Profiles: the
project's profiler on bench/factories/cifar_resnet.py (torchbench.py's model). The fit is costmodel/host_fit.py's,
what ``model predict --torch --measurements`` runs per GPU x precision: host time (overhead + per kernel) and two
GPU-time scales over the committed efficiencies (data/crossgpu_fit.json has no Hopper row: its defaults).

Test: data/measurements/raw/h200-training-steps-2026-11-28.jsonl, the fp32 and bf16 rows (the H100 rows have no
tf32 or fp16). The H200 takes the H100's fit (host_fit.fit_for: a GPU with no rows takes its architecture's):
the question is whether a Hopper measured on other models predicts this one. Beside: the committed model with
no fit. Nothing was chosen on the H200 rows: the fit is the product's, its rows the H100's.

    python bench/hopper_transfer.py
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cross_gpu_torchvision import eager_kernels, load_work  # noqa: E402

from orchestrator.costmodel import host_fit  # noqa: E402
from orchestrator.costmodel.compute import RUNTIME_PRIORS, layer_arrays  # noqa: E402
from orchestrator.costmodel.crossgpu import class_work  # noqa: E402
from orchestrator.profiler.cache import torch_profile  # noqa: E402

FIT_FILES = ("h100-torch-resnet-cifar.csv", "h100-torch-resnet-cifar-grid.csv")
HELD_OUT = ROOT / "data" / "measurements" / "raw" / "h200-training-steps-2026-11-28.jsonl"
RUNTIME = "pytorch-eager"


def fit_rows() -> list[tuple[int, int, str, float]]:
    """(depth, batch, precision, step_s) of the H100's eager rows, each point's rows averaged."""
    by: dict[tuple[int, int, str], list[float]] = {}
    for name in FIT_FILES:
        with (ROOT / "data" / "measurements" / name).open(newline="") as fh:
            for r in csv.DictReader(fh):
                if r["runtime"] == RUNTIME and r["precision"] in ("fp32", "bf16"):
                    by.setdefault((int(r["depth"]), int(r["batch"]), r["precision"]), []).append(
                        float(r["step_ms"]) / 1e3)
    return [(d, b, p, statistics.fmean(v)) for (d, b, p), v in sorted(by.items())]


def main() -> int:
    prior = RUNTIME_PRIORS[RUNTIME]
    rows = fit_rows()
    work, kernels = {}, {}
    for depth in sorted({d for d, _, _, _ in rows}):
        profile, _ = torch_profile(f"bench/factories/cifar_resnet.py:resnet{depth}", base=ROOT)
        work[depth] = class_work(profile)
        kernels[depth] = layer_arrays(profile.name).kernel_count(RUNTIME, "fp32")
    samples = [host_fit.sample(work[d], kernels[d], "h100", p, b, s) for d, b, p, s in rows]
    fits = host_fit.fit_machines(samples, prior)
    print(f"fit on {len(rows)} H100 points (CIFAR ResNet depths {sorted(work)}, eager fp32 / bf16):")
    for (gpu, p), f in fits.items():
        mine = [(d, b, s) for d, b, q, s in rows if q == p]
        errs = [abs(host_fit.machine_step_s(work[d], kernels[d], gpu, p, b, fits, prior) / s - 1) for d, b, s in mine]
        print(f"  {gpu} {p}: overhead {1e3 * f.overhead_s:.2f} ms + {1e6 * f.per_kernel_s:.1f} us a kernel, "
              f"compute x{f.compute_scale:.2f}, memory x{f.memory_scale:.2f}; in-sample mean error "
              f"{100 * statistics.fmean(errs):.1f}% over {len(mine)} points")
    tv_work, tv_kernels = load_work(), eager_kernels()
    held = [r for r in map(json.loads, HELD_OUT.read_text().splitlines())
            if "step_ms" in r and r["precision"] in ("fp32", "bf16")]
    print("\nheld out: the H200's torchvision training steps (fp32, bf16)")
    print(f"  {'model':13} {'batch':>5} {'prec':5} {'measured':>9} {'H100 fit':>15} {'committed':>15}")
    errs: dict[str, list[float]] = {"fit": [], "committed": []}
    for r in held:
        name, b, p = r["model"].removeprefix("tv-"), int(r["batch_per_gpu"]), r["precision"]
        w, k = tv_work[name], tv_kernels[name]
        fitted = 1e3 * host_fit.machine_step_s(w, k, "h200", p, b, fits, prior)  # host_fit.fit_for: H100's
        committed = 1e3 * host_fit.machine_step_s(w, k, "h200", p, b, {}, prior)
        errs["fit"].append(fitted / r["step_ms"] - 1)
        errs["committed"].append(committed / r["step_ms"] - 1)
        print(f"  {name:13} {b:5} {p:5} {r['step_ms']:9.2f} {fitted:9.1f} {100 * (fitted / r['step_ms'] - 1):+4.0f}% "
              f"{committed:9.1f} {100 * (committed / r['step_ms'] - 1):+4.0f}%")
    for k, v in errs.items():
        print(f"  {k:9} mean |error| {100 * statistics.fmean(abs(x) for x in v):5.1f}% over {len(v)} rows "
              f"(worst {100 * max(v, key=abs):+.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
