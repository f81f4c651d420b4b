"""`orchestrator logs JOB --format json|csv`: the job's events and training metrics as records, oldest first."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from orchestrator.cli.listing import print_csv, print_json
from orchestrator.model.errors import UserError
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Metric

KEYS = ("at", "kind", "slot", "instance", "entity", "from_status", "to_status", "reason", "step", "loss", "accuracy",
        "examples_per_s", "step_time_s")


def log_records(job_ref: str, lines: int | None) -> list[dict[str, Any]]:
    """Every event, and the newest ``lines`` whole-cluster metrics (as `logs` prints them), by time."""
    with open_session() as session:
        job = queries.get_job(session, job_ref)
        if job is None:
            raise UserError(f"no job '{job_ref}'; `orchestrator status` lists them")
        names = {i.id: (i.slot, i.name) for i in queries.job_instances(session, job.id)}
        out: list[dict[str, Any]] = []
        for e in queries.events(session, job.id):
            slot, name = names.get(e.instance_id or -1, (None, None))
            out.append({"at": e.at, "kind": "event", "slot": slot, "instance": name, "entity": e.entity,
                        "from_status": e.from_status, "to_status": e.to_status, "reason": e.reason})
        metrics = list(session.scalars(select(Metric).where(Metric.job_id == job.id, Metric.kind != "worker")
                                       .order_by(Metric.id)))
        for m in metrics[-lines:] if lines else metrics:
            out.append({"at": m.at, "kind": m.kind, "step": m.step, "loss": m.loss, "accuracy": m.accuracy,
                        "examples_per_s": m.examples_per_s, "step_time_s": m.step_time_s})
    out.sort(key=lambda r: (r["at"], r["kind"] != "event"))
    return out


def print_log_records(job_ref: str, lines: int | None, fmt: str) -> None:
    records = log_records(job_ref, lines)
    if fmt == "json":
        print_json(records)
    else:
        print_csv(records, keys=KEYS)
