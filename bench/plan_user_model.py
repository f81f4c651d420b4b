"""How well does `plan` predict a user's own model on a GPU? The planner's step time of a `torch:` model, held out.

`plan` prices a spec's `training.model: {torch: MODULE:FACTORY}` with ``stepmodel.step_fn`` under the shipped
calibration (data/calibration.json: fitted on data/measurements, whose GPU rows are the H100's CIFAR ResNets and
the 2019 study's K80 / P100 / V100 TensorFlow runs). No torchvision model and no H200 or A100 row is in it, so
every question here is held out: another model, another GPU, another script.

Truth (measured, never this model's output):
  h200-train  data/measurements/raw/h200-training-steps-2026-11-28.jsonl: ResNet-50, VGG-16, MobileNet-v2
              training steps (SGD momentum, channels_last; batch 128 / 64) on a lent H200, fp32 (true FP32),
              tf32, amp, bf16: what a plan's step is.
  a100-b12    ../shared/public-throughput/steptime_ryujaehun.csv: 32 torchvision CNNs on an A100-40GB at
              batch 12, forward + backward (no optimizer step), fp32 with TF32 allowed ("tf32") and pure
              .half() ("amp").
  h200-b12    data/measurements/raw/h200-torchvision-b12-2026-11-28.jsonl: that table's protocol on the H200.

Predictors, each ``step_fn(torch:torchvision:M, gpu, calibration, runtime=..., precision=...)``:
  tf1 arch      what `plan` computed before 2026-11-28: the TF job's runtime (tf1-graph) for every job
  eager arch    the job's runtime (pytorch-eager), the op-class roofline with the committed efficiencies and
                the runtime's fitted host overhead (``stepmodel.arch_step_fn``)
  eager machine the same runtime through the calibration's machine fits (``Calibration.machines``: host_fit
                on the eager rows; ``stepmodel.machine_step_fn``), what `model predict --torch` computes

Needs torchvision (the models are profiled on the meta device; see bench/cross_gpu_torchvision.py for the
wheel and its ``sitecustomize.py``):

    python bench/plan_user_model.py
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cross_gpu_torchvision import BATCH, TABLE, load_rows  # noqa: E402
from h200_heldout import ROWS as H200_TRAIN  # noqa: E402
from h200_torchvision_heldout import load_h200  # noqa: E402

from orchestrator.costmodel.compute import DEFAULT_CALIBRATION, Calibration  # noqa: E402
from orchestrator.costmodel.crossgpu import load_efficiencies, none_interval  # noqa: E402
from orchestrator.costmodel.stepmodel import step_fn  # noqa: E402
from orchestrator.profiler.cache import torch_profile  # noqa: E402

PREDICTORS = ("tf1 arch", "eager arch", "eager machine")


def questions() -> list[tuple[str, str, str, int, str, float]]:
    """(set, model, gpu, batch, precision, measured ms): the H200's training steps, the H200's b12 rows (each
    model x precision's first timing, as bench/h200_torchvision_heldout.py reads them) and the public table's
    A100 rows (as bench/cross_gpu_torchvision.py reads them)."""
    out = []
    for line in H200_TRAIN.read_text().splitlines():
        r = json.loads(line)
        if "step_ms" in r:
            out.append(("h200-train", r["model"].removeprefix("tv-"), "h200", int(r["batch_per_gpu"]),
                        r["precision"], float(r["step_ms"])))
    b12 = load_h200()[0] + ([r for r in load_rows() if r.gpu == "a100"] if TABLE is not None else [])
    out += [(f"{r.gpu}-b12", r.model, r.gpu, BATCH, r.precision, 1e3 * r.step_s) for r in b12]
    return out


def predict(which: str, model: str, gpu: str, batch: int, precision: str, calib: Calibration,
            bare: Calibration) -> float:
    name = f"torch:torchvision:{model}"
    if which == "tf1 arch":
        return 1e3 * step_fn(name, gpu, bare, runtime="tf1-graph", precision=precision).at(float(batch))
    use = calib if which == "eager machine" else bare
    return 1e3 * step_fn(name, gpu, use, runtime="pytorch-eager", precision=precision).at(float(batch))


def main() -> int:
    calib = DEFAULT_CALIBRATION
    if not calib.machines:
        print("data/calibration.json has no machine fits: rewrite it with `orchestrator model calibrate "
              "data/measurements --out data/calibration.json`")
        return 1
    bare = replace(calib, machines={})
    print(f"calibration: {calib.name}; machine fits "
          + ", ".join(f"{rt} {g}/{p} ({f.points} rows)" for rt, fits in calib.machines.items()
                      for (g, p), f in fits.items()))
    print("held out: every row below (no torchvision model, no A100 or H200 row in the calibration)\n")
    qs = questions()
    for m in sorted({q[1] for q in qs}):
        torch_profile(f"torchvision:{m}")  # registers torch:torchvision:M for step_fn
    errs: dict[tuple[str, str, str], list[float]] = {}
    rows = []
    for s, m, g, b, p, ms in qs:
        preds = [predict(w, m, g, b, p, calib, bare) for w in PREDICTORS]
        for w, v in zip(PREDICTORS, preds, strict=True):
            errs.setdefault((s, p, w), []).append(v / ms - 1)
        if s == "h200-train":
            rows.append(f"  {m:13} {g:5} {b:5} {p:5} {ms:9.1f} " + " ".join(
                f"{v:9.1f} {100 * (v / ms - 1):+5.0f}%" for v in preds))
    print("h200-train, each row (ms)")
    print(f"  {'model':13} {'gpu':5} {'batch':>5} {'prec':5} {'measured':>9} "
          + " ".join(f"{w:>16}" for w in PREDICTORS))
    print("\n".join(rows))
    print("\nmean |error| per set x precision (rows)")
    print(f"  {'set':10} {'prec':5} {'n':>3} " + " ".join(f"{w:>14}" for w in PREDICTORS))
    for s, p in sorted({(k[0], k[1]) for k in errs}):
        n = len(errs[(s, p, PREDICTORS[0])])
        print(f"  {s:10} {p:5} {n:3} " + " ".join(
            f"{100 * statistics.fmean(abs(x) for x in errs[(s, p, w)]):13.1f}%" for w in PREDICTORS))
    print(f"  {'all':10} {'':5} {len(qs):3} " + " ".join(
        f"{100 * statistics.fmean(abs(x) for k, v in errs.items() if k[2] == w for x in v):13.1f}%"
        for w in PREDICTORS))
    rel = none_interval(load_efficiencies())  # the interval `plan` prints for a model measured nowhere
    print(f"\ninside the plan's interval (kind none, +-{100 * rel:.0f}%): " + ", ".join(
        f"{w} {sum(1 / (1 + rel) <= 1 + x <= 1 + rel for k, v in errs.items() if k[2] == w for x in v)} of "
        f"{len(qs)}" for w in PREDICTORS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
