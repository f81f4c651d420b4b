"""The cross-GPU and cross-precision model on a GPU that no table holds: training steps measured on a lent H200.

data/measurements/raw/h200-training-steps-2026-11-28.jsonl (bench/gpu/torchvision_steps.py, 2026-11-28, one
NVIDIA H200, torch 2.11.0+cu130, cuDNN 9.19): full training steps of torchvision models (channels_last, SGD with
momentum, synthetic 224x224 inputs on the GPU) in fp32 (TF32 off), tf32, amp (fp16 autocast + GradScaler) and
bf16 (bf16 autocast). Held out: every row. Nothing of the H200 is in data/crossgpu_fit.json (fitted on
../shared/public-throughput/throughput.csv, which has no Hopper GPU) or in any other fit; no constant here was
chosen on these rows.

Questions, each the product's ratio rule (crossgpu.predict: measured step x model(to) / model(from), the model
being the runtime's prior host time (compute.RUNTIME_PRIORS pytorch-eager: 2 ms + 20 us a kernel) smooth-maxed
with the GPU time of the committed efficiencies):
  none            nothing measured: the model alone, with its interval;
  from fp32       the same model's fp32 step on the H200 -> its tf32 / amp / bf16 step (another precision);
  from A100       the same model's A100-40GB step in ../shared/public-throughput/steptime_ryujaehun.csv (batch
                  12, forward + backward, no optimizer; its fp32 is TF32, its fp16 pure .half()) -> the H200 at
                  the training batch (another GPU, another batch, another script);
  naive           the A100 step x the ratio of the datasheets' peak at the precision (batch x12 / 12 linear).
Profiles: bench/torchvision_work.json (the project's profiler, per example). Prints each row and the mean error.

    python bench/h200_heldout.py
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cross_gpu_torchvision import TABLE, eager_kernels, load_work  # noqa: E402

from orchestrator.costmodel.compute import RUNTIME_PRIORS  # noqa: E402
from orchestrator.costmodel.crossgpu import (  # noqa: E402
    arch_gpu,
    layer_seconds,
    load_efficiencies,
    none_interval,
    smooth_max,
)

ROWS = ROOT / "data" / "measurements" / "raw" / "h200-training-steps-2026-11-28.jsonl"
A100 = "A100-40GB-SXM"


def main() -> int:
    eff = load_efficiencies()
    work, kernels = load_work(), eager_kernels()
    prior = RUNTIME_PRIORS["pytorch-eager"]
    rows = [r for r in map(json.loads, ROWS.read_text().splitlines()) if "step_ms" in r]
    a100 = {}
    if TABLE.exists():
        with TABLE.open(newline="") as fh:
            for r in csv.DictReader(fh):
                if r["gpu"] == A100 and r["num_gpus"] == "1":
                    a100[(r["model"].removeprefix("tv-"), "amp" if r["precision"].startswith("fp16") else
                          r["precision"])] = float(r["median_ms"])

    def model_ms(name: str, gpu: str, precision: str, batch: int, optimizer: bool = True) -> float:
        w = work[name]
        c, m, wt = layer_seconds(w, arch_gpu(gpu), precision, eff)
        gpu_s = float(batch * np.maximum(c, m).sum() + (wt.sum() if optimizer else 0.0))
        host_s = prior.overhead_s + prior.overhead_per_kernel_s * kernels[name]
        return 1e3 * smooth_max(host_s, gpu_s)

    errs: dict[str, list[float]] = {"none": [], "from fp32": [], "from A100": [], "naive": []}
    inside = {"none": 0, "from fp32": 0}
    print(f"{'model':13} {'batch':>5} {'prec':5} {'measured':>9} {'none':>8} {'from fp32':>10} {'from A100':>10} "
          f"{'naive':>8}  (ms; error in %)")
    fp32 = {(r["model"], r["batch_per_gpu"]): r["step_ms"] for r in rows if r["precision"] == "fp32"}
    for r in rows:
        name, b, p, meas = r["model"].removeprefix("tv-"), int(r["batch_per_gpu"]), r["precision"], r["step_ms"]
        cells = []
        none = model_ms(name, "h200", p, b)
        rel = none_interval(eff)
        errs["none"].append(none / meas - 1)
        inside["none"] += none / (1 + rel) <= meas <= none * (1 + rel)
        cells.append(f"{none:8.1f} {100 * (none / meas - 1):+5.0f}%")
        base = fp32.get((r["model"], r["batch_per_gpu"]))
        if base is not None and p != "fp32":
            pred = base * model_ms(name, "h200", p, b) / model_ms(name, "h200", "fp32", b)
            w = eff.width("other-gpu-precision", 0)
            errs["from fp32"].append(pred / meas - 1)
            inside["from fp32"] += pred / (1 + w) <= meas <= pred * (1 + w)
            cells.append(f"{pred:8.1f} {100 * (pred / meas - 1):+5.0f}%")
        else:
            cells.append(f"{'-':>15}")
        src_p = "fp32" if p in ("fp32", "tf32") else "amp"
        src = a100.get((name, src_p))
        if src is not None:
            pred = src * model_ms(name, "h200", p, b) / model_ms(name, "a100", "tf32" if src_p == "fp32" else "amp",
                                                                  12, optimizer=False)
            naive = src * (b / 12) * arch_gpu("a100").tensor_peak("tf32" if src_p == "fp32" else "amp") / \
                arch_gpu("h200").tensor_peak(p)
            errs["from A100"].append(pred / meas - 1)
            errs["naive"].append(naive / meas - 1)
            cells.append(f"{pred:8.1f} {100 * (pred / meas - 1):+5.0f}%  "
                         f"{naive:7.1f} {100 * (naive / meas - 1):+5.0f}%")
        print(f"{name:13} {b:5} {p:5} {meas:9.2f} " + "  ".join(cells))
    print()
    for k, v in errs.items():
        if v:
            extra = f", {inside[k]} of {len(v)} inside the interval" if k in inside else ""
            print(f"{k:10} mean |error| {100 * statistics.fmean(abs(x) for x in v):5.1f}% over {len(v)} rows "
                  f"(worst {100 * max(v, key=abs):+.0f}%){extra}")
    print(f"held out: all {len(rows)} H200 rows (no H200 row is in any fit); the A100 rows are the public table's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
