"""`orchestrator gc`: labelled instances whose job is finished or unknown — the last defence against
paying for forgotten VMs."""

from __future__ import annotations

from orchestrator.cli.render import console, table
from orchestrator.control.backends import Backend, backend_for
from orchestrator.control.driver import job_spec
from orchestrator.providers.base import ObservedInstance
from orchestrator.store.db import open_session
from orchestrator.store.models import Job
from orchestrator.store.status import ACTIVE_JOB


def _backends() -> list[Backend]:
    """Every backend that any recorded job used (each listed once)."""
    from orchestrator.spec import LocalProvider
    from orchestrator.spec import validate_spec as _validate

    seen: dict[str, Backend] = {}
    with open_session() as session:
        for (spec_yaml,) in session.query(Job.spec_yaml).distinct():
            try:
                b = backend_for(job_spec(spec_yaml))
            except Exception:  # a job whose provider cannot be reached now is swept another time
                continue
            seen.setdefault(b.key, b)
    if not any(k.startswith("local:") for k in seen):
        b = backend_for(_validate({"name": "gc", "provider": LocalProvider().model_dump(),
                                   "cluster": {"workers": [{"gpu": "k80"}]}}))
        seen.setdefault(b.key, b)
    return list(seen.values())


def find_orphans() -> list[tuple[Backend, ObservedInstance]]:
    """Labelled instances whose job is not active: finished, or unknown to the DB.

    The cloud is listed before the DB is read: a job is always recorded before its first instance is
    created, so an instance that shows up in the list belongs to a job the later DB read already sees.
    """
    # Backends may share what they list (local jobs with different time scales share one folder); an
    # instance name is unique, so each instance is counted once.
    by_name = {inst.name: (backend, inst) for backend in _backends() for inst in backend.provider.list(None)}
    listed = list(by_name.values())
    if not listed:
        return []
    with open_session() as session:
        active = {j for (j,) in session.query(Job.id).filter(Job.status.in_([s.value for s in ACTIVE_JOB]))}
    return [(backend, inst) for backend, inst in listed if inst.job_id not in active]


def gc_command(delete: bool) -> None:
    orphans = find_orphans()
    console.print(table(f"{len(orphans)} instance(s) whose job is finished or unknown",
                        ["instance", "job", "role", "zone", "state"],
                        [[o.name, o.job_id, o.role.value, o.zone, o.state.value] for _, o in orphans]))
    if not orphans:
        return
    if not delete:
        console.print("run `orchestrator gc --yes` to delete them")
        return
    for backend, o in orphans:
        backend.provider.delete(o.name, o.zone)
        console.print(f"deleted {o.name}")
