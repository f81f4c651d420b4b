"""task.json for the PyTorch payload: the TensorFlow job's fields plus a ``torch`` section (no torch import)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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

    @property
    def notice_file(self) -> Path:
        return self.storage / "notices" / self.instance

    @property
    def checkpoint_dir(self) -> Path:
        return self.storage / "checkpoints"


def parse(raw: dict[str, Any]) -> TorchTask:
    try:
        tr, t = dict(raw["training"]), dict(raw["torch"])
        batches = [int(b) for b in tr["batch_per_worker"]]
        index = int(raw["index"])
        run, setup = t.get("run"), t.get("setup")
        task = TorchTask(
            job_id=str(raw["job_id"]), instance=str(raw["instance"]), slot_index=index, gpu=raw.get("gpu"),
            storage=Path(raw["storage"]).resolve(), hparam_set=str(tr.get("hparam_set", "resnet_cifar_15")),
            data_dir=tr.get("data_dir"), train_steps=int(tr["train_steps"]), global_batch=sum(batches),
            planned_batch=batches[index], checkpoint_every=int(tr.get("checkpoint_every", 100)),
            log_every=int(tr.get("log_every", 10)), seed=int(tr.get("seed", 0)),
            rdzv_endpoint=str(t["rdzv_endpoint"]), is_rdzv_host=bool(t.get("is_rdzv_host", False)),
            min_nodes=int(t.get("min_nodes", 1)), max_nodes=int(t.get("max_nodes", len(batches))),
            max_restarts=int(t.get("max_restarts", 100)),
            threads=int(t["threads"]) if t.get("threads") else None,
            sleep_table=[[float(a), float(b)] for a, b in t.get("sleep_table", [])],
            run=[str(a) for a in run] if run else None, setup=[str(a) for a in setup] if setup else None,
            env={str(k): str(v) for k, v in (t.get("env") or {}).items()},
        )
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise TaskError(f"invalid task.json: {e!r}") from e
    if not 1 <= task.min_nodes <= task.max_nodes:
        raise TaskError(f"torch.min_nodes {task.min_nodes} must be in 1..max_nodes {task.max_nodes}")
    if task.train_steps <= 0 or task.log_every <= 0 or task.checkpoint_every <= 0:
        raise TaskError("train_steps, log_every and checkpoint_every must be > 0")
    return task


def load(path: str | Path) -> TorchTask:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise TaskError(f"cannot read task file {path}: {e}") from e
    if not isinstance(raw, dict):
        raise TaskError("task.json must hold an object")
    return parse(raw)
