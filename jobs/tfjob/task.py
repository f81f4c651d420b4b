"""Parsing of task.json (no TensorFlow import here)."""

from __future__ import annotations

import random
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import task_schema  # jobs/task_schema.py: the controller's definition of task.json


class TaskError(ValueError):
    """task.json is missing or invalid."""


Training = task_schema.TrainingSection  # the schema's own section: no copy of its fields or defaults here


@dataclass(frozen=True)
class Task:
    job_id: str
    instance: str
    mode: str  # "async" | "sync"
    role: str  # "ps" | "chief" | "worker"
    index: int
    cluster: dict[str, list[str]]
    storage: Path
    training: Training
    step_sleep_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_workers(self) -> int:
        return len(self.cluster.get("worker", []))

    @property
    def hosts_chief(self) -> bool:
        """Async worker 0 of a cluster without a chief task (cluster.chief.on_worker0, the ICAC'19 setup):
        its process serves the worker task and runs the chief beside it."""
        return self.mode == "async" and self.role == "worker" and self.index == 0 and not self.cluster.get("chief")

    @property
    def is_chief(self) -> bool:
        """The task doing the job's I/O: async chief (or the worker running it), or sync worker 0."""
        if self.mode == "async":
            return self.role == "chief" or self.hosts_chief
        return self.role == "worker" and self.index == 0

    def batch_for(self, worker_index: int) -> int:
        return self.training.batch_per_worker[worker_index]


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise TaskError(msg)


def parse_task(raw: Mapping[str, Any]) -> Task:
    """task.json checked against the shared schema (task_schema: version, fields, types), then the TF job's
    own rules; any problem is a TaskError (exit 2: a task.json from another release is never retried)."""
    try:
        cfg = task_schema.from_dict(raw)
    except task_schema.TaskSchemaError as e:
        raise TaskError(str(e)) from e
    task = Task(
        job_id=cfg.job_id,
        instance=cfg.instance,
        mode=cfg.mode,
        role=cfg.role,
        index=cfg.index,
        cluster={k: list(v) for k, v in cfg.cluster.items()},
        storage=Path(cfg.storage).resolve(),
        training=cfg.training,
        step_sleep_s=cfg.step_sleep_s,
        extra={"storage_uri": cfg.storage_uri},
    )
    _require(task.mode in ("async", "sync"), f"mode must be async|sync, got {task.mode!r}")
    _require(task.role in ("ps", "chief", "worker"), f"bad role {task.role!r}")
    _require(task.num_workers > 0, "cluster has no worker")
    _require(
        task.role in task.cluster and 0 <= task.index < len(task.cluster[task.role]),
        f"{task.role}:{task.index} not in cluster",
    )
    if task.mode == "sync":
        _require(set(task.cluster) == {"worker"}, "sync mode: cluster must only have 'worker' tasks")
    else:
        # No chief task: worker 0 runs it (cluster.chief.on_worker0).
        _require(
            len(task.cluster.get("chief", [])) <= 1 and len(task.cluster.get("ps", [])) >= 1,
            "async mode: cluster needs at most one chief (none: worker 0 runs it) and at least one ps",
        )
    _require(
        len(task.training.batch_per_worker) == task.num_workers,
        "training.batch_per_worker must have one entry per worker",
    )
    _require(all(b > 0 for b in task.training.batch_per_worker), "batch sizes must be > 0")
    _require(
        task.training.train_steps > 0 and task.training.log_every > 0, "train_steps, log_every must be > 0"
    )
    _require(task.step_sleep_s >= 0, "emulation.step_sleep_s must be >= 0")
    return task


def load_task(path: str | Path) -> Task:
    try:
        return parse_task(task_schema.read(path))  # the schema's reader: one for the controller and both payloads
    except task_schema.TaskSchemaError as e:
        raise TaskError(str(e)) from e


def chief_address(cluster: dict[str, list[str]]) -> str:
    """Where the chief that worker 0 runs listens: on worker 0's host, at the next port when that host is
    worker 0's alone (a cloud VM: its firewall opens the task port range there), else at any free port
    (tasks that share one address, e.g. every local instance, each have a port of their own)."""
    host, _, port = cluster["worker"][0].rpartition(":")
    hosts = [a.rpartition(":")[0] for addresses in cluster.values() for a in addresses]
    if hosts.count(host) == 1:
        return f"{host}:{int(port) + 1}"
    return f"{host}:{_free_port()}"


def _ephemeral_low() -> int:
    """The first port of this host's ephemeral range (Linux default 32768; IANA's 49152 where unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def _free_port() -> int:
    """A free port below the kernel's ephemeral range, where no outgoing connection takes its source port between
    this pick and the chief's bind (the rule of the controller's orchestrator.providers.ports, which this payload,
    shipped alone to the VMs, cannot import); the kernel's pick where none binds or the range leaves no room."""
    pick, low = random.SystemRandom(), _ephemeral_low()
    for _ in range(64 if low - 20000 >= 1024 else 0):
        with socket.socket() as probe:
            try:
                probe.bind(("", pick.randrange(20000, low)))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])
