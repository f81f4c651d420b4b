"""The built-in job as a pipeline (jobs/torchjob/pipe.py): three gloo processes, one stage each, 1F1B.

Ranks start in another order than the stages (the schedule maps each stage to its rank); the run trains, the
last stage evaluates the whole model from the final checkpoint, and a checkpoint written by one partition
resumes under another (DCP keys are the layers' places in the whole model).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

JOBS = Path(__file__).resolve().parents[2] / "jobs"
sys.path.insert(0, str(JOBS))

import task_schema  # noqa: E402
from torchjob.task import TorchTask  # noqa: E402

SLOTS_BY_RANK = [1, 2, 0]  # rank r runs worker slot SLOTS_BY_RANK[r]


def _task(storage: Path, slot: int, steps: int, modules: list[tuple[int, int]]) -> TorchTask:
    pipeline = task_schema.PipelineSection(stage_slots=(0, 1, 2), modules=tuple(modules), micro_batches=4)
    return TorchTask(job_id="pipe", instance=f"pipe-worker-{slot}-0", slot_index=slot, gpu=None, storage=storage,
                     hparam_set="resnet_tiny", data_dir=None, train_steps=steps, global_batch=32, planned_batch=32,
                     checkpoint_every=steps, log_every=5, seed=0, rdzv_endpoint="", is_rdzv_host=False,
                     min_nodes=3, max_nodes=3, threads=1, pipeline=pipeline)


def _rank(rank: int, world: int, store: str, storage: str, steps: int, modules: list[tuple[int, int]]) -> None:
    from torchjob.pipe import PipeTrainer

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    PipeTrainer(_task(Path(storage), SLOTS_BY_RANK[rank], steps, modules)).run()
    dist.destroy_process_group()


def _run(tmp_path: Path, name: str, steps: int, modules: list[tuple[int, int]]) -> None:
    mp.spawn(_rank, args=(3, str(tmp_path / f"store-{name}"), str(tmp_path / "storage"), steps, modules),
             nprocs=3, join=True)


def test_a_pipeline_trains_evaluates_and_resumes_under_another_partition(tmp_path: Path) -> None:
    (tmp_path / "storage" / "notices").mkdir(parents=True)
    # resnet_tiny's top-level modules: stem conv, bn, relu (0-2), three blocks (3-5), pool, flatten, linear (6-8)
    _run(tmp_path, "a", 10, [(0, 4), (4, 6), (6, 9)])
    lines = [json.loads(line) for line in (tmp_path / "storage" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if r["kind"] == "step"]
    assert steps and steps[-1]["step"] == 10 and steps[-1]["strategy"] == "pipeline"
    first = json.loads((tmp_path / "storage" / "result.json").read_text())
    assert first["step"] == 10 and 0.0 <= first["accuracy"] <= 1.0
    # another partition resumes from the checkpoint at step 10
    _run(tmp_path, "b", 20, [(0, 3), (3, 5), (5, 9)])
    lines = [json.loads(line) for line in (tmp_path / "storage" / "metrics.jsonl").read_text().splitlines()]
    starts = [r for r in lines if r["kind"] == "start"]
    assert starts[-1]["step"] == 10 and starts[-1]["resumed"]
    second = json.loads((tmp_path / "storage" / "result.json").read_text())
    assert second["step"] == 20
    losses = [r["loss"] for r in lines if r["kind"] == "step"]
    assert losses[-1] < losses[0]  # it learns
    # its batch-norm running statistics are sound: no shape-inference forward on made-up tensors reached them
    import torch.distributed.checkpoint as dcp
    from torchjob import ckpt
    from torchjob.model import resnet
    from torchjob.pipe import Stage

    whole = Stage(resnet("resnet_tiny", norm=torch.nn.BatchNorm2d), 0, 9)
    state = {"model": whole.state_dict()}
    dcp.load(state, checkpoint_id=str(ckpt.complete(tmp_path / "storage" / "checkpoints")[-1]), no_dist=True)
    stats = [v for k, v in state["model"].items() if "running_" in k]
    assert stats and all(bool(torch.isfinite(v).all()) for v in stats)
    assert second["accuracy"] > 0.15, second  # chance is 0.1
