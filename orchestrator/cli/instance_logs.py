"""`orchestrator logs JOB --instance SLOT`: from the live instance, or the copy kept in the job's storage."""

from __future__ import annotations

import sys

from orchestrator.cli.render import console
from orchestrator.control.keep_logs import log_key
from orchestrator.model.errors import UserError
from orchestrator.model.status import InstanceStatus
from orchestrator.storage import open_storage
from orchestrator.store import queries
from orchestrator.store.db import open_session


def print_instance_log(job_ref: str, instance: str, *, follow: bool, lines: int) -> None:
    with open_session() as session:
        job = queries.get_job(session, job_ref)
        if job is None:
            raise UserError(f"no job '{job_ref}'; `orchestrator status` lists them")
        candidates = [i for i in job.instances if i.name == instance or i.slot == instance]
        if not candidates:
            raise UserError(f"--instance: no '{instance}' in {job.id}; it has: "
                            + ", ".join(sorted({i.slot for i in job.instances})))
        inst = max(candidates, key=lambda i: i.generation)
        gone = inst.status in (InstanceStatus.DELETED.value, InstanceStatus.DELETING.value)
        storage_uri, job_id, name = job.storage_uri, job.id, inst.name
    kept = open_storage(storage_uri, job_id).read_text(log_key(name)) if gone else None
    if kept is not None:
        sys.stdout.write(f"# {name} ({inst.status}): the log kept in the job's storage\n")
        sys.stdout.write("\n".join(kept.splitlines()[-lines:]) + "\n")
        return
    from orchestrator.control.logs import print_logs  # lazy: the providers and transports, only for a live log

    print_logs(job_ref, instance=name, follow=follow, lines=lines,
               say=lambda line: console.print(line, highlight=False, markup=False))
