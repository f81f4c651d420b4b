"""`orchestrator gc`, displayed: the orphans as a table, then what was deleted (the work is control.gc's)."""

from __future__ import annotations

from orchestrator.cli.render import console, table
from orchestrator.clock import WALL
from orchestrator.control.gc import find_orphans, finish_pending_deletes, mark_deleted
from orchestrator.store.db import open_session


def gc_command(delete: bool) -> None:
    unchecked: dict[str, str] = {}
    orphans = find_orphans(unchecked)
    console.print(table(f"{len(orphans)} instance(s) whose job is finished or unknown",
                        ["instance", "job", "role", "zone", "state"],
                        [[o.name, o.job_id, o.role.value, o.zone, o.state.value] for _, o in orphans]))
    for why, where in unchecked.items():
        console.print(f"could not check {where}: {why}", highlight=False, markup=False)
    if delete:
        for backend, o in orphans:
            backend.provider.delete(o.name, o.zone)
            with open_session() as session:
                mark_deleted(session, o.name, f"deleted by `orchestrator gc` at {WALL.now().strftime('%H:%M:%S')}")
            console.print(f"deleted {o.name}")
        for problem in finish_pending_deletes():
            console.print(f"pending delete not done: {problem}", highlight=False, markup=False)
    elif orphans:
        console.print("run `orchestrator gc --yes` to delete them")
