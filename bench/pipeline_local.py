"""A pipeline on the local provider, measured: its step against the partitioner's prediction, mini-max against
equal-layers stages on the same emulated GPUs, and its accuracy against the data-parallel run.

examples/local-pipeline.yaml (ResNet, three emulated GPU types: V100, P100, K80), without its revocation, is
launched for real three times: ``partition: mini-max`` (stages sized to each GPU), ``partition: equal-layers``
(as many units each, the heterogeneity-blind baseline) and ``parallelism: data`` (DDP, the same global batch).

The prediction is the partitioner's ``(micro-batches + stages - 1) x slowest stage``, where a stage's time comes
from the emulated GPUs' measured step curves (providers/local/emulation.py, from data/measurements) and this host's
CPU step (data/local_host.csv), spread over the stage's layers by FLOPs. The measurement is the median window step
time of the real run (torch.distributed.pipelining over gloo, real sleeps, real CPU), after its first 20 steps; no
figure of a run is fitted to another. The host is shared: the load average at each start is printed.

    python bench/pipeline_local.py [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.costmodel.pipeline_plan import plan_pipeline  # noqa: E402
from orchestrator.model.spec import validate_spec  # noqa: E402
from orchestrator.providers.local.step_model import step_model_for  # noqa: E402
from orchestrator_testing.bench_cli import orchestrator  # noqa: E402

EXAMPLE = REPO / "examples" / "local-pipeline.yaml"


def run(doc: dict[str, Any], home: Path) -> dict[str, Any]:
    home.mkdir(parents=True)
    doc = {**doc, "storage": str(home / "runs")}
    (home / "spec.yaml").write_text(yaml.safe_dump(doc))
    load = os.getloadavg()[0]
    orchestrator(["launch", str(home / "spec.yaml"), "--quiet"], home)
    report = json.loads(orchestrator(["report", "--format", "json"], home))[0]
    from sqlalchemy import create_engine, text

    with create_engine(f"sqlite:///{home / 'results.db'}").connect() as conn:
        rows = conn.execute(text("SELECT step, examples_per_s FROM metrics WHERE kind = 'step' AND step > 20")).all()
    steps = [doc["training"]["global_batch"] / e for _, e in rows if e]
    return {"load": load, "step_s": statistics.median(steps), "accuracy": report["accuracy"],
            "wall_s": report["wall_time_s"]}


def predicted(doc: dict[str, Any]) -> float:
    spec = validate_spec(doc)
    workers = [(i, g["gpu"], "local") for i, g in enumerate(doc["cluster"]["workers"])]
    found = plan_pipeline(spec, workers, doc["training"]["global_batch"], steps=step_model_for(spec))
    assert found is not None
    return found.step_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    base = yaml.safe_load(EXAMPLE.read_text())
    base["provider"]["revocations"], base["provider"]["schedule"] = "none", []
    base["training"]["train_steps"] = args.steps
    variants = {
        "pipeline, mini-max": {**base, "training": {**base["training"], "partition": "mini-max"}},
        "pipeline, equal-layers": {**base, "training": {**base["training"], "partition": "equal-layers"}},
        "data parallel": {**base, "training": {**base["training"], "parallelism": "data"}},
    }
    print(f"{EXAMPLE.name} without its revocation: {args.steps} steps, global batch "
          f"{base['training']['global_batch']}, GPUs {[g['gpu'] for g in base['cluster']['workers']]}")
    print(f"{'run':<26}{'load':>6}{'predicted s':>13}{'measured s':>12}{'error':>8}{'accuracy':>10}{'wall s':>8}")
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        for k, (name, doc) in enumerate(variants.items()):
            r = run(doc, Path(tmp) / str(k))
            pred = predicted(doc) if doc["training"]["parallelism"] == "pipeline" else None
            err = f"{r['step_s'] / pred - 1:+.1%}" if pred else "—"
            shown = f"{pred:.3f}" if pred else "—"
            print(f"{name:<26}{r['load']:>6.1f}{shown:>13}{r['step_s']:>12.3f}{err:>8}{r['accuracy']:>10.3f}"
                  f"{r['wall_s']:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
