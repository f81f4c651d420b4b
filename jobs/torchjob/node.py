"""One instance of a PyTorch job: ``python jobs/torchjob/node.py --task task.json`` (cwd = the instance's disk).

Runs the spec's ``setup:`` command once (if any), then replaces itself with ``ft_worker.py`` (task
``torch.fault_tolerance: torchft``: this node is one torchft replica group) or else with ``torchrun``: elastic c10d
rendezvous (``--nnodes=MIN:MAX``) at an endpoint on a node that is never revoked, one process per GPU of
the node (``--nproc-per-node``: a multi-GPU machine type's count, 1 elsewhere), the built-in ``worker.py`` or
the user's ``run:`` command wrapped by ``user_entry.py``. The ORCHESTRATOR_* variables
(README: docs/pytorch.md) are set for both. Exit codes are torchrun's (0: every rank finished).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchjob import EXIT_BAD_TASK  # noqa: E402
from torchjob.runtime import log  # noqa: E402
from torchjob.task import TaskError, TorchTask, load  # noqa: E402

HERE = Path(__file__).resolve().parent


def orchestrator_env(task: TorchTask) -> dict[str, str]:
    """What a user's script (and the built-in job) may read besides torchrun's RANK, WORLD_SIZE, ..."""
    task.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    return {
        "ORCHESTRATOR_JOB_ID": task.job_id,
        "ORCHESTRATOR_INSTANCE": task.instance,
        "ORCHESTRATOR_SLOT": str(task.slot_index),
        # each rank's share of the node's batch; user_entry.py sets it per local rank (LOCAL_RANK)
        "ORCHESTRATOR_LOCAL_BATCH_SIZE": str(task.rank_batch(0)),
        "ORCHESTRATOR_NODE_BATCH_SIZE": str(task.planned_batch),
        "ORCHESTRATOR_GLOBAL_BATCH_SIZE": str(task.global_batch),
        "ORCHESTRATOR_TRAIN_STEPS": str(task.train_steps),
        "ORCHESTRATOR_CHECKPOINT_DIR": str(task.checkpoint_dir),
        "ORCHESTRATOR_STORAGE_DIR": str(task.storage),
        "ORCHESTRATOR_NOTICE_FILE": str(task.notice_file),
        "ORCHESTRATOR_NOTICE_DIR": str(task.notice_file.parent),
        "ORCHESTRATOR_METRICS_FILE": str(task.storage / "metrics.jsonl"),
    }


def torchrun_argv(task: TorchTask, task_path: Path) -> list[str]:
    conf = ",".join([f"is_host={'true' if task.is_rdzv_host else 'false'}", "last_call_timeout=3",
                     "join_timeout=900", "close_timeout=10", "read_timeout=60"])
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={task.min_nodes}:{task.max_nodes}",
            f"--nproc-per-node={task.nproc_per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={task.rdzv_endpoint}",
            f"--rdzv-id={task.job_id}", f"--rdzv-conf={conf}", f"--max-restarts={task.max_restarts}",
            "--monitor-interval=0.5"]
    if task.run:
        return argv + [str(HERE / "user_entry.py"), "--task", str(task_path), "--", *task.run]
    return argv + [str(HERE / "worker.py"), "--task", str(task_path)]


def torchft_argv(task: TorchTask, task_path: Path) -> list[str]:
    """A torchft replica group of one process: no torchrun, no restarts (a lost peer only shrinks the quorum)."""
    if task.run:
        return list(task.run)  # the user's script builds its own Manager from TORCHFT_LIGHTHOUSE / REPLICA_GROUP_ID
    return [sys.executable, str(HERE / "ft_worker.py"), "--task", str(task_path)]


def torchft_env(task: TorchTask) -> dict[str, str]:
    """What a replica group's process (the built-in trainer or a ``run:`` script) builds its Manager from; on a remote
    worker also the address its peers reach it at (``hostname=`` / ``store_addr=`` of torchft's Manager)."""
    env = {"TORCHFT_LIGHTHOUSE": task.lighthouse or "", "REPLICA_GROUP_ID": str(task.slot_index)}
    if task.replica_host:
        env["ORCHESTRATOR_REPLICA_HOST"] = task.replica_host
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="node.py", description=__doc__)
    parser.add_argument("--task", required=True)
    args = parser.parse_args(argv)
    task_path = Path(args.task).resolve()
    try:
        task = load(task_path)
    except TaskError as e:
        log(str(e))
        return EXIT_BAD_TASK
    env = {**os.environ, **task.env, **orchestrator_env(task)}
    # Each worker group gets a fresh store of its own: torchrun's shared store keys the workers' entries by
    # each agent's own restart count, which differs between a survivor and a newcomer after a shrink, and
    # the workers then read a dead peer's address.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")  # a script's metric lines arrive as printed
    # `python` in a run: command is the interpreter running this payload (the instance's, or the local venv's).
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if task.threads:
        env.setdefault("OMP_NUM_THREADS", str(task.threads))
    if task.setup:
        log(f"setup: {task.setup}")
        code = subprocess.run(task.setup, env=env).returncode
        if code != 0:
            log(f"setup exited with {code}")
            return code
    torchft = task.fault_tolerance == "torchft"
    if torchft:
        env.update(torchft_env(task))
    cmd = torchft_argv(task, task_path) if torchft else torchrun_argv(task, task_path)
    if torchft and task.run:
        cmd[0] = shutil.which(cmd[0], path=env["PATH"]) or cmd[0]  # execve takes a path, the script a name
    log(f"{task.instance}: {' '.join(cmd)}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
