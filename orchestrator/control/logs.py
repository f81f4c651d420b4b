"""`orchestrator logs`: the job's events and metrics, or one instance's task log."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime

from orchestrator.clock import WALL, Clock
from orchestrator.control.execute import TASK
from orchestrator.model.errors import UserError
from orchestrator.model.spec import stored_spec as job_spec
from orchestrator.model.status import FINAL_JOB
from orchestrator.providers.registry import backend_for
from orchestrator.store import queries
from orchestrator.store.db import open_session


def print_logs(job_ref: str, *, instance: str | None, follow: bool, lines: int,
               say: Callable[[str], None] = print, clock: Clock = WALL) -> None:
    """The job's events (one line each, through ``say``: the CLI passes its console) or a task log."""
    with open_session() as session:
        job = queries.get_job(session, job_ref)
        if job is None:
            raise UserError(f"no job '{job_ref}'; `orchestrator status` lists them")
        job_id = job.id
        if instance is None:
            shown = 0
            while True:
                session.expire_all()
                evs = queries.events(session, job_id)
                start = max(shown, len(evs) - lines) if shown == 0 else shown
                for e in evs[start:]:
                    say(f"{datetime.fromtimestamp(e.at).strftime('%H:%M:%S')} {e.entity:8} "
                        f"{(e.from_status or ''):12} -> {e.to_status:14} {e.reason or ''}")
                shown = len(evs)
                job = queries.get_job(session, job_id)
                if not follow or job is None or job.status in FINAL_JOB:
                    return
                clock.sleep(1)
        candidates = [i for i in job.instances if i.name == instance or i.slot == instance]
        if not candidates:
            raise UserError(f"--instance: no '{instance}' in {job_id}; it has: "
                            + ", ".join(sorted({i.slot for i in job.instances})))
        inst = max(candidates, key=lambda i: i.generation)
        backend = backend_for(job_spec(job.spec_yaml))
        observed = {o.name: o for o in backend.provider.list([job_id])}
        if inst.name not in observed:
            raise UserError(f"{inst.name} is {inst.status}; its disk (and log) went with it")
        ep = backend.endpoint(observed[inst.name])
        data = backend.transport.read_log(ep, TASK)
        tail = b"\n".join(data.splitlines()[-lines:])
        sys.stdout.write(tail.decode(errors="replace") + "\n")
        offset = len(data)
        while follow:
            clock.sleep(1)
            more = backend.transport.read_log(ep, TASK, offset)
            offset += len(more)
            sys.stdout.write(more.decode(errors="replace"))
            sys.stdout.flush()
