"""`orchestrator status [JOB]`: every job, or one job's instances and recent events, as a table, JSON or CSV."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.cli.listing import Col, print_csv, print_json, print_table
from orchestrator.cli.render import console, duration, money, pct
from orchestrator.clock import WALL
from orchestrator.control.live_pace import pace_excursions
from orchestrator.model.errors import UserError
from orchestrator.store import queries
from orchestrator.store.db import open_session

RECENT_EVENTS = 15


def _clock(ts: float | None) -> str:
    """Day and time: the date only when it is not today (the column stays narrow)."""
    if ts is None:
        return ""
    local = time.localtime(ts)
    now = time.localtime(WALL.time())
    today = now.tm_yday == local.tm_yday and now.tm_year == local.tm_year
    return time.strftime("%H:%M:%S" if today else "%m-%d %H:%M", local)


def print_jobs(fmt: str) -> None:
    with open_session() as session:
        rows = queries.job_summaries(session)
    if fmt == "json":
        print_json(rows)
    elif fmt == "csv":
        print_csv(rows)
    else:
        print_table("jobs", [Col("job", whole=True), Col("status"), Col("step", right=True),
                             Col("acc.", right=True), Col("wall", right=True), Col("cost", right=True),
                             Col("r/r/r", right=True), Col("cluster", floor=0)],
                    [[r["job_id"], r["status"], f"{r['final_step'] or 0}/{r['train_steps']}", pct(r["accuracy"]),
                      duration(r["wall_time_s"]), money(r["cost_usd"]),
                      f"{r['revocations']}/{r['replacements']}/{r['restarts']}", r["cluster_shape"]] for r in rows],
                    note="r/r/r: revocations / replacements / restarts; every column: --format json or csv"
                    if rows else "no jobs yet: `orchestrator launch SPEC`")


INSTANCE_KEYS = ("name", "slot", "gpu", "zone", "spot", "status", "end_reason", "price_per_hour", "requested_at",
                 "deleted_at")


def _instance_record(i: Any) -> dict[str, Any]:
    return {k: getattr(i, k) for k in INSTANCE_KEYS}


def print_job(ref: str, fmt: str) -> None:
    with open_session() as session:
        found = queries.get_job(session, ref)
        if found is None:
            raise UserError(f"no job '{ref}'; `orchestrator status` lists them")
        summary = queries.job_summaries(session, [found.id])[0]
        rows = queries.job_instances(session, found.id)
        instances = [_instance_record(i) for i in rows]
        names = {i.id: (i.slot, i.name) for i in rows}
        evs: list[dict[str, Any]] = []
        for e in queries.events(session, found.id):
            slot, name = names.get(e.instance_id or -1, (None, None))
            evs.append({"at": e.at, "entity": e.entity, "slot": slot, "instance": name, "from": e.from_status,
                        "to": e.to_status, "reason": e.reason})
        step, eps = queries.latest_step(session, found.id)
        pace = pace_excursions(session, found.id)  # the daemon's decision (control/live_pace.py), shown here
        head = (f"{found.id} {found.status}" + (f" ({found.status_reason})" if found.status_reason else "")
                + f": step {step}/{found.train_steps}, {eps or 0:.1f} examples/s at its last log, cost so far "
                f"{money(summary['cost_usd'])}" + (f", accuracy {pct(found.accuracy)}" if found.accuracy else ""))
    if fmt == "json":
        print_json({"summary": summary, "instances": instances, "events": evs, "pace_outside_plan": pace})
        return
    if fmt == "csv":
        print_csv(instances, keys=INSTANCE_KEYS)
        return
    console.print(head, highlight=False, markup=False)  # word-wrapped: the id comes first, whole
    for reason in pace:
        console.print(f"pace outside the plan: {reason}", highlight=False, markup=False)
    print_table("instances", [Col("name", whole=True), Col("slot"), Col("gpu"), Col("bill"), Col("$/h", right=True),
                              Col("status"), Col("ended", floor=0)],
                [[i["name"], i["slot"], i["gpu"] or "—", "spot" if i["spot"] else "od", f"{i['price_per_hour']:.4f}",
                  i["status"], i["end_reason"] or ""] for i in instances])
    print_table(f"recent events (last {RECENT_EVENTS}; all: --format json)",
                [Col("at"), Col("who", whole=True), Col("change"), Col("reason", floor=0)],
                [[_clock(e["at"]), e["slot"] or e["entity"], f"{e['from']} -> {e['to']}" if e["from"] else e["to"],
                  e["reason"] or ""] for e in evs[-RECENT_EVENTS:]],
                note="bill: spot or od (on-demand); times, zones and full reasons: --format json")
