"""``training.fault_tolerance`` left out: the built-in PyTorch data-parallel job runs on torchft replica groups where
they apply (model.torch_spec.fault_tolerance), torchrun's elastic restarts elsewhere; what the spec names, it gets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.model.spec import validate_spec
from orchestrator.model.torch_spec import fault_tolerance

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _doc(example: str) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load((EXAMPLES / example).read_text())
    raw["training"].pop("fault_tolerance", None)
    return raw


def _default(raw: dict[str, Any]) -> str:
    return fault_tolerance(validate_spec(raw))


def test_one_gpu_nodes_on_local_and_gce_are_replica_groups() -> None:
    assert _default(_doc("local-torch-hetero.yaml")) == "torchft"
    assert _default(_doc("gce-resnet-data-parallel.yaml")) == "torchft"  # T4, L4, A100: one GPU a VM


@pytest.mark.parametrize("case", ["pipeline", "run script", "ssh hosts", "8-GPU VMs", "searched GPUs"])
def test_replica_groups_do_not_apply_and_torchrun_stays(case: str) -> None:
    raw = _doc("gce-resnet-data-parallel.yaml") if case in ("8-GPU VMs", "searched GPUs") else _doc(
        "local-torch-hetero.yaml")
    if case == "pipeline":  # a pipeline needs every stage
        raw["training"]["parallelism"] = "pipeline"
    elif case == "run script":  # the user's script builds its own Manager: opt-in
        raw = _doc("local-own-script.yaml")
    elif case == "ssh hosts":  # an inventory host's python3 may lack torchft: opt-in
        raw["provider"] = {"kind": "ssh", "inventory": "hosts.yaml"}
    elif case == "8-GPU VMs":  # the torchft trainer runs one process a node
        raw["cluster"]["workers"] = [{"gpu": "h100", "machine_type": "a3-highgpu-8g", "count": 2}]
    else:  # the planner may pick a multi-GPU machine type
        raw.pop("cluster")
        raw["search"] = {"gpus": ["t4", "l4"], "max_workers": 4}
    assert _default(raw) == "torchrun"


def test_what_the_spec_names_it_gets() -> None:
    raw = _doc("local-torch-hetero.yaml")
    raw["training"]["fault_tolerance"] = "torchrun"
    assert _default(raw) == "torchrun"
    assert fault_tolerance(validate_spec(yaml.safe_load((EXAMPLES / "local-torch-hetero.yaml").read_text()))) == \
        "torchrun"  # the example shows torchrun's re-rendezvous, and says so


def test_replica_groups_on_a_multi_gpu_vm_are_planned_on_the_one_gpu_they_train_on() -> None:
    """Named on 8-GPU VMs, torchft runs one process a VM: the plan counts one GPU and says the other seven idle."""
    from orchestrator.costmodel.planner import idle_gpu_warnings, plan
    from orchestrator.model.catalog import load_catalog

    raw = _doc("gce-resnet-data-parallel.yaml")
    raw["cluster"]["workers"] = [{"gpu": "h100", "machine_type": "a3-highgpu-8g", "count": 2}]
    raw["training"]["fault_tolerance"] = "torchft"
    spec = validate_spec(raw)
    chosen = plan(spec).chosen
    assert chosen is not None
    warnings = idle_gpu_warnings(spec, load_catalog(), chosen)
    assert warnings == ["a3-highgpu-8g carries 8 GPUs but a torchft replica group trains on 1 of them (one process a "
                        "VM; the plan counts 1): pick a 1-GPU machine type, or training.fault_tolerance: torchrun"]
