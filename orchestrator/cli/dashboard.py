"""`orchestrator dashboard`: a small read-only web view of the results DB (Flask).

The app itself is ``dashboard_app``. Served by the standard library's threaded WSGI server: a read-only
view for a few people needs nothing more.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING

import typer

from orchestrator.cli.options import PORT_MAX
from orchestrator.model.errors import UserError

if TYPE_CHECKING:
    from flask import Flask


def create_app(db_url: str | None = None) -> Flask:
    """The dashboard's Flask app (``dashboard_app.create_app``)."""
    from orchestrator.cli import dashboard_app  # lazy: Flask and the ORM models (~0.1 s) only for this verb

    return dashboard_app.create_app(db_url)


def dashboard_command(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8050, "--port", min=0, max=PORT_MAX,
                              help="TCP port (0: any free port; the URL is printed)"),
) -> None:
    """Serve a read-only web dashboard of the results DB: jobs, timelines, cost, events, metrics."""
    from socketserver import ThreadingMixIn  # lazy: the HTTP server's modules only for this verb
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server  # lazy: as above

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True  # a slow plot never blocks the next page

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
            pass  # one line per request (and per refresh) would drown the terminal

    try:  # werkzeug would print its own message and exit 1; say which option to change instead
        socket.getaddrinfo(host, port)  # a name that does not resolve is the host's fault, not the port's
        with socket.create_server((host, port)):
            pass
    except socket.gaierror as exc:
        raise UserError(f"--host: '{host}' is not an address of this machine ({exc.strerror})",
                        hint="use 127.0.0.1, 0.0.0.0 or one of this machine's addresses") from exc
    except OSError as exc:
        option, hint = ("--port", "pick another --port, or 0 for any free one")
        if exc.errno == errno.EADDRNOTAVAIL:  # an address, but not this machine's
            option, hint = "--host", "use 127.0.0.1, 0.0.0.0 or one of this machine's addresses"
        raise UserError(f"{option}: cannot listen on {host}:{port} ({exc.strerror})", hint=hint) from exc
    server = make_server(host, port, create_app(), server_class=Server, handler_class=QuietHandler)
    print(f"dashboard on http://{host}:{server.server_port}/ (Ctrl-C stops it)", flush=True)
    server.serve_forever()  # Ctrl-C: the CLI's own handler exits 130
