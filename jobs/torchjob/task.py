"""task.json for the PyTorch payload: the TensorFlow job's fields plus a ``torch`` section (no torch import)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import task_schema  # jobs/task_schema.py: the controller's definition of task.json


class TaskError(ValueError):
    """task.json is missing or invalid."""


@dataclass(frozen=True)
class TorchTask:
    job_id: str
    instance: str
    slot_index: int  # this node's worker slot (stable across restarts; ranks are not)
    gpu: str | None
    storage: Path
    hparam_set: str
    data_dir: str | None
    train_steps: int
    global_batch: int
    planned_batch: int  # the planner's batch for this slot with every node present (its split weight)
    checkpoint_every: int
    log_every: int
    seed: int
    rdzv_endpoint: str
    is_rdzv_host: bool
    min_nodes: int
    max_nodes: int
    max_restarts: int = 100
    threads: int | None = None
    sleep_table: list[list[float]] = field(default_factory=list)  # [[batch, emulated seconds per step], ...]
    run: list[str] | None = None  # the user's command (argv) instead of the built-in job
    setup: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    resplit_every: int = 0  # probe each rank's compute every N steps and re-split the batch (0: never)
    slowdowns: list[tuple[int, float]] = field(default_factory=list)  # local emulation: (at step, factor)
    pipeline: task_schema.PipelineSection | None = None  # a pipeline job's stages (pipe.py); None: DDP
    nproc_per_node: int = 1  # ranks on this node, one per GPU (a multi-GPU machine type); they share planned_batch
    fault_tolerance: str = "torchrun"  # torchft: this node is one replica group (ft_worker.py), no torchrun
    lighthouse: str | None = None  # torchft: the Lighthouse's address
    replica_host: str | None = None  # torchft: where peers reach this group (None: ft_step.advertised_host)
    join: bool = False  # torchft: started while other groups train (it heals from one; see ft_worker.FtTrainer)

    def rank_batch(self, local_rank: int) -> int:
        """This node's planned batch shared evenly by its ranks (its GPUs are alike): local rank ``local_rank``'s."""
        return task_schema.proportional_split(self.planned_batch, [1.0] * self.nproc_per_node)[local_rank]

    @property
    def notice_file(self) -> Path:
        return self.storage / "notices" / self.instance

    @property
    def checkpoint_dir(self) -> Path:
        return self.storage / "checkpoints"


def parse(raw: Mapping[str, Any]) -> TorchTask:
    """task.json checked against the shared schema (task_schema), then this payload's rules; a TaskError
    (exit 2) names the problem, an unknown ``version`` included."""
    try:
        cfg = task_schema.from_dict(raw)
    except task_schema.TaskSchemaError as e:
        raise TaskError(str(e)) from e
    tr, t = cfg.training, cfg.torch
    if t is None:
        raise TaskError("invalid task.json: the torch section is missing")
    batches = tr.batch_per_worker
    if not 0 <= cfg.index < len(batches):
        raise TaskError(f"invalid task.json: index {cfg.index} has no entry in training.batch_per_worker")
    task = TorchTask(
        job_id=cfg.job_id, instance=cfg.instance, slot_index=cfg.index, gpu=cfg.gpu,
        storage=Path(cfg.storage).resolve(), hparam_set=tr.hparam_set, data_dir=tr.data_dir,
        train_steps=tr.train_steps, global_batch=sum(batches), planned_batch=batches[cfg.index],
        checkpoint_every=tr.checkpoint_every, log_every=tr.log_every, seed=tr.seed,
        rdzv_endpoint=t.rdzv_endpoint, is_rdzv_host=t.is_rdzv_host, min_nodes=t.min_nodes, max_nodes=t.max_nodes,
        max_restarts=t.max_restarts, threads=t.threads or None,
        sleep_table=[[a, b] for a, b in t.sleep_table],
        run=list(t.run) if t.run else None, setup=list(t.setup) if t.setup else None, env=dict(t.env),
        resplit_every=t.resplit_every, slowdowns=[(int(a), float(f)) for a, f in t.slowdowns],
        pipeline=t.pipeline, nproc_per_node=t.nproc_per_node, fault_tolerance=t.fault_tolerance,
        lighthouse=t.lighthouse, replica_host=t.replica_host, join=t.join,
    )
    if not 1 <= task.min_nodes <= task.max_nodes:
        raise TaskError(f"torch.min_nodes {task.min_nodes} must be in 1..max_nodes {task.max_nodes}")
    if not 1 <= task.nproc_per_node <= task.planned_batch:
        raise TaskError(f"torch.nproc_per_node {task.nproc_per_node} must be in 1..the node's batch "
                        f"{task.planned_batch}")
    if task.pipeline is not None and task.nproc_per_node != 1:
        raise TaskError("torch.nproc_per_node must be 1 for a pipeline job (one stage per node)")
    if task.fault_tolerance == "torchft" and (task.pipeline is not None or task.nproc_per_node != 1):
        raise TaskError("torch.fault_tolerance torchft runs one data-parallel process per node (no pipeline)")
    if task.train_steps <= 0 or task.log_every <= 0 or task.checkpoint_every <= 0:
        raise TaskError("train_steps, log_every and checkpoint_every must be > 0")
    return task


def load(path: str | Path) -> TorchTask:
    try:
        return parse(task_schema.read(path))  # the schema's reader: one for the controller and both payloads
    except task_schema.TaskSchemaError as e:
        raise TaskError(str(e)) from e
