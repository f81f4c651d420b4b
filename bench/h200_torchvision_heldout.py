"""A fifth GPU for the torchvision table, held out: the H200, timed on 2026-11-28 by the table's own protocol.

data/measurements/raw/h200-torchvision-b12-2026-11-28.jsonl (bench/gpu/torchvision_steps.py on one lent NVIDIA
H200, torch 2.11.0+cu130, cuDNN 9.19, two calls): ../shared/public-throughput/steptime_ryujaehun.csv's protocol
(batch 12 of 224x224 images copied from the host each step, zero_grad + forward + cross-entropy + backward, no
optimizer step, cudnn.benchmark, median of 50 after 5), for 20 of its 32 models in fp32 (TF32 allowed, the table's
A100 convention: the "tf32" class) and 5 in pure fp16 ("amp"); the device time ran out before the other fp16 rows.
Where a model x precision was timed twice (mobilenet_v2 fp16, once per call) the first is used; the second is
printed beside it.

Questions: every ordered pair (table GPU -> H200, H200 -> table GPU) of one model at one precision, by the
predictors of bench/cross_gpu_torchvision.py, on the table's rows plus these:
  shipped             nothing fitted: the runtime's prior host time smooth-maxed with the committed GPU time.
  calibrated A-model  `model predict --torch M --measurements FILE` (host_fit) with FILE = every row of every GPU,
                      the H200's included, but M's, plus M's one row on the measured GPU: the H200 has a fit of
                      its own from its other models (the user timed some models on it).
  calibrated A        as A-model without M's whole sub-family.
  calibrated B        FILE without M's sub-family and without the target GPU's rows: into the H200, no H200 row
                      at all (it takes its architecture's fit, else the other machines' host, host_fit.fit_for:
                      the product's case of a GPU the user never ran on); out of it, the H200's other
                      sub-families' rows stay and the table GPU is the one never measured.
Held out: the H200's rows are in no committed fit (data/crossgpu_fit.json has no Hopper); the fits above are made
per question without the question's model (or sub-family). Caveat printed below: the H200's software (torch 2.11,
2026) and host CPU are not the table's (PyTorch of 2019-21), so the host time per layer differs by machine AND
software; the fits see that only through the rows.

    python bench/h200_torchvision_heldout.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cross_gpu_torchvision import (  # noqa: E402
    PRECISIONS,
    Row,
    _mean,
    _table,
    eager_kernels,
    evaluate,
    load_rows,
    load_work,
    summary,
)

from orchestrator.costmodel.crossgpu import FITTED_KIND, load_efficiencies  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ROWS = ROOT / "data" / "measurements" / "raw" / "h200-torchvision-b12-2026-11-28.jsonl"
GPU = "h200"
SHOWN = ("naive", "shipped", "calibrated A-model", "calibrated A-model whole ratio", "calibrated A", "calibrated B")


def load_h200(path: Path = ROWS) -> tuple[list[Row], dict[tuple[str, str], list[float]]]:
    """The first timing of each model x precision as a Row; every timing (ms) by (model, precision)."""
    seen: dict[tuple[str, str], list[float]] = {}
    rows = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if "median_ms" not in r:
            continue
        key = (r["model"].removeprefix("tv-"), PRECISIONS[r["precision"]])
        if key not in seen:
            rows.append(Row(key[0], GPU, key[1], float(r["median_ms"]) / 1e3))
        seen.setdefault(key, []).append(float(r["median_ms"]))
    return rows, seen


def main() -> int:
    work, kernels = load_work(), eager_kernels()
    h200, timings = load_h200()
    table = [r for r in load_rows() if r.model in work]
    models = {r.model for r in h200}
    rows = [r for r in table if r.model in models] + h200
    results = evaluate(rows, work, kernels)
    ours = {n: [q for q in results[n] if GPU in (q["from"], q["to"])] for n in SHOWN}
    print(f"{len(h200)} H200 rows ({sum(r.precision == 'tf32' for r in h200)} fp32/TF32, "
          f"{sum(r.precision == 'amp' for r in h200)} fp16) x the table's 4 GPUs: {len(ours[SHOWN[0]])} questions "
          "into or out of the H200")
    for (m, p), ms in timings.items():
        if len(ms) > 1:
            print(f"  timed twice: {m} {p}: {ms[0]:.3f} ms (used), {ms[1]:.3f} ms ({ms[1] / ms[0] - 1:+.1%})")
    s = {n: summary(qs) for n, qs in ours.items()}
    counts = s[SHOWN[0]]["pair_n"]
    _table("mean |error| by ordered GPU pair x precision (n questions)", ["pair", "n", *SHOWN],
           [[k, counts[k], *(f"{s[n]['pairs'][k]:.1%}" for n in SHOWN)] for k in sorted(counts)])
    for n in ("calibrated A-model", "calibrated B"):
        worst = sorted(ours[n], key=lambda q: -abs(q["err"]))[:6]
        _table(f"worst 6 ({n})", ["from", "to", "precision", "model", "err"],
               [[q["from"], q["to"], q["precision"], q["model"], f"{q['err']:+.1%}"] for q in worst])
    print("\nSUMMARY (questions into or out of the H200; goal < 10% mean and every pair x precision < 15%)")
    for n in SHOWN:
        into = [q for q in ours[n] if q["to"] == GPU]
        print(f"  {n:<30} mean {s[n]['mean']:.1%} (into the H200 {_mean(into):.1%}); pairs under 15%: "
              f"{s[n]['pairs_under_15pct']}/{len(s[n]['pairs'])}; worst pair {s[n]['worst_pair']:.1%}; "
              f"goal {'MET' if s[n]['met'] else 'NOT met'}")
    eff = load_efficiencies()
    widths = {"calibrated A-model": FITTED_KIND, "calibrated A": FITTED_KIND, "calibrated B": "other-gpu"}
    print("\nINTERVALS (what `model predict --torch --measurements` prints for these questions; widths from "
          "the public tables, never from the H200):")
    for n, kind in widths.items():
        w = eff.width(kind, 0.0)
        inside = sum(abs(math.log1p(q["err"])) <= math.log1p(w) for q in ours[n])
        print(f"  {n:<30} kind {kind:<17} +-{w:.1%}: {inside} of {len(ours[n])} inside ({inside / len(ours[n]):.0%}; "
              "an 80% interval should hold about 80%)")
    print(f"  held out: every H200 row ({ROWS.name}); no committed fit holds a Hopper row. The H200 ran torch 2.11 "
          "(2026) on its own host, the table's GPUs PyTorch of 2019-21 on theirs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
