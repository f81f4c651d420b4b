"""A running job that re-splits its batch against static splits, on the same emulated cluster and slowdown.

examples/local-torch-resplit.yaml (three emulated GPU types, synchronous DDP, global batch 96; the V100 slows
2x at step 150) is launched for real on the local provider three times:

1. **re-split**: the built-in job times each rank's compute every ``resplit_every`` steps and moves examples
   from slow ranks to fast ones (jobs/torchjob/rebalance.py);
2. **static, planned**: ``resplit_every: 0``, the planner's split all run long (what the product did before);
3. **static, best after the slowdown**: ``resplit_every: 0`` with each worker pinned to the batch the re-split
   run settled on (an oracle: it knows the slowdown before it happens, so it is the best static split for the
   slowed phase and the one the re-split run is racing).

Nothing here checks a model: each figure is a measured throughput of a real run (examples/s from the
workers' own metrics), so no run is the truth of another's prediction. The host is shared, so compare the
runs of one invocation only (the table prints the load average at each start), and read ``after/before``
first: each run's throughput after the slowdown over its own before it, which a busier host moves less.

    python bench/resplit.py [--steps N] [--slow-at STEP] [--factor F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "local-torch-resplit.yaml"


def orchestrator(args: list[str], home: Path, check: bool = True) -> str:
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "ORCHESTRATOR_DB_URL": f"sqlite:///{home / 'results.db'}"}
    out = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=home, env=env, text=True,
                         capture_output=True, check=False)
    if check and out.returncode != 0:
        raise SystemExit(f"orchestrator {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


def run(doc: dict[str, Any], home: Path, slow_at: int) -> dict[str, Any]:
    home.mkdir(parents=True)
    doc = {**doc, "storage": str(home / "runs")}
    spec = home / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    load = os.getloadavg()[0]
    orchestrator(["launch", str(spec), "--quiet"], home)
    report = json.loads(orchestrator(["report", "--format", "json"], home))[0]
    from sqlalchemy import create_engine, text

    with create_engine(f"sqlite:///{home / 'results.db'}").connect() as conn:
        steps = conn.execute(text("SELECT step, examples_per_s, at FROM metrics WHERE kind = 'step' "
                                  "ORDER BY at")).all()
    settle = slow_at + 3 * int(doc["training"].get("resplit_every") or 20)
    before = [e for s, e, _ in steps if 20 < s <= slow_at and e]
    after = [e for s, e, _ in steps if s > settle and e]
    first, last = steps[0][2], steps[-1][2]
    return {"load": load, "wall_s": report["wall_time_s"], "train_s": last - first,
            "before": sum(before) / max(len(before), 1), "after": sum(after) / max(len(after), 1),
            "resplits": report["resplits"], "batches": report["worker_batches"], "accuracy": report["accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--slow-at", type=int, default=150)
    ap.add_argument("--factor", type=float, default=2.0)
    args = ap.parse_args()
    base = yaml.safe_load(EXAMPLE.read_text())
    base["training"]["train_steps"] = args.steps
    base["provider"]["slowdowns"] = [{"worker": 0, "at_step": args.slow_at, "factor": args.factor}]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-resplit-") as tmp:
        results["re-split"] = run(base, Path(tmp) / "resplit", args.slow_at)
        static = {**base, "training": {**base["training"], "resplit_every": 0}}
        results["static, planned"] = run(static, Path(tmp) / "planned", args.slow_at)
        settled = {int(k): v["reported"] for k, v in results["re-split"]["batches"].items()}
        # Per-group batches take effect without training.global_batch (which the planner would split itself).
        training = {k: v for k, v in static["training"].items() if k != "global_batch"}
        groups = [{**g, "batch": settled[i]} for i, g in enumerate(base["cluster"]["workers"])]
        pinned = {**static, "training": training, "cluster": {"workers": groups}}
        results["static, best after slowdown"] = run(pinned, Path(tmp) / "best", args.slow_at)
    print(f"{EXAMPLE.name}: {args.steps} steps, worker 0 (V100) slows {args.factor:g}x at step {args.slow_at}; "
          f"global batch {base['training']['global_batch']}")
    print(f"{'run':<30}{'load':>6}{'train s':>9}{'ex/s before':>13}{'ex/s after':>12}{'after/before':>14}"
          f"{'re-splits':>11}  final batches")
    ref = results["static, planned"]
    for name, r in results.items():
        batches = "/".join(str(v["reported"]) for _, v in sorted(r["batches"].items()))
        print(f"{name:<30}{r['load']:>6.1f}{r['train_s']:>9.1f}{r['before']:>13.1f}{r['after']:>12.1f}"
              f"{r['after'] / r['before']:>14.2f}{len(r['resplits']):>11}  {batches}")
    for name, r in results.items():
        if r is not ref:
            print(f"{name}: after the slowdown {r['after'] / ref['after'] - 1:+.1%} examples/s and "
                  f"{r['train_s'] / ref['train_s'] - 1:+.1%} training time against the planned static split")
    for r in results["re-split"]["resplits"]:
        print(f"  re-split at step {r['step']}: {r['previous']} -> {r['batches']} (compute s {r['compute_s']})")


if __name__ == "__main__":
    main()
