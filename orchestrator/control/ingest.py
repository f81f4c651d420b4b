"""What a payload writes (metrics lines, result.json) is untrusted input: parse it defensively.

A malformed line is skipped and reported once per pass as an event; it never raises in the daemon, so a
payload cannot wedge its job (deadline, budget and cancel stay enforced whatever it wrote).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.costmodel.slots import Slot
from orchestrator.model.instances import Role
from orchestrator.storage.base import METRICS, RESULT, JobStorage
from orchestrator.store import queries
from orchestrator.store.models import Job, Metric

MAX_LINE = 64 * 1024  # a metrics line longer than this without a newline is garbage: skipped
MAX_READ = 4 * 1024 * 1024  # bytes of metrics ingested per pass (the rest on the next passes)
MAX_RESULT = 1024 * 1024
MAX_STEP = 2**31 - 1  # an INTEGER column on PostgreSQL


class BadPayloadOutput(ValueError):
    """A file the payload wrote cannot be used."""


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadPayloadOutput(f"{what} is {_short(value)}, not a number")
    if not 0 <= value <= MAX_STEP:
        raise BadPayloadOutput(f"{what} {value} is out of range")
    return int(value)


def _float(value: Any, what: str, default: float | None = None) -> float | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadPayloadOutput(f"{what} is {_short(value)}, not a finite number")
    return float(value)


def _label(value: Any, what: str, longest: int = 40) -> str | None:
    """A runtime / precision label as the payload reported it: a short plain token, or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= longest or not all(c.isalnum() or c in "+-_."
                                                                               for c in value):
        raise BadPayloadOutput(f"{what} is {_short(value)}, not a short label")
    return value


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Result:
    step: int | None
    accuracy: float | None
    loss: float | None
    raw: dict[str, Any]


def read_result(storage: JobStorage) -> tuple[Result | None, str | None]:
    """(result, None), (None, None) when there is none yet, or (None, why) when result.json is unusable."""
    try:
        data = storage.read_from(RESULT, 0)
    except (OSError, ValueError) as exc:
        return None, f"result.json cannot be read: {exc}"
    if not data:
        return None, None
    if len(data) > MAX_RESULT:
        return None, f"result.json is {len(data)} bytes (more than {MAX_RESULT})"
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"result.json is not JSON: {_short(str(exc), 120)}"
    if not isinstance(raw, dict):
        return None, f"result.json is {type(raw).__name__}, not an object"
    try:
        step = None if raw.get("step") is None else _int(raw.get("step"), "result.json step")
        return Result(step, _float(raw.get("accuracy"), "result.json accuracy"),
                      _float(raw.get("loss"), "result.json loss"), raw), None
    except BadPayloadOutput as exc:
        return None, str(exc)


def ingest_metrics(session: Session, job: Job, storage: JobStorage, slots: list[Slot]) -> None:
    """Append the chief's new metrics lines to the DB; the byte offset moves in the same transaction."""
    data = storage.read_from(METRICS, job.metrics_offset)[:MAX_READ]
    end = data.rfind(b"\n")
    if end < 0:
        if len(data) > MAX_LINE:  # one endless line: skip it rather than read it again every pass
            queries.note(session, job.id, "bad_metrics", f"skipped {len(data)} bytes of metrics.jsonl without "
                         "a newline")
            job.metrics_offset += len(data)
        return
    workers = {s.index: s for s in slots if s.role == Role.WORKER}
    rows: list[Metric] = []
    bad: list[str] = []
    for line in data[: end + 1].splitlines():
        if not line.strip():
            continue
        try:
            rows += _metric_rows(session, job, workers, line)
        except (BadPayloadOutput, ValueError, UnicodeDecodeError) as exc:
            bad.append(str(exc))
    if bad:
        queries.note(session, job.id, "bad_metrics", f"{len(bad)} malformed metrics line(s) skipped; first: "
                     f"{_short(bad[0], 300)}")
    queries.add_metrics(session, _unique(session, job.id, rows))
    job.metrics_offset += end + 1


def _unique(session: Session, job_id: str, rows: list[Metric]) -> list[Metric]:
    # (job, kind, step, worker, at) is unique in the table: a payload repeating a line must not abort the pass.
    if not rows:
        return rows
    steps = sorted({r.step for r in rows})
    existing = session.execute(select(Metric.kind, Metric.step, Metric.worker, Metric.at).where(
        Metric.job_id == job_id, Metric.step >= steps[0], Metric.step <= steps[-1])).all()
    seen: set[tuple[object, ...]] = {tuple(r) for r in existing}
    out = []
    for r in rows:
        key = (r.kind, r.step, r.worker, r.at)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _worker_gpus(w: dict[str, Any], index: int, slot: Slot | None, emulated: bool) -> int | None:
    """The GPUs a worker's batch ran on: as reported (PyTorch ranks), else its machine type's on a cloud (the TF
    job mirrors over them; an emulated GPU is one); None for one."""
    if w.get("gpus") is not None:
        return _int(w["gpus"], f"worker {index} gpus")
    return slot.gpu_count if not emulated and slot is not None and slot.gpu and slot.gpu_count > 1 else None


def _gpu_at(job: Job, index: int, at: float, slot: Slot | None) -> str | None:
    """The GPU type worker ``index`` ran at ``at``: its newest instance training by then (the deadline policy may
    have moved it to another type: policy.also_gpus), else the planned one."""
    gpus = [(i.training_at, i.gpu) for i in job.instances if i.role == Role.WORKER.value and i.slot_index == index
            and i.training_at is not None and i.training_at <= at and i.gpu is not None]
    return max(gpus)[1] if gpus else slot.gpu if slot else None


def _metric_rows(session: Session, job: Job, workers: dict[int, Slot], line: bytes) -> list[Metric]:
    rec = json.loads(line.decode("utf-8"))
    if not isinstance(rec, dict):
        raise BadPayloadOutput(f"a line is {type(rec).__name__}, not an object")
    kind = rec.get("kind")
    step = _int(rec.get("step", 0), f"{kind} step")
    at = _float(rec.get("t"), "t", queries.clock_of(session).time())
    assert at is not None
    if kind == "step":
        runtime, precision = _label(rec.get("runtime"), "runtime"), _label(rec.get("precision"), "precision", 8)
        rows = [Metric(job_id=job.id, kind="step", worker=-1, step=step, loss=_float(rec.get("loss"), "loss"),
                       examples_per_s=_float(rec.get("examples_per_s"), "examples_per_s"), at=at,
                       runtime=runtime, precision=precision)]
        per_worker = rec.get("workers") or {}
        if not isinstance(per_worker, dict):
            raise BadPayloadOutput("workers is not an object")
        for key, w in per_worker.items():
            index = _int(int(key), "worker index")
            if not isinstance(w, dict):
                raise BadPayloadOutput(f"worker {index} is not an object")
            slot = workers.get(index)
            # The batch the worker ran (elastic changes and re-splits move it), else the planned one.
            ran = _int(w["batch"], f"worker {index} batch") if w.get("batch") is not None else None
            rows.append(Metric(job_id=job.id, kind="worker", worker=index, gpu=_gpu_at(job, index, at, slot),
                               batch=ran or (slot.batch if slot else None), step=step,
                               examples_per_s=_float(w.get("examples_per_s"), "examples_per_s"),
                               step_time_s=_float(w.get("step_time_s"), "step_time_s"), at=at,
                               runtime=runtime, precision=precision,
                               compute_s=_float(w.get("compute_s"), "compute_s"),
                               gpus=_worker_gpus(w, index, slot, emulated=job.provider == "local")))
        job.final_step = max(job.final_step or 0, step)
        return rows
    if kind == "eval":
        return [Metric(job_id=job.id, kind="eval", worker=-1, step=step, loss=_float(rec.get("loss"), "loss"),
                       accuracy=_float(rec.get("accuracy"), "accuracy"), at=at)]
    if kind == "checkpoint":
        if rec.get("reason") == "notice":
            queries.note(session, job.id, "checkpoint",
                         f"checkpoint at step {step} after a notice (a preemption, or a deadline hop's drain)",
                         now=at)
        return [Metric(job_id=job.id, kind="checkpoint", worker=-1, step=step,
                       step_time_s=_float(rec.get("seconds"), "seconds"), at=at)]
    if kind in ("quorum", "heal"):
        what, reason = _quorum_event(rec, step)
        queries.note(session, job.id, what, reason, now=at)
        return []
    if kind == "start" and rec.get("resumed"):
        queries.note(session, job.id, "resumed", f"training resumed from the checkpoint at step {step}", now=at)
    return []


QUORUM_EVENTS = ("quorum", "heal")  # torchft replica groups (jobs/torchjob/ft_step.py): report's quorum_changes


def _quorum_event(rec: dict[str, Any], step: int) -> tuple[str, str]:
    """A torchft quorum change or heal line as the event's (kind, reason): ``quorum 3 -> 2 at step S; survivors'
    pause P s`` and ``heal worker-2 from worker-0 in T s at step S``."""
    if rec.get("kind") == "quorum":
        before, after = _int(rec.get("world_before"), "world_before"), _int(rec.get("world_after"), "world_after")
        pause = _float(rec.get("survivors_pause_s"), "survivors_pause_s")
        tail = f"; survivors' pause {pause:.3f} s" if pause is not None else ""
        return "quorum", f"quorum {before} -> {after} at step {step}{tail}"
    worker, source = _int(rec.get("worker"), "worker"), _int(rec.get("from_worker"), "from_worker")
    seconds = _float(rec.get("heal_s"), "heal_s", 0.0)
    return "heal", f"heal worker-{worker} from worker-{source} in {seconds:.3f} s at step {step}"
