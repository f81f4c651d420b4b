"""Measure this host's figures for the local provider, then check `plan` and `simulate` on held-out runs.

1. **Measure** (the baselines): the clusters of examples/local-hetero.yaml (TensorFlow, async PS) and
   examples/local-torch-hetero.yaml (PyTorch DDP, sync) with the GPU emulation off and no revocations,
   launched for real. Their workers' steps, start-up, checkpoints and teardown give this host's figures
   (``fit_local_host``: each framework's CPU step under the processor-sharing model of
   ``costmodel/host_share.py``, in lockstep for sync). ``--write`` stores them in data/local_host.csv,
   the defaults every local plan and simulation start from.
2. **Check** (held out, never fitted on): the two examples themselves (emulated K80/P100/V100 sleeps,
   uneven batches for DDP, a revocation each), launched ``--runs`` times. `orchestrator plan` and
   `orchestrator simulate`, given only the baselines' figures, predict their wall time and cost; the
   error is printed per run (issue 12's goal: within 25%).

Each run uses a fresh results DB and run folder under a temporary directory, so the user's own DB is
neither read nor written. About 1.5-3 min per launched job on a 2-core machine (~10 min with --runs 1).

    python bench/local_host.py [--runs N] [--write]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import sys
import tempfile
from pathlib import Path
from statistics import mean
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from orchestrator.costmodel.accounting import RunAccounting, fit_local_host  # noqa: E402
from orchestrator.providers.local.step_model import step_model_for  # noqa: E402
from orchestrator.store.queries import local_run_timings  # noqa: E402
from orchestrator_testing.bench_cli import orchestrator  # noqa: E402

DEMOS = [REPO / "examples" / "local-hetero.yaml", REPO / "examples" / "local-torch-hetero.yaml"]
HOST_CSV = REPO / "data" / "local_host.csv"
MEASURED = ("cpu_step_s", "torch_cpu_step_s", "startup_s", "torch_startup_s", "checkpoint_s", "torch_checkpoint_s",
            "teardown_s")


def launch(doc: dict[str, Any], home: Path) -> dict[str, Any]:
    """Launch one spec for real in its own home; its report row, local timings and checkpoint seconds."""
    home.mkdir(parents=True)
    spec = home / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    orchestrator(["launch", str(spec)], home)
    report = json.loads(orchestrator(["report", "--format", "json"], home))[0]
    engine = create_engine(f"sqlite:///{home / 'results.db'}")
    with Session(engine) as session:
        runs = local_run_timings(session)
        ckpt = session.execute(text("select step_time_s from metrics where kind = 'checkpoint' and step < :last"),
                               {"last": doc["training"]["train_steps"]}).scalars().all()
    engine.dispose()
    return {"report": report, "runs": runs, "checkpoint_s": mean(map(float, ckpt)) if ckpt else None}


def baseline_doc(demo: Path) -> dict[str, Any]:
    """The demo's cluster with the GPU emulation off and no revocations: the host's CPU alone."""
    doc = yaml.safe_load(demo.read_text())
    doc["name"] = f"{doc['name']}-baseline"
    doc["provider"].update(emulation_k80_step_s=0, revocations="none")
    doc["provider"].pop("schedule", None)
    return doc


def checkpoint_pause(doc: dict[str, Any], run: dict[str, Any]) -> float:
    """What a checkpoint costs the run, not what it takes: the training phase's excess over its steps at
    the measured rate, per checkpoint, at most the checkpoint's own seconds (the async chief saves while
    the workers run the steps already queued, so there it is ~0)."""
    tr, timing = doc["training"], run["runs"][0]
    steps = [w["step_time_s"] for w in timing["workers"]]
    rate = 1.0 / max(steps) if tr.get("framework") == "pytorch" else sum(1.0 / t for t in steps)
    logged = tr["train_steps"] - tr.get("log_every", 10)  # the first logged step is step log_every
    n = RunAccounting.checkpoints(tr["train_steps"], tr["checkpoint_every"])
    excess = timing["last_step_at"] - timing["first_step_at"] - logged / rate
    return min(float(run["checkpoint_s"] or 0.0), max(0.0, excess / n)) if n else 0.0


def measure(tmp: Path) -> dict[str, float]:
    runs, ckpts = [], {}
    for i, demo in enumerate(DEMOS):
        doc = baseline_doc(demo)
        run = launch(doc, tmp / f"baseline-{i}")
        runs += run["runs"]
        ckpts[i] = checkpoint_pause(doc, run)
        steps = ", ".join(f"{w['gpu']} b{w['batch']} {w['step_time_s']:.3f}" for w in run["runs"][0]["workers"])
        print(f"baseline of {demo.name} (emulation off, no revocations): wall {run['report']['wall_time_s']:.1f} s, "
              f"worker steps {steps} s")
    host = fit_local_host(runs, step_model_for)
    host["checkpoint_s"], host["torch_checkpoint_s"] = ckpts[0], ckpts[1]  # DEMOS: TensorFlow, then PyTorch
    print(f"  -> CPU step alone: TensorFlow {host['cpu_step_s']:.3f} s (resnet_cifar_15, batch 32), PyTorch "
          f"{host['torch_cpu_step_s']:.3f} s (resnet_tiny, batch 32); start-up {host['startup_s']:.1f} / "
          f"{host['torch_startup_s']:.1f} s, checkpoint pause {host['checkpoint_s']:.2f} / "
          f"{host['torch_checkpoint_s']:.2f} s, teardown {host['teardown_s']:.1f} s")
    return host


def predict(demo: Path, host: dict[str, float], tmp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """`plan --json` and `simulate --json` of a demo, given only the baselines' figures."""
    home = tmp / "predict"
    home.mkdir(exist_ok=True)
    calib = home / "baseline-calibration.json"
    calib.write_text(json.dumps({"name": "local-baseline", "local_host": host}))
    common = ["--json", "--calibration", str(calib)]
    plan = json.loads(orchestrator(["plan", str(demo), *common], home))["chosen"]
    sim = json.loads(orchestrator(["simulate", str(demo), *common, "--runs", "100"], home))
    return plan, sim


def write_host_csv(host: dict[str, float]) -> None:
    today = dt.date.today().isoformat()
    src = f"this project's measurement, {today} (bench/local_host.py baselines)"
    with HOST_CSV.open(newline="") as fh:
        rows = {r["key"]: r for r in csv.DictReader(fh)}
    for key in MEASURED:
        rows[key]["value"], rows[key]["source"] = f"{host[key]:.3g}", src
    for key, fw in (("checkpoint_s", "TensorFlow"), ("torch_checkpoint_s", "PyTorch")):
        rows[key]["method"] = (f"the {fw} baseline's training phase less its steps at the measured rate, per "
                               "checkpoint, at most the checkpoint's own seconds: what a checkpoint costs the run")
    with HOST_CSV.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(next(iter(rows.values()))), lineterminator="\n")
        w.writeheader()
        w.writerows(rows.values())
    print(f"wrote {HOST_CSV.relative_to(REPO)}")


def check(demo: Path, host: dict[str, float], tmp: Path, runs: int) -> float:
    plan, sim = predict(demo, host, tmp)
    print(f"\n{demo.name}: plan {plan['time_s']:.1f} s ${plan['cost_usd']:.4f}; simulate {sim['time_s']['mean']:.1f} s "
          f"${sim['cost_usd']['mean']:.4f}")
    print(f"{'held-out run':>12} {'wall s':>7} {'cost $':>8} {'revoked':>7} {'plan time':>9} {'plan $':>8} "
          f"{'sim time':>8} {'sim $':>8}")
    worst = 0.0
    for i in range(runs):
        rep = launch(yaml.safe_load(demo.read_text()), tmp / f"{demo.stem}-{i}")["report"]
        t, c = rep["wall_time_s"], rep["cost_usd"]
        e = [plan["time_s"] / t - 1, plan["cost_usd"] / c - 1, sim["time_s"]["mean"] / t - 1,
             sim["cost_usd"]["mean"] / c - 1]
        worst = max([worst, *map(abs, e)])
        print(f"{i + 1:>12} {t:7.1f} {c:8.4f} {rep['revocations']:7d} " + " ".join(f"{x:+8.1%}" for x in e))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=1, help="held-out launches of each demo")
    ap.add_argument("--write", action="store_true", help="store the baselines' figures in data/local_host.csv")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="local-host-") as d:
        tmp = Path(d)
        host = measure(tmp)
        if args.write:
            write_host_csv(host)
        worst = max(check(demo, host, tmp, args.runs) for demo in DEMOS)
        print(f"\nlargest error: {worst:.1%} (goal: within 25%)")


if __name__ == "__main__":
    main()
