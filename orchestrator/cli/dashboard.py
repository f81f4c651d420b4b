"""`orchestrator dashboard`: a small read-only web view of the results DB (Flask).

The jobs table, and per job: progress, the timeline / cost / throughput plot (the same module as
``report --plot``), instances, events and metrics. Pages of active jobs refresh themselves. Served by the
standard library's threaded WSGI server: a read-only view for a few people needs nothing more.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from sqlalchemy import select

from orchestrator.cli.render import duration, money, pct, when
from orchestrator.core.status import FINAL_JOB

if TYPE_CHECKING:
    from flask import Flask

REFRESH_S = 5
EVENTS_SHOWN = 200
METRICS_SHOWN = 40


def create_app(db_url: str | None = None) -> Flask:
    from flask import Flask, Response, abort, render_template

    from orchestrator.cli.plots import gather, render
    from orchestrator.cli.progress import event_parts, progress
    from orchestrator.store import queries
    from orchestrator.store.db import open_session
    from orchestrator.store.models import Job, Metric

    app = Flask(__name__, template_folder=str(Path(__file__).parent / "templates"))
    app.jinja_env.filters.update(money=money, duration=duration, pct=pct, when=when)

    @app.get("/")
    def jobs() -> str:
        with open_session(db_url) as session:
            rows = queries.job_summaries(session)
            budgets = {j.id: j.budget_usd for j in queries.jobs(session)}
        for r in rows:
            r["budget_usd"] = budgets.get(r["job_id"])
        rows.reverse()  # newest first
        active = any(r["status"] not in FINAL_JOB for r in rows)
        return render_template("jobs.html", rows=rows, refresh_s=REFRESH_S if active else None)

    @app.get("/job/<job_id>")
    def job(job_id: str) -> str:
        with open_session(db_url) as session:
            found = session.get(Job, job_id)
            if found is None:
                abort(404)
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
                                   events=events, metrics=metrics, stamp=int(time.time()),
                                   refresh_s=None if found.status in FINAL_JOB else REFRESH_S)
        return page

    @app.get("/job/<job_id>/plot.<fmt>")
    def plot(job_id: str, fmt: str) -> Response:
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

    @app.get("/api/jobs")
    def api_jobs() -> list[dict[str, Any]]:
        with open_session(db_url) as session:
            return queries.job_summaries(session)

    return app


def dashboard_command(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8050, "--port", help="TCP port (0: any free port; the URL is printed)"),
) -> None:
    """Serve a read-only web dashboard of the results DB: jobs, timelines, cost, events, metrics."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from orchestrator.core.errors import UserError

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True  # a slow plot never blocks the next page

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
            pass  # one line per request (and per refresh) would drown the terminal

    try:  # werkzeug would print its own message and exit 1; say which option to change instead
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise UserError(f"--port: cannot listen on {host}:{port} ({exc.strerror})",
                        hint="pick another --port, or 0 for any free one") from exc
    server = make_server(host, port, create_app(), server_class=Server, handler_class=QuietHandler)
    print(f"dashboard on http://{host}:{server.server_port}/ (Ctrl-C stops it)", flush=True)
    server.serve_forever()  # Ctrl-C: the CLI's own handler exits 130
