"""A running job that re-splits its batch against static splits, on the same emulated cluster and slowdown.

examples/local-torch-resplit.yaml (V100 + P100 + K80 emulated on the local provider, synchronous DDP, global
batch 96), shortened, with worker 0 (the V100) slowing 2x at ``--slow-at``, is launched for real:

1. **re-split**: the built-in job times each rank's compute every ``--resplit-every`` steps and moves examples
   from slow ranks to fast ones (jobs/torchjob/rebalance.py);
2. **static, planned**: ``resplit_every: 0``, the planner's split all run long (what the product did before);
3. **static, best found**: the same run with the fastest of the static splits tried (each a short real run
   slowed from step 0): the split the re-split run settled on and its neighbours (``--move`` examples moved
   between each pair of ranks). It knows the slowdown before it happens: the static split the re-split races.

What is emulated and what is held out (printed with the table):
- Each worker's GPU is a sleep per step (orchestrator/providers/local/emulation.py): the measured H100 ResNet-32 batch
  curve (data/measurements) read at the batch of equal work, with each GPU's step at batch 128 from the ICAC'19
  traces, so a K80 / P100 / V100 step grows with its batch and falls to the per-step overhead at a small one.
  The real CPU forward + backward of each rank's slice runs on top, on this shared host.
- The re-split policy never reads that curve: each rank times its own forward + backward at its current batch
  and adds its device's time at that batch (what a device sync measures on a GPU), and the ranks move examples
  in proportion to those measured speeds. Nothing is fitted to these runs: each figure is the throughput the
  workers measured (examples/s of the global batch per logging window), so no run is another's prediction.
- The host is shared: compare the runs of one invocation only (each row prints the load average at its start);
  the re-split run is repeated last to show how much the host moved it. The emulated GPUs' time scale
  (``--k80-s``, default 1 s for a K80 at the reference batch) keeps their time well above the CPU step's.

    python bench/resplit.py [--steps N] [--slow-at STEP] [--factor F] [--resplit-every N] [--trial-steps N]
                            [--move N] [--k80-s S]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "local-torch-resplit.yaml"
sys.path.insert(0, str(REPO))

from orchestrator_testing.bench_cli import orchestrator  # noqa: E402


def spec_doc(base: dict[str, Any], steps: int, slow_at: int, factor: float, resplit_every: int,
             log_every: int, split: list[int] | None = None) -> dict[str, Any]:
    """The example with this run's steps, slowdown and split (a pinned split: per-group batches)."""
    doc: dict[str, Any] = json.loads(json.dumps(base))  # base carries the emulation's time scale (emulation_k80_step_s)
    # Boot and billing in cloud time run time_scale x faster than the wall clock: a shorter emulated boot.
    doc["provider"].update(time_scale=30, slowdowns=[{"worker": 0, "at_step": slow_at, "factor": factor}])
    doc["policy"].update(budget_usd=100, deadline="100h")  # 30x cloud time: a few minutes bill hours
    # torchrun, as its figures (README) were measured: the default for this example is torchft replica groups now,
    # which re-split by the same rule (docs/pytorch.md)
    doc["training"].update(train_steps=steps, resplit_every=resplit_every, log_every=log_every,
                           checkpoint_every=steps, fault_tolerance="torchrun")
    if split is not None:
        # Per-group batches take effect without training.global_batch (which the planner would split itself).
        del doc["training"]["global_batch"]
        doc["cluster"]["workers"] = [{**g, "batch": b} for g, b in zip(doc["cluster"]["workers"], split, strict=True)]
    return doc


def run(doc: dict[str, Any], home: Path) -> dict[str, Any]:
    """Launch one spec for real in its own home; its step windows (end step, examples/s) and its report."""
    home.mkdir(parents=True)
    doc = {**doc, "storage": str(home / "runs")}
    spec = home / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    load = os.getloadavg()[0]
    orchestrator(["launch", str(spec), "--quiet"], home)
    report = json.loads(orchestrator(["report", "--format", "json"], home))[0]
    from sqlalchemy import create_engine, text

    with create_engine(f"sqlite:///{home / 'results.db'}").connect() as conn:
        steps = [(int(s), float(e)) for s, e in conn.execute(text(
            "SELECT step, examples_per_s FROM metrics WHERE kind = 'step' AND examples_per_s > 0 ORDER BY at")).all()]
    batches = [v["reported"] for _, v in sorted(report["worker_batches"].items(), key=lambda kv: int(kv[0]))]
    return {"load": load, "steps": steps, "resplits": report["resplits"], "batches": batches}


def mean_rate(steps: list[tuple[int, float]], after: int, upto: int | None = None) -> float:
    """Mean examples/s of the logging windows that start at or after step ``after`` (and end by ``upto``)."""
    rates = [e for s, e in steps if s > after and (upto is None or s <= upto)]
    return sum(rates) / len(rates) if rates else float("nan")


def neighbours(split: list[int], move: int) -> list[list[int]]:
    """The split with ``move`` examples moved from one rank to another, for every ordered pair of ranks."""
    out = []
    for i in range(len(split)):
        for j in range(len(split)):
            if i != j and split[i] - move >= 1:
                new = list(split)
                new[i] -= move
                new[j] += move
                out.append(new)
    return out


def emulated_table(base: dict[str, Any], gpus: list[str]) -> str:
    """The emulation's seconds per step by batch (what the policy never reads), for the output."""
    from orchestrator.providers.local.emulation import emulated_step_s

    k80 = float(base["provider"]["emulation_k80_step_s"])
    ref = base["training"]["global_batch"] / len(gpus)
    cols = (1, 8, 16, 32, 48, 64)
    lines = ["  emulated GPU s/step by batch " + " ".join(f"{b:>6}" for b in cols)]
    for g in gpus:
        lines.append(f"  {g:<28}" + " ".join(f"{emulated_step_s(g, b, k80, ref):>6.3f}" for b in cols))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--slow-at", type=int, default=30)
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--resplit-every", type=int, default=10)
    ap.add_argument("--settle", type=int, default=40, help="steps after the slowdown before 'after' is read")
    ap.add_argument("--trial-steps", type=int, default=30, help="steps of each static split tried (slowed from 0)")
    ap.add_argument("--move", type=int, default=3, help="examples moved between two ranks for a neighbour split")
    ap.add_argument("--k80-s", type=float, default=1.0,
                    help="emulation_k80_step_s: the emulated GPUs' time scale, well above this host's CPU step")
    args = ap.parse_args()
    base = yaml.safe_load(EXAMPLE.read_text())
    base["provider"]["emulation_k80_step_s"] = args.k80_s
    gpus = [g["gpu"] for g in base["cluster"]["workers"] for _ in range(g.get("count", 1))]
    res: dict[str, dict[str, Any]] = {}
    trials: list[tuple[list[int], float, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-resplit-") as tmp:
        def main_run(name: str, every: int, split: list[int] | None = None) -> None:
            doc = spec_doc(base, args.steps, args.slow_at, args.factor, every, 10, split)
            res[name] = run(doc, Path(tmp) / name.replace(" ", "-").replace(",", ""))

        main_run("re-split", args.resplit_every)
        settled = res["re-split"]["batches"]
        for i, split in enumerate([settled, *neighbours(settled, args.move)]):
            doc = spec_doc(base, args.trial_steps, 0, args.factor, 0, 5, split)
            r = run(doc, Path(tmp) / f"trial-{i}")
            trials.append((split, mean_rate(r["steps"], 10), r["load"]))
        main_run("static, best found", 0, max(trials, key=lambda t: t[1])[0])  # the same run, that split
        main_run("static, planned", 0)
        main_run("re-split, again", args.resplit_every)  # last: how much the shared host moved the first
    print_results(args, base, gpus, res, trials)


def print_results(args: argparse.Namespace, base: dict[str, Any], gpus: list[str], res: dict[str, dict[str, Any]],
                  trials: list[tuple[list[int], float, float]]) -> None:
    after_from = args.slow_at + args.settle
    print(f"{EXAMPLE.name}: {args.steps} steps, worker 0 ({gpus[0]}) slows {args.factor:g}x at step {args.slow_at}; "
          f"global batch {base['training']['global_batch']}; workers {' / '.join(gpus)}; "
          f"host {os.cpu_count()} cores, shared")
    print("Emulated: each GPU is a sleep from the emulation (measured H100 ResNet-32 batch curve at the batch of")
    print("equal work; K80/P100/V100 step at batch 128 from the ICAC'19 traces), plus each rank's real CPU compute.")
    print("Held out from the policy: that curve. It times its ranks at their current batch and re-splits by those")
    print("times. Nothing is fitted to these runs; every figure is the workers' own measured examples/s.")
    print(emulated_table(base, gpus) + f"  (emulation_k80_step_s {args.k80_s:g})")
    print(f"\n'after' = mean examples/s of the logging windows from step {after_from} (the slowdown + {args.settle}) "
          f"to the end; 'slowed' = from step {args.slow_at} to the end (the re-split's reaction included)")
    print(f"{'run':<22}{'load':>6}{'ex/s before':>13}{'ex/s slowed':>13}{'ex/s after':>12}{'after/before':>14}"
          f"  final batches")
    for name, r in res.items():
        before, rate = mean_rate(r["steps"], 10, args.slow_at), mean_rate(r["steps"], after_from)
        slowed = mean_rate(r["steps"], args.slow_at)
        print(f"{name:<22}{r['load']:>6.1f}{before:>13.1f}{slowed:>13.1f}{rate:>12.1f}{rate / before:>14.2f}  "
              f"{'/'.join(map(str, r['batches']))}")
    after = {name: mean_rate(r["steps"], after_from) for name, r in res.items()}
    planned, best = after["static, planned"], after["static, best found"]
    print()
    for name in ("re-split", "re-split, again"):
        rs = after[name]
        print(f"after the slowdown, {name}: {rs / planned - 1:+.1%} examples/s against the planned static split, "
              f"{rs / best - 1:+.1%} against the best static split found")
    print(f"\nstatic splits tried for 'best found' ({len(trials)}: the re-split's final split and its neighbours, "
          f"{args.move} examples moved; each {args.trial_steps} steps slowed from step 0, windows after step 10):")
    for split, rate, load in trials:
        print(f"  {'/'.join(map(str, split)):<12} {rate:8.1f} ex/s  (load {load:.1f})")
    print("\nre-splits of the re-split run (step: batches by worker, from; each rank's measured compute s):")
    for r in res["re-split"]["resplits"]:
        by = "/".join(str(r["batches"][k]) for k in sorted(r["batches"], key=int))
        was = "/".join(str(r["previous"][k]) for k in sorted(r["previous"], key=int))
        secs = "/".join(f"{r['compute_s'][k]:.3f}" for k in sorted(r["compute_s"], key=int))
        print(f"  step {r['step']:>4}: {by:<10} from {was:<10} compute s {secs}")


if __name__ == "__main__":
    main()
