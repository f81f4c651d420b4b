"""The controller's side of the PyTorch payload (jobs/torchjob): task.json's ``torch`` section, the node
command, where the elastic rendezvous lives, and the payload's world / checkpoint events into the DB.

The c10d rendezvous store is hosted by the torchrun agent of one worker slot that is never revoked: the
first on-demand worker (worker 0 when every worker is spot, a spec the docs advise against). Its address
is that slot's current instance and port; a replacement keeps the port.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.costmodel.batches import trained_gpus
from orchestrator.costmodel.pipeline_plan import plan_pipeline
from orchestrator.costmodel.planner import launch_strategy, plan
from orchestrator.costmodel.slots import DEFAULT_BATCH, Slot
from orchestrator.model.catalog import load_catalog
from orchestrator.model.instances import Role
from orchestrator.model.spec import JobSpec
from orchestrator.model.status import EndReason, InstanceStatus, JobStatus
from orchestrator.model.task import PipelineSection, TorchSection
from orchestrator.model.torch_spec import argv, is_pytorch, is_run_job, replica_groups
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.storage.base import JobStorage
from orchestrator.store import queries
from orchestrator.store.models import Event, Instance, Job

EVENTS = "torch_events.jsonl"  # appended by the payload's rank 0: world changes, checkpoints on notice
EVENT_KINDS = ("world", "shrink", "grow", "ckpt_on_notice", "resplit")
MAX_RESTARTS = 1000  # torchrun restarts of the worker group per node (each membership change is one)


def rendezvous_slot(slots: tuple[Slot, ...] | list[Slot]) -> Slot | None:
    workers = [s for s in slots if s.role == Role.WORKER]
    return next((s for s in workers if not s.spot), workers[0] if workers else None)


def torch_view(spec: JobSpec, slots: list[Slot]) -> dict[str, Any]:
    """JobView fields for the reconciler (elastic world, rendezvous slot); empty for other payloads."""
    if not is_pytorch(spec):
        return {}
    if uses_torchft(spec):
        return {"elastic": True, "rdzv_slot": None}  # the Lighthouse is with the controller: any node may go
    host = rendezvous_slot(slots)
    return {"elastic": True, "rdzv_slot": host.name if host is not None else None}


def node_argv(python: str) -> list[str]:
    return [python, "jobs/torchjob/node.py", "--task", "task.json"]


def _current(instances: list[Instance], slot: Slot) -> Instance | None:
    insts = [i for i in instances if i.slot == slot.name and i.end_reason != EndReason.CREATE_FAILED.value]
    return max(insts, key=lambda i: i.generation, default=None)


def torch_section(spec: JobSpec, slots: list[Slot], instances: list[Instance], inst: Instance, global_batch: int,
                  emulation_sleep: Callable[[str | None, int], float],
                  dropped: frozenset[str] = frozenset(), host_gpus: int | None = None,
                  lighthouse: str | None = None, replica_host: str | None = None, join: bool = False) -> TorchSection:
    """task.json's ``torch`` section for one node (see jobs/torchjob/task.py). ``dropped``: the stages a pipeline was
    re-partitioned without (control/stage_loss.py): its stages and its world are the other workers. ``host_gpus``:
    the GPUs of the host the node was placed on where its machine type does not say (an ssh inventory host's).
    ``lighthouse``: the torchft Lighthouse's address of a job on replica groups (control/lighthouse.py), as this node
    reaches it; ``replica_host``: where its peers reach it (a remote node's internal address); ``join``: it starts
    beside groups that train (``joins``)."""
    host_slot = rendezvous_slot(slots)
    host = _current(instances, host_slot) if host_slot is not None else None
    address = host.host if host is not None and host.host else "127.0.0.1"
    port = host.port if host is not None and host.port else 29500
    workers = [s for s in slots if s.role == Role.WORKER and s.name not in dropped]
    planned = inst.batch or DEFAULT_BATCH
    points = sorted({1, max(1, planned // 2), planned, planned * 2, global_batch})
    training = spec.training
    run, setup = argv(getattr(training, "run", None)), argv(getattr(training, "setup", None))
    pipeline = pipeline_section(spec, [s for s in slots if s.name not in dropped], global_batch)
    local = spec.provider.as_local()
    slot = next((s for s in slots if s.name == inst.slot), None)
    slowdowns = tuple((d.at_step, d.factor) for d in (local.slowdowns if local else [])
                      if slot is not None and slot.role == Role.WORKER and d.worker == slot.index)
    return TorchSection(
        rdzv_endpoint=f"{address}:{port}",
        is_rdzv_host=host_slot is not None and inst.slot == host_slot.name,
        # A pipeline needs every stage: the world waits for a lost stage's replacement.
        min_nodes=len(workers) if pipeline else min(getattr(training, "min_workers", None) or 1, len(workers)),
        max_nodes=len(workers),
        max_restarts=MAX_RESTARTS,
        threads=1 if spec.provider.emulates_gpus else None,
        sleep_table=tuple((float(b), emulation_sleep(inst.gpu, b)) for b in points),
        run=None if run is None else tuple(run),
        setup=None if setup is None else tuple(setup),
        env={},  # the spec's env: and secrets go to the process environment, not to this file
        resplit_every=0 if run is not None or pipeline else int(getattr(training, "resplit_every", 0) or 0),
        slowdowns=slowdowns,
        pipeline=pipeline,
        nproc_per_node=_ranks(spec, slot, pipeline, host_gpus, planned),
        fault_tolerance="torchft" if lighthouse is not None else "torchrun",
        lighthouse=lighthouse,
        replica_host=replica_host,
        join=lighthouse is not None and join,
    )


def joins(job_status: str, instances: list[Instance], inst: Instance) -> bool:
    """Whether ``inst``'s task joins replica groups that train (a replacement, a grown worker): another worker trains
    as it starts, past the job's start (a fresh job starts every task in one pass, each beside the ones before)."""
    return job_status != JobStatus.PROVISIONING and any(
        i.name != inst.name and i.role == Role.WORKER.value and i.status == InstanceStatus.TRAINING for i in instances)


def uses_torchft(spec: JobSpec) -> bool:
    """A data-parallel PyTorch job whose nodes are torchft replica groups (its Lighthouse runs here)."""
    return replica_groups(spec) and not is_pipeline(spec)


def _ranks(spec: JobSpec, slot: Slot | None, pipeline: PipelineSection | None, host_gpus: int | None,
           planned: int) -> int:
    """The node's data-parallel ranks: one per GPU it trains on (a pipeline stage and a non-worker: one), never more
    than the examples of its batch."""
    if pipeline is not None or slot is None or slot.role != Role.WORKER:
        return 1
    return max(1, min(planned, host_gpus or trained_gpus(spec, load_catalog(), slot.machine_type)))


def pipeline_section(spec: JobSpec, slots: list[Slot], global_batch: int) -> PipelineSection | None:
    """The stages of a built-in job with ``training.parallelism: pipeline``, or ``auto`` where the planner chooses a
    pipeline or a hybrid for the cluster (None: data parallel)."""
    if not is_pipeline(spec):
        return None
    workers = [(s.index, s.gpu or "k80", s.machine_type) for s in slots if s.role == Role.WORKER]
    found = plan_pipeline(spec, workers, global_batch, steps=step_model_for(spec))
    if found is None:
        raise ValueError("no pipeline of these GPUs holds the model in memory")
    return PipelineSection(stage_slots=found.stage_slots, modules=found.modules, micro_batches=found.micro_batches,
                           stage_sleep=found.stage_sleep)


def is_pipeline(spec: JobSpec) -> bool:
    """A built-in job run as a pipeline: ``parallelism: pipeline``, or ``auto`` where the planner chooses one."""
    parallelism = getattr(spec.training, "parallelism", "data")
    if parallelism == "data" or is_run_job(spec) or not is_pytorch(spec):
        return False
    return parallelism != "auto" or _planned_strategy(spec) != "data"


_PLANNED: dict[str, str] = {}


def _planned_strategy(spec: JobSpec) -> str:
    """What the planner runs the pinned cluster as: data or pipeline (each node's task asks; planned once a spec).
    Emulated GPUs weigh no strategy under ``auto`` (costmodel.planner.chosen_strategy)."""
    if spec.provider.emulates_gpus or spec.cluster is None:
        return "data"
    key = spec.model_dump_json()
    if key not in _PLANNED:
        _PLANNED[key] = launch_strategy(spec, plan(spec).chosen) or "data"
    return _PLANNED[key]


def push_paths(spec: JobSpec) -> list[Any]:
    """The user's files for a run: job (the payload's jobs/ goes too)."""
    return list(getattr(spec.training, "files", [])) if is_run_job(spec) else []


def ingest_events(session: Session, job: Job, storage: JobStorage) -> None:
    """New lines of torch_events.jsonl become events; the count already recorded is the offset (idempotent)."""
    data = storage.read_text(EVENTS)
    if not data:
        return
    done = session.scalar(select(func.count()).select_from(Event).where(
        Event.job_id == job.id, Event.entity == "note", Event.to_status.in_(EVENT_KINDS))) or 0
    lines = [ln for ln in data.splitlines() if ln.strip()]
    if data and not data.endswith("\n"):
        lines = lines[:-1]  # being written
    for line in lines[done:]:
        what, reason, at = _event(line)
        queries.note(session, job.id, what, reason, now=at)


def _event(line: str) -> tuple[str, str, float | None]:
    try:
        rec = json.loads(line)
        if not isinstance(rec, dict):
            raise ValueError("not an object")
        at = float(rec["t"])
        step = int(rec["step"])
        if rec.get("kind") == "resplit":
            return ("resplit", f"re-split at step {step}: batches by slot {_slot_ints(rec['batches'])} from "
                    f"{_slot_ints(rec['previous'])}; compute s by slot {_slot_floats(rec['compute_s'])}"[:500], at)
        if rec.get("kind") == "ckpt_on_notice":
            return ("ckpt_on_notice", f"checkpoint on a notice (a preemption, or a deadline hop's drain) at step "
                    f"{step}: saved in "
                    f"{float(rec['seconds']):.3f} s by {int(rec['world_size'])} ranks (torch.distributed.checkpoint)",
                    at)
        world, previous = int(rec["world_size"]), int(rec["previous"])
    except (ValueError, KeyError, TypeError) as exc:
        return "world", f"unreadable torch event line skipped: {str(exc)[:100]}", None
    what = "shrink" if 0 < world < previous else "grow" if world > previous > 0 else "world"
    batches = rec.get("batches")
    tail = f"; batches by slot {json.dumps(batches, sort_keys=True)}" if isinstance(batches, dict) else ""
    return what, f"world {previous} -> {world} at step {step}{tail}"[:500], at


def _slot_ints(raw: object) -> str:
    if not isinstance(raw, dict):
        raise ValueError("not an object of slots")
    return json.dumps({str(k): int(v) for k, v in raw.items()}, sort_keys=True)


def _slot_floats(raw: object) -> str:
    if not isinstance(raw, dict):
        raise ValueError("not an object of slots")
    return json.dumps({str(k): round(float(v), 4) for k, v in raw.items()}, sort_keys=True)
