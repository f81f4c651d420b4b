"""Planner speed: 3 GPU types x 1-8 workers x 1-3 PS x 3 zones x spot/on-demand (target: < 1 s), and the CPU
seconds of whole commands (issue 52: `orchestrator plan examples/local-hetero.yaml` at most 1.5 s, `orchestrator
launch --dry-run examples/gce-current-gpus.yaml` at most 2 s), each a fresh process beside a bare `python -c
pass` in the same run.

Run: python bench/plan_speed.py [--repeat N]. Prints the wall time of ``plan()`` for the homogeneous
search space and for the same space with mixed GPU pairs and triples (``search.mixed: true``), then each
command's CPU time (user + system of the child; not wall time: `plan` of a local spec sleeps 0.5 s to measure the
host's load), the median over the repeats, with a fresh results DB (no stored calibration) and a fresh home whose
revocation-fit cache the first run fills (its figure is printed beside the median).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from orchestrator.costmodel import plan
from orchestrator.costmodel.compute import layer_arrays
from orchestrator.model.spec import validate_spec
from orchestrator_testing.gce_emulator import GceEmulator

REPO = Path(__file__).resolve().parent.parent
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "plan examples/local-hetero.yaml": [sys.executable, "-m", "orchestrator.cli.main", "plan",
                                        str(REPO / "examples" / "local-hetero.yaml")],
    "launch --dry-run examples/gce-current-gpus.yaml": [
        sys.executable, "-m", "orchestrator.cli.main", "launch", "--dry-run",
        str(REPO / "examples" / "gce-current-gpus.yaml")],
}
TARGETS = {"plan examples/local-hetero.yaml": 1.5, "launch --dry-run examples/gce-current-gpus.yaml": 2.0}


def cpu_s(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


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
    commands(args.repeat)


def commands(repeat: int) -> None:
    """The dry run's set-up check and quota read go to the Compute API emulator (anonymous credentials), given by
    endpoint as a user's own endpoint would be: the spec is copied with ``provider.api_endpoint`` set."""
    emu = GceEmulator({"boot_delay_s": 0.05, "op_delay_s": 0.01})
    emu.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            data = yaml.safe_load((REPO / "examples" / "gce-current-gpus.yaml").read_text())
            data["provider"]["api_endpoint"] = emu.url
            spec = Path(tmp) / "gce-current-gpus.yaml"
            spec.write_text(yaml.safe_dump(data))
            _timed(repeat, tmp, spec)
    finally:
        emu.stop()


def _timed(repeat: int, tmp: str, gce_spec: Path) -> None:
    env = {**os.environ, "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp}/bench.db", "ORCHESTRATOR_HOME": tmp}
    for name, argv in COMMANDS.items():
        argv = [str(gce_spec) if a.endswith("gce-current-gpus.yaml") else a for a in argv]
        runs = [cpu_s(argv, env) for _ in range(repeat)]
        target = TARGETS.get(name)
        verdict = (f" (target <= {target:.1f} s: {'met' if statistics.median(runs) <= target else 'NOT met'})"
                   if target else "")
        print(f"{name:50s} {statistics.median(runs):5.2f} s CPU, median of {repeat}{verdict}; "
              f"first {runs[0]:.2f} s (fills the home's revocation-fit cache)")


if __name__ == "__main__":
    main()
