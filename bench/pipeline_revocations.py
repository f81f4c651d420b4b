"""Data parallel, pipeline and hybrid under revocations: the planner's analytic expectation beside the Monte Carlo.

For each example spec (its pinned cluster, spot workers): every strategy the planner weighs, simulated ``--runs``
times under the revocation model fitted to the 2019 GCE preemption trace (``orchestrator simulate``'s default
bathtub fit; GPU types the trace lacks use the pooled fit). A data parallel world pauses to re-form and its
survivors train on; a pipeline needs every stage, so a lost stage stops it: ``wait`` until the replacement is back
and restored (what the pipeline job does), or ``auto``: re-partition over the survivors where
``costmodel.stage_loss`` predicts it cheaper (the daemon decides the same way under ``policy.stage_loss: auto``).

These are PREDICTIONS of the cost model and the revocation model, not measured runs; the analytic column is what
``plan --json`` gives as each strategy's ``expected_hours`` / ``expected_usd``. Budget and deadline do not cut runs.

    python bench/pipeline_revocations.py [--runs 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.model.spec.load import load_spec  # noqa: E402
from orchestrator.sim.strategies import compare_strategies  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = ["examples/plan/gpt-1.5b-pipeline.yaml", "examples/gce-resnet-data-parallel.yaml"]


def _h(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _usd(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"Monte Carlo: {args.runs} runs per strategy, seed {args.seed}; predictions, not measurements")
    head = (f"{'strategy':<9}{'stage loss':<11}{'plan h':>8}{'plan $':>9}{'sim h mean':>11}{'p90':>8}"
            f"{'sim $ mean':>11}{'p90':>9}{'revoc.':>8}")
    for example in EXAMPLES:
        spec = load_spec(REPO / example)
        print(f"\n{example} ({spec.training.profile_name}, {spec.training.train_steps} steps)\n{head}")
        for o in compare_strategies(spec, args.runs, args.seed):
            d = o.to_dict()
            loss = "" if o.strategy == "data" else o.stage_loss
            if not o.fits:
                print(f"{o.strategy:<9}{loss:<11}  does not fit: {o.detail[:90]}")
                continue
            print(f"{o.strategy:<9}{loss:<11}{_h(d.get('plan_expected_hours')):>8}{_usd(d.get('plan_expected_usd')):>9}"
                  f"{d['hours']['mean']:>11.3f}{d['hours']['p90']:>8.3f}{d['usd']['mean']:>11.2f}{d['usd']['p90']:>9.2f}"
                  f"{d['revocations_mean']:>8.2f}")


if __name__ == "__main__":
    main()
