"""Heterogeneous throughput on the local provider (real TensorFlow, emulated K80 / P100 / V100 speeds).

Prints:
  1. each emulated GPU type's standalone examples/s and the measured speed ratio (vs K80), next to the
     ratio the emulation is built from (measured ResNet-32 step times, orchestrator.providers.local.emulation);
  2. a 3-speed cluster's examples/s relative to the sum of its workers' standalone examples/s, for
     async parameter-server training, and for synchronous training with an equal split and with the
     split proportional to the emulated (measured) speeds.

    python bench/hetero_throughput.py [--steps 300] [--k80-step 0.4]

Stopped with SIGTERM (`kill`, `timeout`) or Ctrl-C, it tears its running job down and exits 143 / 130.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from sqlalchemy import create_engine, text

from orchestrator_testing.teardown import Children, stopped_cleanly

REPO = Path(__file__).resolve().parent.parent
GPUS = ["k80", "p100", "v100"]
CHILDREN = Children()  # the launches: stopped with the bench (SIGTERM, Ctrl-C), each tearing down its job


def run_job(tmp: Path, name: str, workers: list[str], mode: str, steps: int, k80_step: float,
            batch: str) -> tuple[float, dict[int, float]]:
    """Run one job; return the cluster's steady examples/s and each worker's."""
    wl = "".join(f"\n    - {{gpu: {g}, count: 1, spot: false}}" for g in workers)
    ps = "{count: 1}" if mode == "async" else "{count: 0}"
    spec = tmp / f"{name}.yaml"
    spec.write_text(f"""name: {name}
provider: {{kind: local, revocations: none, emulation_k80_step_s: {k80_step}}}
storage: {tmp / 'runs'}
training: {{job: resnet-cifar, hparam_set: resnet_tiny, mode: {mode}, train_steps: {steps}, {batch},
            checkpoint_every: 100000, log_every: 10}}
cluster:
  parameter_servers: {ps}
  workers:{wl}
pricing: {{book: 2019-02}}
""")
    db = tmp / f"{name}.db"
    env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{db}"}
    out = CHILDREN.run([sys.executable, "-m", "orchestrator.cli.main", "launch", str(spec), "--quiet"],
                       env=env, cwd=REPO)
    if out.returncode != 0:
        sys.exit(f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    with create_engine(f"sqlite:///{db}").connect() as conn:
        cluster = [r[0] for r in conn.execute(text(
            "SELECT examples_per_s FROM metrics WHERE kind='step' AND examples_per_s > 0 ORDER BY step"))]
        per: dict[int, list[float]] = {}
        rows = conn.execute(text("SELECT worker, examples_per_s FROM metrics WHERE kind='worker' ORDER BY step"))
        for w, eps in rows:
            per.setdefault(int(w), []).append(float(eps or 0))
    steady = cluster[2:] or cluster  # drop the warm-up windows
    return statistics.median(steady), {w: statistics.median(v[2:] or v) for w, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--k80-step", type=float, default=0.4, help="emulated K80 seconds per step at batch 32")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-hetero-"))
    with stopped_cleanly(CHILDREN, tmp / "home"):
        measure(args, tmp)


def measure(args: argparse.Namespace, tmp: Path) -> None:
    from orchestrator.costmodel.slots import worker_batches
    from orchestrator.model.spec import validate_spec
    from orchestrator.providers.local.emulation import emulated_step_s
    from orchestrator.providers.local.step_model import step_model_for

    alone: dict[str, float] = {}
    for g in GPUS:
        _, per = run_job(tmp, f"alone-{g}", [g], "async", args.steps // 2, args.k80_step, "batch_per_worker: 32")
        alone[g] = per.get(0, 0.0)
    print("standalone (async, 1 PS, batch 32):")
    print(f"  {'gpu':5} {'examples/s':>11} {'measured ratio':>15} {'emulated ratio':>15}")
    for g in GPUS:
        print(f"  {g:5} {alone[g]:11.1f} {alone[g] / alone['k80']:15.2f} "
              f"{emulated_step_s('k80', 128, 1.0) / emulated_step_s(g, 128, 1.0):15.2f}")
    total = sum(alone.values())
    three = validate_spec({
        "name": "x", "provider": {"kind": "local"}, "training": {"mode": "sync", "global_batch": 96},
        "cluster": {"parameter_servers": {"count": 0}, "workers": [{"gpu": g} for g in GPUS]}})
    split = worker_batches(three, steps=step_model_for(three))
    runs = [
        ("async PS (batch 32 each)", "async", "batch_per_worker: 32"),
        ("sync, equal split [32, 32, 32]", "sync", "batch_per_worker: 32"),
        (f"sync, speed-proportional split {split}", "sync", "global_batch: 96"),
    ]
    print(f"3-speed cluster (k80 + p100 + v100) vs the sum of standalone examples/s ({total:.1f}):")
    for label, mode, batch in runs:
        eps, _ = run_job(tmp, f"{mode}-{'split' if 'global' in batch else 'eq'}", GPUS, mode, args.steps,
                         args.k80_step, batch)
        print(f"  {label:40} {eps:8.1f} examples/s = {eps / total:.2f} of the sum")


if __name__ == "__main__":
    main()
