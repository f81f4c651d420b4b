"""A multi-GPU node runs one rank per GPU (torchrun --nproc-per-node), as on a3-highgpu-2g or a4-highgpu-8g.

Real processes on the CPU (gloo), started as the controller starts them: ``node.py`` -> ``torchrun`` -> the
built-in ``worker.py`` or a user's command under ``user_entry.py``. Node A (worker slot 0) has two ranks and
the planner's batch 24, node B (slot 1) one rank and batch 8: the world has three ranks, A's two share its
batch evenly, and every record names the slot with its batch summed over its ranks and its GPU count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.providers.ports import free_port

pytest.importorskip("torch")

JOBS = Path(__file__).resolve().parents[2] / "jobs"
sys.path.insert(0, str(JOBS))

from torchjob.task import TaskError, parse  # noqa: E402


def _task(storage: Path, index: int, batches: list[int], nproc: int, nodes: int, port: int, steps: int,
          run: list[str] | None = None) -> dict[str, Any]:
    return {
        "version": 1, "job_id": "ranks", "instance": f"ranks-worker-{index}-0", "mode": "sync", "role": "worker",
        "index": index, "cluster": {"worker": []}, "storage": str(storage), "gpu": None,
        "training": {"hparam_set": "resnet_tiny", "train_steps": steps, "batch_per_worker": batches,
                     "checkpoint_every": steps, "log_every": 5},
        "torch": {"rdzv_endpoint": f"127.0.0.1:{port}", "is_rdzv_host": index == 0, "min_nodes": nodes,
                  "max_nodes": nodes, "max_restarts": 0, "threads": 1, "nproc_per_node": nproc, "run": run},
    }


def _start(tmp_path: Path, task: dict[str, Any]) -> subprocess.Popen[str]:
    path = tmp_path / f"task-{task['index']}.json"
    path.write_text(json.dumps(task))
    env = {**os.environ, "TORCHJOB_DEVICE": "cpu", "TORCHJOB_BACKEND": "gloo"}
    return subprocess.Popen([sys.executable, str(JOBS / "torchjob" / "node.py"), "--task", str(path)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(procs: list[subprocess.Popen[str]]) -> None:
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(o[-3000:] for o in outs)


def test_a_two_gpu_node_trains_two_ranks_that_share_its_batch(tmp_path: Path) -> None:
    storage, port, batches = tmp_path / "storage", free_port(), [24, 8]
    _finish([_start(tmp_path, _task(storage, 0, batches, 2, 2, port, 10)),
             _start(tmp_path, _task(storage, 1, batches, 1, 2, port, 10))])

    result = json.loads((storage / "result.json").read_text())
    assert result["step"] == 10 and result["world_size"] == 3
    records = [json.loads(ln) for ln in (storage / "metrics.jsonl").read_text().splitlines()]
    world = next(r for r in records if r["kind"] == "world")
    assert world["world_size"] == 3 and world["batches"] == {"0": 24, "1": 8}
    steps = [r for r in records if r["kind"] == "step"]
    assert steps and all(r["workers"]["0"]["batch"] == 24 and r["workers"]["0"]["gpus"] == 2 for r in steps)
    assert all(r["workers"]["1"]["batch"] == 8 and r["workers"]["1"]["gpus"] == 1 for r in steps)


def test_a_users_command_gets_each_local_ranks_share_of_the_node_batch(tmp_path: Path) -> None:
    storage, port = tmp_path / "storage", free_port()
    storage.mkdir()
    show = ("import os, pathlib; e = os.environ; pathlib.Path(e['ORCHESTRATOR_STORAGE_DIR'], 'rank' + e['RANK'])"
            ".write_text(e['ORCHESTRATOR_LOCAL_BATCH_SIZE'] + ' ' + e['ORCHESTRATOR_NODE_BATCH_SIZE'])")
    _finish([_start(tmp_path, _task(storage, 0, [10], 3, 1, port, 1, run=[sys.executable, "-c", show]))])
    shares = sorted((storage / f"rank{r}").read_text() for r in range(3))
    assert shares == ["3 10", "3 10", "4 10"]


def test_a_node_needs_an_example_per_rank_and_shares_its_batch_evenly(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="nproc_per_node 4 must be in 1..the node's batch 3"):
        parse(_task(tmp_path, 0, [3], 4, 1, 1, 1))
    task = parse(_task(tmp_path, 0, [10], 4, 1, 1, 1))
    assert [task.rank_batch(r) for r in range(4)] == [3, 3, 2, 2]
