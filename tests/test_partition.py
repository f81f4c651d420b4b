"""The pipeline partitioner (costmodel/partition.py) and the planner's choice between strategies."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.costmodel.memory import MemoryParams
from orchestrator.costmodel.partition import Partitioner, StageDevice
from orchestrator.costmodel.planner import plan
from orchestrator.model.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
DEVICES = [StageDevice("v100", "n1-standard-8"), StageDevice("p100", "n1-standard-8"),
           StageDevice("k80", "n1-standard-4")]


def test_the_dynamic_program_finds_the_exact_mini_max_partition() -> None:
    """Against brute force over every unit-aligned cut of every GPU order (resnet_cifar_15, 3 GPUs)."""
    part = Partitioner("resnet_cifar_15")
    best = part.best(DEVICES, 128)
    assert best is not None and best.fits
    cuts, n = part.cuts, len(part.profile.layers)
    brute = min(
        part._describe(order, (0, a, b), best.micro_batch, best.micro_batches).bottleneck_s
        for order in set(itertools.permutations(DEVICES))
        for a, b in itertools.combinations(cuts[1:], 2) if a < b < n
    )
    assert best.bottleneck_s == pytest.approx(brute, rel=1e-9)


def test_mini_max_beats_equal_layers_on_unequal_gpus() -> None:
    part = Partitioner("resnet_cifar_32")
    best = part.best(DEVICES, 128)
    equal = part.equal_layers(DEVICES, 128)
    assert best is not None and best.step_s < equal.step_s
    assert best.bottleneck_s <= equal.bottleneck_s  # the slowest stage (with its send) is what mini-max lowers


def test_memory_bounds_every_stage() -> None:
    adam = MemoryParams(optimizer_slots=2)
    part = Partitioner("gpt_1_5b", memory=adam)
    devices = [StageDevice("t4", "n1-standard-8"), StageDevice("l4", "g2-standard-8")]
    for one in devices:  # 25 GB of weights, gradients and Adam moments: no single T4 or L4 holds them
        assert part.best([one], 8) is None
    four = part.best([*devices, *devices], 16)
    assert four is not None and four.fits and max(four.memory_gb) < 21.6


def _plan_json(example: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "orchestrator", "plan", str(REPO / "examples" / example), "--json"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    doc: dict[str, object] = json.loads(out.stdout)
    return doc


def test_plan_chooses_a_pipeline_for_a_model_no_gpu_holds() -> None:
    doc = _plan_json("plan/gpt-1.5b-pipeline.yaml")
    chosen = doc["chosen"]
    assert isinstance(chosen, dict) and chosen["strategy"] in ("pipeline", "hybrid") and chosen["feasible"]
    strategies = {s["name"]: s for s in doc["strategies"]}  # type: ignore[union-attr]
    assert not strategies["data"]["fits"] and strategies[chosen["strategy"]]["fits"]
    for s in strategies.values():
        assert {"name", "step_s", "memory_gb_per_gpu", "usd", "fits"} <= set(s)


def test_plan_keeps_data_parallel_where_the_model_fits_and_reports_the_pipeline() -> None:
    doc = _plan_json("gce-resnet-data-parallel.yaml")
    chosen = doc["chosen"]
    assert isinstance(chosen, dict) and chosen["strategy"] == "data"
    names = {s["name"]: s for s in doc["strategies"]}  # type: ignore[union-attr]
    assert names["pipeline"]["fits"] and names["pipeline"]["step_s"] > names["data"]["step_s"]


def test_parallelism_data_refuses_a_model_that_does_not_fit(tmp_path: Path) -> None:
    text = (REPO / "examples" / "plan" / "gpt-1.5b-pipeline.yaml").read_text().replace("optimizer: adam",
                                                                              "optimizer: adam\n  parallelism: data")
    path = tmp_path / "gpt-data.yaml"
    path.write_text(text)
    result = plan(load_spec(path))
    assert result.chosen is not None and not result.chosen.feasible and result.chosen.strategy == "data"
