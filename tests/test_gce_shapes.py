"""Machine-type shapes: a worker on an accelerator-optimized type (a3-highgpu-2g) carries its fixed GPUs,
is priced whole, and the planner can choose the shape."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.costmodel import plan
from orchestrator.costmodel.slots import expand
from orchestrator.model.catalog import load_catalog
from orchestrator.model.spec import validate_spec


def spec(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "shapes",
        "provider": {"kind": "gce", "project": "test-project", "zones": ["us-central1-a"]},
        "training": {"job": "resnet-cifar", "hparam_set": "resnet_cifar_56", "mode": "sync", "train_steps": 20000,
                     "global_batch": 2048},
        "policy": {"budget_usd": 500, "deadline": "8h"},
    }
    doc.update(over)
    return doc


def pinned(machine: str, count: int) -> dict[str, Any]:
    return spec(cluster={"parameter_servers": {"count": 0},
                         "workers": [{"gpu": "h100", "machine_type": machine, "count": count, "spot": True,
                                      "zone": "us-central1-a"}]})


def test_a_pinned_shape_is_priced_whole_and_trains_on_all_its_gpus() -> None:
    book = load_catalog().price_book("2026-11")
    two = plan(validate_spec(pinned("a3-highgpu-2g", 1))).chosen
    one = plan(validate_spec(pinned("a3-highgpu-1g", 1))).chosen
    assert two is not None and one is not None
    assert two.hourly_usd == pytest.approx(book.instance_price("a3-highgpu-2g", "h100", 2, spot=True))
    assert two.steps_per_s > 1.5 * one.steps_per_s  # two H100s, not one
    slots = expand(validate_spec(pinned("a3-highgpu-2g", 2)))
    assert [(s.machine_type, s.gpu_count) for s in slots] == [("a3-highgpu-2g", 2)] * 2


def test_the_planner_chooses_among_shapes() -> None:
    result = plan(validate_spec(spec(search={"gpus": ["h100"], "min_workers": 1, "max_workers": 8,
                                             "spot": [True], "objective": "time"})))
    machines = {w.machine_type for c in result.candidates for w in c.workers}
    assert {"a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g", "a3-highgpu-8g"} <= machines
    assert result.chosen is not None
    cluster = result.chosen.to_cluster()
    again = validate_spec(spec(cluster=cluster.model_dump(mode="json", exclude_none=True)))
    gpus = sum(s.gpu_count for s in expand(again) if s.gpu)
    assert gpus == sum(load_catalog().gpus_per_instance(w.machine_type) for w in result.chosen.workers)
    # 8 H100s as 4 x a3-highgpu-2g cost what 4 such machines cost.
    four_by_two = [c for c in result.candidates
                   if [w.machine_type for w in c.workers] == ["a3-highgpu-2g"] * 4]
    assert four_by_two and four_by_two[0].hourly_usd == pytest.approx(4 * 6.70753)


def test_plan_warns_of_a_gpu_without_the_tensor_units_of_the_jobs_precision() -> None:
    # A user's script in bf16 pinned on V100s (Volta: FP16 tensor cores, no BF16) is told so, and what to use.
    from pathlib import Path

    import yaml

    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "gce-own-model.yaml").read_text())
    doc["training"]["precision"] = "bf16"
    doc["training"].pop("model")  # planned as the built-in profile: the model's own needs `model profile` first
    doc.pop("search")
    doc["cluster"] = {"workers": [{"gpu": "v100", "count": 2, "spot": True, "zone": "us-central1-a"}]}
    warnings = plan(validate_spec(doc)).warnings
    assert any(w.startswith("v100 (volta) has no BF16 tensor cores") and "precision: amp" in w
               for w in warnings), warnings
    doc["training"]["precision"] = "amp"
    assert not any("tensor cores" in w for w in plan(validate_spec(doc)).warnings)
