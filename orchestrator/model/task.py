"""task.json: what the controller tells each task, as one typed, versioned schema.

The controller builds a ``TaskConfig`` and writes ``to_json()``; the payloads (jobs/tfjob, jobs/torchjob)
read it with ``load``. This file is also the payload's copy: the controller pushes it beside jobs/ as
``jobs/task_schema.py`` (control/execute.py), so it imports only the standard library. ``proportional_split``
lives here for the same reason: the planner and the payload split a batch by one rule, never two copies.
A payload given a ``version`` it does not know exits with ``EXIT_FATAL`` (model/exits.py: retrying cannot help).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TASK_VERSION = 1  # bump on any change a payload must know about; payloads refuse other versions
EXIT_FATAL = 2  # the same as model.exits.EXIT_FATAL (this file cannot import it: it ships alone)
MODES = ("async", "sync")
ROLES = ("ps", "chief", "worker")
FAULT_TOLERANCE = ("torchrun", "torchft")


class TaskSchemaError(ValueError):
    """task.json does not match this schema (the message names the field)."""


class UnknownVersionError(TaskSchemaError):
    """task.json was written for another schema version."""


@dataclass(frozen=True)
class TrainingSection:
    model: str
    hparam_set: str
    problem: str
    data_dir: str | None
    train_steps: int
    batch_per_worker: tuple[int, ...]
    checkpoint_every: int
    eval_every: int
    log_every: int
    seed: int


@dataclass(frozen=True)
class PipelineSection:
    """A pipeline job's stages (jobs/torchjob/pipe.py): worker slots in stage order, the half-open range of the
    model's top-level modules each stage holds, micro-batches per step, and (local emulation) each stage's
    forward / backward sleep per micro-batch."""

    stage_slots: tuple[int, ...]
    modules: tuple[tuple[int, int], ...]
    micro_batches: int
    stage_sleep: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class TorchSection:
    """The PyTorch payload's extra section (elastic rendezvous, emulated step times, the user's command)."""

    rdzv_endpoint: str
    is_rdzv_host: bool
    min_nodes: int
    max_nodes: int
    max_restarts: int
    threads: int | None
    sleep_table: tuple[tuple[float, float], ...]  # (batch, emulated seconds per step)
    run: tuple[str, ...] | None
    setup: tuple[str, ...] | None
    env: Mapping[str, str] = field(default_factory=dict)  # secrets never go here: the process env has them
    resplit_every: int = 0  # the built-in job re-splits its batch from measured compute every N steps (0: off)
    slowdowns: tuple[tuple[int, float], ...] = ()  # local emulation: this node's GPU slows (at step, factor)
    pipeline: PipelineSection | None = None  # a pipeline job's stages; None: data parallel
    nproc_per_node: int = 1  # data-parallel ranks on this node: one per GPU of a multi-GPU machine type
    fault_tolerance: str = "torchrun"  # torchrun (elastic restarts) | torchft (replica groups: ft_worker.py)
    lighthouse: str | None = None  # torchft: the Lighthouse's address (http://host:port), with the controller
    # torchft: the address this node's peers reach its group at (a VM's internal address: its Lighthouse address is
    # a tunnel on its own loopback); None: loopback where the Lighthouse's is, else the host name
    replica_host: str | None = None
    # torchft: started while other groups train (a replacement or a late node): it heals from a live peer, and one
    # whose peers are all gone by its first quorum (they finished) waits for the job's result, not training alone
    join: bool = False


@dataclass(frozen=True)
class TaskConfig:
    job_id: str
    instance: str
    mode: str  # async | sync
    role: str  # ps | chief | worker
    index: int
    cluster: Mapping[str, tuple[str, ...]]  # role -> host:port per slot
    storage: str  # the job's storage directory on the instance
    storage_uri: str
    training: TrainingSection
    step_sleep_s: float = 0.0  # local emulation: extra seconds per step
    gpu: str | None = None  # PyTorch: this node's GPU (its split weight's source)
    torch: TorchSection | None = None
    version: int = TASK_VERSION

    def to_dict(self) -> dict[str, Any]:
        t = self.training
        out: dict[str, Any] = {
            "version": self.version, "job_id": self.job_id, "instance": self.instance, "mode": self.mode,
            "role": self.role, "index": self.index, "cluster": {k: list(v) for k, v in self.cluster.items()},
            "storage": self.storage, "storage_uri": self.storage_uri,
            "training": {"model": t.model, "hparam_set": t.hparam_set, "problem": t.problem, "data_dir": t.data_dir,
                         "train_steps": t.train_steps, "batch_per_worker": list(t.batch_per_worker),
                         "checkpoint_every": t.checkpoint_every, "eval_every": t.eval_every,
                         "log_every": t.log_every, "seed": t.seed},
            "emulation": {"step_sleep_s": self.step_sleep_s},
        }
        if self.torch is not None:
            p = self.torch
            out["gpu"] = self.gpu
            out["torch"] = {"rdzv_endpoint": p.rdzv_endpoint, "is_rdzv_host": p.is_rdzv_host,
                            "min_nodes": p.min_nodes, "max_nodes": p.max_nodes, "max_restarts": p.max_restarts,
                            "threads": p.threads, "sleep_table": [list(r) for r in p.sleep_table],
                            "run": None if p.run is None else list(p.run),
                            "setup": None if p.setup is None else list(p.setup), "env": dict(p.env),
                            "resplit_every": p.resplit_every, "slowdowns": [list(r) for r in p.slowdowns],
                            "nproc_per_node": p.nproc_per_node,
                            # torchft only: a torchrun task's file stays as it was
                            **({"fault_tolerance": p.fault_tolerance, "lighthouse": p.lighthouse,
                                 **({"replica_host": p.replica_host} if p.replica_host else {}),
                                 **({"join": True} if p.join else {})}
                               if p.fault_tolerance != "torchrun" else {}),
                            "pipeline": None if p.pipeline is None else {
                                "stage_slots": list(p.pipeline.stage_slots),
                                "modules": [list(m) for m in p.pipeline.modules],
                                "micro_batches": p.pipeline.micro_batches,
                                "stage_sleep": [list(x) for x in p.pipeline.stage_sleep]}}
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def proportional_split(total: int, weights: Sequence[float]) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights`` (largest remainder), each at least 1.

    The planner splits a global batch over emulated GPUs by their speeds with it (costmodel/batches.py); the
    PyTorch payload splits its global batch over its ranks (jobs/torchjob): with the planner's per-slot
    batches as weights and the full world it returns them unchanged; after a shrink the survivors' shares grow
    in the planner's proportions, so the global batch stays the same.
    """
    if total < len(weights):
        raise ValueError(f"global batch {total} is smaller than the {len(weights)} ranks")
    raw = [total * w / sum(weights) for w in weights]
    out = [max(1, int(r)) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True):
        if sum(out) >= total:
            break
        out[i] += 1
    while sum(out) > total:
        out[out.index(max(out))] -= 1
    return out


def _get(raw: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in raw:
        if default is ...:
            raise TaskSchemaError(f"task.json: {where}{key} is missing")
        return default
    value = raw[key]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise TaskSchemaError(f"task.json: {where}{key} must be a number, got {value!r}")
    if not isinstance(value, kind):
        raise TaskSchemaError(f"task.json: {where}{key} has type {type(value).__name__}, expected "
                              f"{getattr(kind, '__name__', kind)}")
    return value


def _opt(raw: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    return None if raw.get(key) is None else _get(raw, key, kind, where)


def _argv(raw: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    value = _opt(raw, key, list, "torch.")
    return None if value is None else tuple(str(a) for a in value)


def _training(raw: Mapping[str, Any]) -> TrainingSection:
    w = "training."
    batches = _get(raw, "batch_per_worker", list, w)
    if not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in batches):
        raise TaskSchemaError("task.json: training.batch_per_worker must be positive integers")
    # The controller writes every field; a hand-written task (the payload's own tests) may leave the
    # built-in job's defaults out.
    return TrainingSection(
        model=_get(raw, "model", str, w, "resnet"), hparam_set=_get(raw, "hparam_set", str, w, "resnet_cifar_15"),
        problem=_get(raw, "problem", str, w, "image_cifar10"), data_dir=_opt(raw, "data_dir", str, w),
        train_steps=_get(raw, "train_steps", int, w), batch_per_worker=tuple(batches),
        checkpoint_every=_get(raw, "checkpoint_every", int, w, 100), eval_every=_get(raw, "eval_every", int, w, 0),
        log_every=_get(raw, "log_every", int, w, 10), seed=_get(raw, "seed", int, w, 0))


def _torch(raw: Mapping[str, Any]) -> TorchSection:
    w = "torch."
    table = _get(raw, "sleep_table", list, w, [])
    try:
        sleep = tuple((float(a), float(b)) for a, b in table)
    except (TypeError, ValueError) as exc:
        raise TaskSchemaError("task.json: torch.sleep_table must be [batch, seconds] pairs") from exc
    env = _get(raw, "env", dict, w, {})
    try:
        slowdowns = tuple((int(a), float(f)) for a, f in _get(raw, "slowdowns", list, w, []))
    except (TypeError, ValueError) as exc:
        raise TaskSchemaError("task.json: torch.slowdowns must be [at_step, factor] pairs") from exc
    return TorchSection(
        rdzv_endpoint=_get(raw, "rdzv_endpoint", str, w), is_rdzv_host=_get(raw, "is_rdzv_host", bool, w, False),
        min_nodes=_get(raw, "min_nodes", int, w), max_nodes=_get(raw, "max_nodes", int, w),
        max_restarts=_get(raw, "max_restarts", int, w, 100), threads=_opt(raw, "threads", int, w),
        sleep_table=sleep, run=_argv(raw, "run"), setup=_argv(raw, "setup"),
        env={str(k): str(v) for k, v in env.items()}, resplit_every=_get(raw, "resplit_every", int, w, 0),
        slowdowns=slowdowns, pipeline=_pipeline(_opt(raw, "pipeline", dict, w)),
        nproc_per_node=_get(raw, "nproc_per_node", int, w, 1), **_fault_tolerance(raw))


def _fault_tolerance(raw: Mapping[str, Any]) -> dict[str, Any]:
    how = _get(raw, "fault_tolerance", str, "torch.", "torchrun")
    if how not in FAULT_TOLERANCE:
        raise TaskSchemaError(f"task.json: torch.fault_tolerance must be one of {', '.join(FAULT_TOLERANCE)}, "
                              f"got {how!r}")
    lighthouse = _opt(raw, "lighthouse", str, "torch.")
    if how == "torchft" and not lighthouse:
        raise TaskSchemaError("task.json: torch.lighthouse is missing (fault_tolerance torchft needs it)")
    return {"fault_tolerance": how, "lighthouse": lighthouse,
            "replica_host": _opt(raw, "replica_host", str, "torch."), "join": _get(raw, "join", bool, "torch.", False)}


def _pipeline(raw: Mapping[str, Any] | None) -> PipelineSection | None:
    if raw is None:
        return None
    try:
        section = PipelineSection(
            stage_slots=tuple(int(s) for s in raw["stage_slots"]),
            modules=tuple((int(a), int(b)) for a, b in raw["modules"]),
            micro_batches=int(raw["micro_batches"]),
            stage_sleep=tuple((float(f), float(b)) for f, b in raw.get("stage_sleep", [])))
    except (KeyError, TypeError, ValueError) as exc:
        raise TaskSchemaError(f"task.json: torch.pipeline is malformed ({exc})") from exc
    if len(section.modules) != len(section.stage_slots) or section.micro_batches < 1:
        raise TaskSchemaError("task.json: torch.pipeline needs one module range per stage and micro_batches >= 1")
    return section


def check_version(raw: object) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise TaskSchemaError("task.json must hold a JSON object")
    version = raw.get("version")
    if version != TASK_VERSION:
        raise UnknownVersionError(f"task.json version {version!r}; this payload reads version {TASK_VERSION} "
                                  "(the controller and the payload come from different releases)")
    return raw


def from_dict(raw: object) -> TaskConfig:
    """The checked task; TaskSchemaError (UnknownVersionError first) names what is wrong."""
    r = check_version(raw)
    cluster = _get(r, "cluster", dict, "")
    if not all(isinstance(v, list) and all(isinstance(a, str) for a in v) for v in cluster.values()):
        raise TaskSchemaError("task.json: cluster must map each role to a list of 'host:port'")
    emulation = _get(r, "emulation", dict, "", {})
    task = TaskConfig(
        job_id=_get(r, "job_id", str, ""), instance=_get(r, "instance", str, ""), mode=_get(r, "mode", str, ""),
        role=_get(r, "role", str, ""), index=_get(r, "index", int, ""),
        cluster={str(k): tuple(v) for k, v in cluster.items()}, storage=_get(r, "storage", str, ""),
        storage_uri=_get(r, "storage_uri", str, "", ""), training=_training(_get(r, "training", dict, "")),
        step_sleep_s=float(_get(emulation, "step_sleep_s", (int, float), "emulation.", 0.0)),
        gpu=_opt(r, "gpu", str, ""), torch=_torch(r["torch"]) if r.get("torch") is not None else None)
    if task.mode not in MODES:
        raise TaskSchemaError(f"task.json: mode must be one of {', '.join(MODES)}, got {task.mode!r}")
    if task.role not in ROLES:
        raise TaskSchemaError(f"task.json: role must be one of {', '.join(ROLES)}, got {task.role!r}")
    return task


def read(path: str | Path) -> Mapping[str, Any]:
    """task.json's object, version checked; the payloads' readers (jobs/tfjob, jobs/torchjob) start here too."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise TaskSchemaError(f"cannot read task file {path}: {exc}") from exc
    return check_version(raw)


def load(path: str | Path) -> TaskConfig:
    return from_dict(read(path))
