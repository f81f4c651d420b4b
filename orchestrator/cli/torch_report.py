"""`orchestrator report`'s per-job training section: framework, world-size timeline, examples/s,
accuracy and cost, from the events and metrics the daemon stored (PyTorch world shrink / grow events)."""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

import yaml
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.control.stage_loss import STAGE_LOSS_EVENTS
from orchestrator.store.models import Event, Instance, Job, Metric

_WORLD = re.compile(r"world (\d+) -> (\d+) at step (\d+)")
_RESPLIT = re.compile(r"re-split at step (\d+): batches by slot (\{[^}]*\}) from (\{[^}]*\})"
                      r"(?:; compute s by slot (\{[^}]*\}))?")


def framework_of(spec_yaml: str) -> str:
    try:
        training = (yaml.safe_load(spec_yaml) or {}).get("training") or {}
    except yaml.YAMLError:
        return "?"
    if training.get("job") == "command":
        return "command"
    if training.get("job") == "run" or "run" in training:
        return "pytorch (run:)"
    return str(training.get("framework", "tensorflow"))


def world_timeline(session: Session, job_id: str) -> list[tuple[int, int]]:
    """[(step, world size), ...] from the payload's world events (PyTorch); empty for other payloads."""
    rows = session.scalars(select(Event).where(Event.job_id == job_id, Event.entity == "note",
                                               Event.to_status.in_(("world", "shrink", "grow")))
                           .order_by(Event.at, Event.id))
    out: list[tuple[int, int]] = []
    for ev in rows:
        m = _WORLD.match(ev.reason or "")
        if m:
            out.append((int(m.group(3)), int(m.group(2))))
    return out


def resplits(session: Session, job_id: str) -> list[dict[str, Any]]:
    """Each re-split of a running synchronous job's batch (jobs/torchjob/rebalance.py): when, at which step, the
    per-worker batches before and after, and the compute seconds per step each worker measured."""
    rows = session.scalars(select(Event).where(Event.job_id == job_id, Event.entity == "note",
                                               Event.to_status == "resplit").order_by(Event.at, Event.id))
    out: list[dict[str, Any]] = []
    for ev in rows:
        m = _RESPLIT.match(ev.reason or "")
        if m is None:
            continue
        out.append({"at": ev.at, "step": int(m.group(1)), "batches": json.loads(m.group(2)),
                    "previous": json.loads(m.group(3)),
                    "compute_s": json.loads(m.group(4)) if m.group(4) else None})
    return out


_QUORUM = re.compile(r"quorum (\d+) -> (\d+) at step (\d+)(?:; survivors' pause ([0-9.]+) s)?")
_HEAL = re.compile(r"heal worker-(\d+) from worker-(\d+) in ([0-9.]+) s at step (\d+)")


def quorum_changes(session: Session, job_id: str) -> list[dict[str, Any]]:
    """Each quorum change of a job on torchft replica groups: the step, the groups before and after, the survivors'
    pause from the loss to their next step, and for a group that joined, the worker it healed from and how long."""
    rows = session.scalars(select(Event).where(Event.job_id == job_id, Event.entity == "note",
                                               Event.to_status.in_(("quorum", "heal"))).order_by(Event.at, Event.id))
    changes: list[dict[str, Any]] = []
    heals: dict[int, tuple[int, float]] = {}
    for ev in rows:
        if (q := _QUORUM.match(ev.reason or "")) is not None:
            changes.append({"step": int(q.group(3)), "world_before": int(q.group(1)), "world_after": int(q.group(2)),
                            "survivors_pause_s": float(q.group(4)) if q.group(4) else None,
                            "healed_from": None, "heal_s": None})
        elif (h := _HEAL.match(ev.reason or "")) is not None:
            heals[int(h.group(4))] = (int(h.group(2)), float(h.group(3)))
    for change in changes:  # a heal belongs to the quorum that grew at its step
        if change["world_after"] > change["world_before"] and change["step"] in heals:
            source, seconds = heals[change["step"]]
            change["healed_from"], change["heal_s"] = f"worker-{source}", seconds
    return changes


def stage_losses(session: Session, job_id: str) -> list[dict[str, Any]]:
    """Each lost pipeline stage: waited for or re-partitioned without, with both options' predicted time and cost
    (decide.stage_loss_step)."""
    rows = session.execute(select(Event.at, Event.to_status, Event.reason, Instance.name)
                           .outerjoin(Instance, Instance.id == Event.instance_id)
                           .where(Event.job_id == job_id, Event.entity == "note",
                                  Event.to_status.in_(STAGE_LOSS_EVENTS)).order_by(Event.at, Event.id)).all()
    return [{"at": at, "instance": name, "action": "repartition" if what == "repartition" else "wait",
             "reason": reason} for at, what, reason, name in rows]


def worker_batches(session: Session, job_id: str) -> dict[str, dict[str, int | None]]:
    """Per worker slot: the batch the planner gave it, and the batch it last reported running (elastic shrink /
    grow and re-splits move it)."""
    planned = {int(i): int(b or 0) for i, b in session.execute(select(Instance.slot_index, Instance.batch).where(
        Instance.job_id == job_id, Instance.role == "worker", Instance.batch.is_not(None))).all()}
    reported = {int(w): int(b or 0) for w, b in session.execute(select(Metric.worker, Metric.batch).where(
        Metric.job_id == job_id, Metric.kind == "worker", Metric.batch.is_not(None)).order_by(Metric.at)).all()}
    return {str(w): {"planned": planned.get(w), "reported": reported.get(w)}
            for w in sorted(set(planned) | set(reported))}


def batch_line(session: Session, job_id: str) -> str | None:
    """Each worker's batch as planned beside the batch it last reported running, and their sums (the global
    batch); None for a job with neither."""
    batches = worker_batches(session, job_id)
    if not batches:
        return None

    def total(key: str) -> str:
        values = [b[key] for b in batches.values()]
        return "—" if any(v is None for v in values) else str(sum(v or 0 for v in values))

    each = ", ".join(f"w{w} {'—' if b['planned'] is None else b['planned']} → "
                     f"{'—' if b['reported'] is None else b['reported']}" for w, b in batches.items())
    return f"batch planned → reported: {each}; global {total('planned')} → {total('reported')}"


def training_section(session: Session, rows: list[dict[str, Any]]) -> list[str]:
    """One line per job: framework, world sizes over steps, mean examples/s, accuracy, cost."""
    lines = []
    for r in rows:
        job = session.get(Job, r["job_id"])
        if job is None:
            continue
        eps = session.scalar(select(func.avg(Metric.examples_per_s)).where(
            Metric.job_id == job.id, Metric.kind == "step", Metric.examples_per_s.is_not(None)))
        timeline = world_timeline(session, job.id)
        world = " → ".join(f"{w}@{s}" for s, w in timeline) or "—"
        acc = f"{r['accuracy']:.4f}" if isinstance(r.get("accuracy"), int | float) else "—"
        cost = f"${r['cost_usd']:.4f}" if isinstance(r.get("cost_usd"), int | float) else "—"
        rate = f"{eps:.1f}" if eps is not None else "—"
        # Two short lines, so the report still fits 80 columns.
        lines.append(f"{job.id}: {framework_of(job.spec_yaml)}; world (size@step) {world}")
        lines.append(f"  {rate} examples/s (mean of its step logs); accuracy {acc}; cost {cost}")
        if (batch := batch_line(session, job.id)) is not None:  # what ran beside what was planned
            lines += textwrap.wrap(batch, 76, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
        for d in stage_losses(session, job.id):  # a pipeline's lost stages, wrapped to fit 80 columns
            lines += textwrap.wrap(d["reason"] or "", 76, initial_indent="  ", subsequent_indent="    ",
                                   break_on_hyphens=False)
    return lines
