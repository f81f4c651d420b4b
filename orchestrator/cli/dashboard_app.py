"""The dashboard's Flask app (read-only): the jobs table, and per job its progress, the timeline / cost /
throughput plot (the same module as ``report --plot``), instances, events and metrics. Pages of active jobs
refresh themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Flask, Response, abort, render_template
from sqlalchemy import select

from orchestrator.cli.plots import gather, render
from orchestrator.cli.progress import event_parts, progress
from orchestrator.cli.render import duration, money, pct, when
from orchestrator.model.status import FINAL_JOB
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Job, Metric

REFRESH_S = 5
EVENTS_SHOWN = 200
METRICS_SHOWN = 40


def create_app(db_url: str | None = None) -> Flask:
    """The app over the results DB at ``db_url`` (default: the configured one)."""
    app = Flask(__name__, template_folder=str(Path(__file__).parent / "templates"))
    app.jinja_env.filters.update(money=money, duration=duration, pct=pct, when=when)

    @app.errorhandler(404)
    def not_found(error: Any) -> tuple[str, int]:
        # The dashboard's own page, with the way back, for an unknown job or address.
        said = getattr(error, "description", "")
        message = said if isinstance(said, str) and said.startswith("no job") else \
            "There is no such page on this dashboard."
        return render_template("not_found.html", message=message, refresh_s=None), 404

    @app.get("/")
    def jobs() -> str:
        return _jobs_page(db_url)

    @app.get("/job/<job_id>")
    def job(job_id: str) -> str:
        return _job_page(db_url, job_id)

    @app.get("/job/<job_id>/plot.<fmt>")
    def plot(job_id: str, fmt: str) -> Response:
        return _plot(db_url, job_id, fmt)

    @app.get("/api/jobs")
    def api_jobs() -> list[dict[str, Any]]:
        with open_session(db_url) as session:
            return queries.job_summaries(session)

    return app


def _jobs_page(db_url: str | None) -> str:
    with open_session(db_url) as session:
        rows = queries.job_summaries(session)
        budgets = {j.id: j.budget_usd for j in queries.jobs(session)}
    for r in rows:
        r["budget_usd"] = budgets.get(r["job_id"])
    rows.reverse()  # newest first
    active = any(r["status"] not in FINAL_JOB for r in rows)
    return render_template("jobs.html", rows=rows, refresh_s=REFRESH_S if active else None)


def _job_page(db_url: str | None, job_id: str) -> str:
    with open_session(db_url) as session:
        found = session.get(Job, job_id)
        if found is None:
            abort(404, description=f"no job '{job_id}' in this results DB")
        instances = queries.job_instances(session, job_id)
        by_id = {i.id: i for i in instances}
        events = []
        for e in queries.events(session, job_id)[-EVENTS_SHOWN:][::-1]:
            who, change = event_parts(e, by_id)
            events.append({"at": e.at, "who": who, "change": change, "reason": e.reason or ""})
        metrics = list(session.scalars(select(Metric).where(Metric.job_id == job_id, Metric.kind != "worker")
                                       .order_by(Metric.at.desc(), Metric.id.desc()).limit(METRICS_SHOWN)))
        page = render_template("job.html", job=found, p=progress(session, found),
                               s=queries.job_summaries(session, [job_id])[0], instances=instances,
                               events=events, metrics=metrics, stamp=int(queries.clock_of(session).time()),
                               refresh_s=None if found.status in FINAL_JOB else REFRESH_S)
    return page


def _plot(db_url: str | None, job_id: str, fmt: str) -> Response:
    if fmt not in ("png", "svg"):
        abort(404)
    with open_session(db_url) as session:
        try:
            data = gather(session, job_id)
        except LookupError:
            abort(404)
    body = render(data, fmt)
    return Response(body, mimetype="image/png" if fmt == "png" else "image/svg+xml",
                    headers={"Cache-Control": "no-store"})
