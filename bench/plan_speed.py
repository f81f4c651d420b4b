"""Planner speed: 3 GPU types x 1-8 workers x 1-3 PS x 3 zones x spot/on-demand (target: < 1 s).

Run: python bench/plan_speed.py [--repeat N]. Prints the wall time of ``plan()`` for the homogeneous
search space and for the same space with mixed GPU pairs and triples (``search.mixed: true``).
"""

from __future__ import annotations

import argparse
import time

from orchestrator.costmodel import plan
from orchestrator.costmodel.compute import layer_arrays
from orchestrator.model.spec import validate_spec


def bench_spec(mixed: bool) -> dict[str, object]:
    return {
        "name": "plan-bench",
        "provider": {
            "kind": "gce",
            "project": "bench-project",
            "zones": ["us-central1-c", "us-west1-b", "us-east1-c"],
        },
        "training": {
            "job": "resnet-cifar",
            "hparam_set": "resnet_cifar_32",
            "mode": "async",
            "train_steps": 64000,
            "batch_per_worker": 128,
        },
        "search": {
            "gpus": ["t4", "l4", "v100"],  # GCE retired the K80 and P100: today's GPUs
            "min_workers": 1,
            "max_workers": 8,
            "max_ps": 3,
            "spot": [True, False],
            "mixed": mixed,
            "objective": "cost",
        },
        "policy": {"budget_usd": 60, "deadline": "24h"},
        "pricing": {"book": "2026-11"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    layer_arrays("resnet_cifar_32")  # profile JSON load: once per process, not per plan
    for mixed in (False, True):
        spec = validate_spec(bench_spec(mixed))
        times = []
        result = None
        for _ in range(args.repeat):
            started = time.perf_counter()
            result = plan(spec)
            times.append(time.perf_counter() - started)
        assert result is not None
        label = "mixed pairs/triples" if mixed else "homogeneous"
        print(
            f"{label:20s} {len(result.candidates):5d} candidates  best {min(times) * 1e3:7.1f} ms  "
            f"worst {max(times) * 1e3:7.1f} ms  front {len(result.front)}  chosen: "
            f"{result.chosen.describe() if result.chosen else 'none'}"
        )


if __name__ == "__main__":
    main()
