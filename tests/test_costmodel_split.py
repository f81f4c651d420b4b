"""The batch split is exact: compare with brute force on small cases; memory caps always hold."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.costmodel import SplitError, max_batch, predict_step_time, split_batch
from orchestrator.costmodel.split import max_step_time, min_max_split


def brute_force(tables: list[np.ndarray], total: int) -> float:
    best = np.inf
    for combo in itertools.product(*[range(1, len(t) + 1) for t in tables]):
        if sum(combo) == total:
            best = min(best, max(float(t[b - 1]) for t, b in zip(tables, combo, strict=True)))
    return best


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[np.ndarray], int]:
    n = draw(st.integers(1, 4))
    tables = []
    for _ in range(n):
        cap = draw(st.integers(1, 7))
        steps = draw(st.lists(st.integers(1, 20), min_size=cap, max_size=cap))
        start = draw(st.integers(0, 30))
        tables.append(np.cumsum(np.array(steps, dtype=np.float64)) + start)  # strictly increasing
    total = draw(st.integers(n, sum(len(t) for t in tables)))
    return tables, total


@settings(max_examples=300, deadline=None)
@given(cases())
def test_split_matches_brute_force(case: tuple[list[np.ndarray], int]) -> None:
    tables, total = case
    batches = min_max_split(tables, total)
    assert sum(batches) == total
    assert all(1 <= b <= len(t) for b, t in zip(batches, tables, strict=True))
    assert max_step_time(tables, batches) == brute_force(tables, total)


def test_shared_tables_for_identical_workers() -> None:
    t = np.arange(1.0, 11.0)
    assert sorted(min_max_split([t, t, t], 10)) == [3, 3, 4]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["k80", "p100", "v100", "t4"]), min_size=1, max_size=4), st.integers(4, 400))
def test_split_batch_of_real_gpus_is_optimal_by_single_moves(gpus: list[str], global_batch: int) -> None:
    if global_batch < len(gpus):
        return
    batches = split_batch("resnet_cifar_32", gpus, global_batch)
    assert sum(batches) == global_batch

    def worst(bs: list[int]) -> float:
        return max(predict_step_time("resnet_cifar_32", g, b) for g, b in zip(gpus, bs, strict=True))

    best = worst(batches)
    for i, j in itertools.permutations(range(len(gpus)), 2):  # moving one example never helps
        if batches[i] > 1:
            moved = list(batches)
            moved[i] -= 1
            moved[j] += 1
            assert worst(moved) >= best - 1e-12


def test_faster_gpus_get_more_and_caps_hold() -> None:
    b = split_batch("resnet_cifar_56", ["k80", "v100"], 256)
    assert b[1] > b[0] and sum(b) == 256
    cap = max_batch("vgg16", "k80")
    b = split_batch("vgg16", ["k80", "h100"], 600)
    assert b[0] <= cap and sum(b) == 600
    with pytest.raises(SplitError, match="memory"):
        split_batch("vgg16", ["k80", "k80"], 2 * cap + 1)
    with pytest.raises(SplitError, match="smaller than"):
        split_batch("resnet_tiny", ["k80", "k80", "k80"], 2)



def test_a_multi_gpu_machine_type_gets_a_share_for_each_of_its_gpus() -> None:
    # Two a3-highgpu-2g VMs (2 H100 each) and one a3-highgpu-1g: 5 GPU-workers share the global batch 2048, and
    # the plan's per-GPU batches add up to it (they were 341 x 4 + 682 = 2046).
    import re
    from pathlib import Path

    from orchestrator.costmodel.batches import worker_batches
    from orchestrator.costmodel.planner import plan
    from orchestrator.model.spec import load_spec

    spec = load_spec(Path(__file__).parent.parent / "examples" / "gce-h100-machine-types.yaml")
    per_vm = worker_batches(spec)
    assert sum(per_vm) == 2048 and abs(per_vm[0] - per_vm[1]) <= 1 and abs(per_vm[0] - 2 * per_vm[2]) <= 2, per_vm
    chosen = plan(spec).chosen
    assert chosen is not None and chosen.strategies
    found = re.search(r"5 replicas, batches ([\d/]+)", chosen.strategies[0].detail)
    assert found is not None, chosen.strategies[0].detail
    assert sum(int(b) for b in found.group(1).split("/")) == 2048
    # the a3-highgpu-1g group asks for Flex-start capacity: billed as such, not as on-demand
    assert chosen.label == "2x h100 (a3-highgpu-2g) spot + 1x h100 flex-start, us-central1-a", chosen.label


def test_a_pytorch_node_on_a_multi_gpu_machine_type_runs_a_rank_per_gpu() -> None:
    # The same cluster trained by the built-in PyTorch job: each a3-highgpu-2g node runs two ranks (torchrun
    # --nproc-per-node=2) and takes two GPUs' share; a pipeline stage runs one rank, and plan warns of its idle GPU.
    from pathlib import Path

    import yaml

    from orchestrator.control.torch_task import torch_section
    from orchestrator.costmodel.batches import trained_gpus, worker_batches
    from orchestrator.costmodel.planner import idle_gpu_warnings, plan
    from orchestrator.costmodel.slots import expand
    from orchestrator.model.catalog import load_catalog
    from orchestrator.model.spec import validate_spec
    from orchestrator.store.models import Instance

    doc = yaml.safe_load((Path(__file__).parent.parent / "examples" / "gce-h100-machine-types.yaml").read_text())
    doc["training"]["framework"] = "pytorch"
    spec = validate_spec(doc)
    per_vm = worker_batches(spec)
    assert sum(per_vm) == 2048 and abs(per_vm[0] - 2 * per_vm[2]) <= 2, per_vm
    cat = load_catalog()
    chosen = plan(spec).chosen
    assert chosen is not None and idle_gpu_warnings(spec, cat, chosen) == []
    # a synchronous VM's GPUs step together: a 2-GPU VM's rate is its GPUs' (not their sum)
    rates = [w.steps_per_s for w in chosen.workers]
    assert max(rates) < 1.01 * min(rates), rates
    slots = [s for s in expand(spec) if s.role.value == "worker"]
    nprocs = [torch_section(spec, slots, [], Instance(name=f"j-{s.name}-0", role="worker", slot_index=s.index,
                                                      generation=0, gpu="h100", batch=s.batch),
                            2048, lambda gpu, batch: 0.0).nproc_per_node for s in slots]
    assert nprocs == [2, 2, 1]
    # an inventory host's GPUs (ssh: the provider says, once placed) count where the machine type does not
    inst = Instance(name="j-worker-2-0", role="worker", slot_index=2, generation=0, gpu="h100", batch=slots[2].batch)
    assert torch_section(spec, slots, [], inst, 2048, lambda gpu, batch: 0.0, host_gpus=4).nproc_per_node == 4
    doc["training"]["parallelism"] = "pipeline"
    piped = validate_spec(doc)
    assert trained_gpus(piped, cat, "a3-highgpu-2g") == 1


@pytest.mark.parametrize(("mode", "batch"), [("sync", {"global_batch": 96}), ("async", {"global_batch": 96}),
                                            ("sync", {"batch_per_worker": 40}), ("async", {})])
def test_a_pinned_and_a_searched_cluster_take_their_batches_by_one_rule(mode: str, batch: dict[str, int]) -> None:
    # The same GPUs pinned (costmodel/batches.worker_batches, the controller's) and as a searched layout (the
    # planner's Evaluator) get the same batches: a global batch split by speed (sync) or evenly (async), else each
    # worker's batch_per_worker or the one default.
    from orchestrator.costmodel.batches import DEFAULT_BATCH, worker_batches
    from orchestrator.costmodel.compute import DEFAULT_CALIBRATION
    from orchestrator.costmodel.planner.evaluate import Evaluator
    from orchestrator.costmodel.slots import price_book_for
    from orchestrator.model.catalog import load_catalog
    from orchestrator.model.spec import validate_spec

    gpus = ["t4", "l4", "a100"]
    training = {"job": "resnet-cifar", "hparam_set": "resnet_cifar_32", "mode": mode, **batch}
    base = {"name": "rule", "provider": {"kind": "gce", "project": "my-gcp-project", "zones": ["us-central1-a"]},
            "storage": "gs://bucket/orchestrator", "training": training}
    pinned = validate_spec({**base, "cluster": {"workers": [{"gpu": g} for g in gpus]}})
    searched = validate_spec({**base, "search": {"gpus": gpus, "max_workers": 3}})
    cat = load_catalog()
    evaluator = Evaluator(searched, cat, DEFAULT_CALIBRATION, price_book_for(searched, cat))
    found, err = evaluator.batches([(g, None) for g in gpus])
    assert err is None and found == worker_batches(pinned, cat, DEFAULT_CALIBRATION), found
    if "global_batch" in batch:
        assert sum(found) == 96 and (mode == "async") == (max(found) - min(found) <= 1), found
    else:
        assert found == [batch.get("batch_per_worker", DEFAULT_BATCH)] * 3


def test_the_payload_splits_by_the_planners_rule() -> None:
    # jobs/torchjob takes proportional_split from the shipped schema (jobs/task_schema.py loads
    # orchestrator/model/task.py), as the planner does: one definition, no copy.
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "jobs"))
    split = importlib.import_module("torchjob.split")  # the payload's package, on the path the payload runs with

    from orchestrator.costmodel import batches
    from orchestrator.model import task

    assert batches.proportional_split is task.proportional_split
    assert Path(split.proportional_split.__code__.co_filename).resolve() == Path(task.__file__).resolve()
    assert split.proportional_split(96, [20.0, 46.0]) == task.proportional_split(96, [20.0, 46.0]) == [29, 67]
