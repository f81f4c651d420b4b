"""A faithful fake of the Compute Engine REST API (v1), for driving the real google-cloud-compute client.

In-process::

    emu = GceEmulator({"boot_delay_s": 0.1, "stockouts": [{"zone": "us-central1-a"}]})
    url = emu.start()          # e.g. http://127.0.0.1:40123; give it to the client as api_endpoint
    emu.preempt("job-worker-0-0")
    emu.stop()

As a process (the URL is the first line on stdout; SIGTERM / SIGINT stop it)::

    python -m orchestrator_testing.gce_emulator --port 0 --config cfg.json

Paths are the real API's (``/compute/v1/projects/{project}/...``); the control API lives under
``/_emulator/...`` (see ``_control``). Endpoint names used for call counters, faults and latency are
the API method ids without the ``compute.`` prefix, e.g. ``instances.insert``,
``instances.aggregatedList``, ``zoneOperations.wait``, ``firewalls.get``, ``images.insert``,
``regions.get`` / ``projects.get`` (their ``quotas``: configured limits and current usage).
Latency and fault delays are real seconds (they model the network); lifecycle delays are emulated.
Per-request latency is injectable: ``latency_s`` in the config (endpoint glob -> seconds, e.g.
``{"*": 2.0}``), ``set_latency(endpoint, seconds)`` at run time, or ``--latency-s 2`` for the process.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from orchestrator_testing import gce_emulator_guest as guest
from orchestrator_testing.gce_emulator_model import (
    HOOK_EVENTS,
    ApiError,
    EmulatorConfig,
    Fault,
    Hook,
    default_fault_message,
)
from orchestrator_testing.gce_emulator_state import GceState

__all__ = ["EmulatorConfig", "Fault", "GceEmulator", "main"]

log = logging.getLogger(__name__)

Action = Callable[[], dict[str, Any]]


def _route(
    state: GceState,
    method: str,
    project: str,
    segs: Sequence[str],
    query: Mapping[str, str],
    body: dict[str, Any],
) -> tuple[str, Action] | None:
    """(endpoint name, action) for a REST call under ``/compute/v1/projects/{project}/``."""
    rid = query.get("requestId") or None
    match method, list(segs):
        case "GET", []:
            return "projects.get", lambda: state.get_project(project)
        case "GET", ["regions", region]:
            return "regions.get", lambda: state.get_region(project, region)
        case "POST", ["regions", region, "advice", "capacity"]:
            return "advice.capacity", lambda: state.capacity_advice(project, region, body)
        case "GET", ["zones"]:
            return "zones.list", lambda: state.list_zones(project, query)
        case "GET", ["zones", zone]:
            return "zones.get", lambda: state.get_zone(project, zone)
        case "GET", ["zones", zone, "instances"]:
            return "instances.list", lambda: state.list_instances(project, zone, query)
        case "POST", ["zones", zone, "instances"]:
            return "instances.insert", lambda: state.insert_instance(project, zone, body, rid)
        case "GET", ["zones", zone, "instances", name]:
            return "instances.get", lambda: state.get_instance(project, zone, name)
        case "DELETE", ["zones", zone, "instances", name]:
            return "instances.delete", lambda: state.delete_instance(project, zone, name, rid)
        case "POST", ["zones", zone, "instances", name, "stop"]:
            return "instances.stop", lambda: state.stop_instance(project, zone, name, rid)
        case "POST", ["zones", zone, "instances", name, "start"]:
            return "instances.start", lambda: state.start_instance(project, zone, name, rid)
        case "GET", ["zones", zone, "instances", name, "getGuestAttributes"]:  # the SSH host keys
            return guest.ENDPOINT, lambda: guest.guest_attributes(state, project, zone, name, query)
        case "GET", ["aggregated", "instances"]:
            return "instances.aggregatedList", lambda: state.aggregated_instances(project, query)
        case _, ["zones", zone, "operations", *rest]:
            return _route_operations("zoneOperations", state, method, project, f"zones/{zone}", rest, query)
        case _, ["global", "operations", *rest]:
            return _route_operations("globalOperations", state, method, project, "global", rest, query)
        case _, ["global", "firewalls" | "images", *_]:
            return _route_global(state, method, project, segs, query, body)
    return None


def _route_global(
    state: GceState,
    method: str,
    project: str,
    segs: Sequence[str],
    query: Mapping[str, str],
    body: dict[str, Any],
) -> tuple[str, Action] | None:
    """(endpoint name, action) for firewalls and images (``global/...``)."""
    rid = query.get("requestId") or None
    match method, list(segs):
        case "GET", ["global", "firewalls"]:
            return "firewalls.list", lambda: state.resources.list_firewalls(project, query)
        case "POST", ["global", "firewalls"]:
            return "firewalls.insert", lambda: state.resources.insert_firewall(project, body, rid)
        case "GET", ["global", "firewalls", name]:
            return "firewalls.get", lambda: state.resources.get_firewall(project, name)
        case "DELETE", ["global", "firewalls", name]:
            return "firewalls.delete", lambda: state.resources.delete_firewall(project, name, rid)
        case ("PUT" | "PATCH") as verb, ["global", "firewalls", name]:
            patch = verb == "PATCH"
            return (
                "firewalls.patch" if patch else "firewalls.update",
                lambda: state.resources.update_firewall(project, name, body, rid, patch),
            )
        case "GET", ["global", "images"]:
            return "images.list", lambda: state.resources.list_images(project, query)
        case "POST", ["global", "images"]:
            force = query.get("forceCreate", "").lower() == "true"
            return "images.insert", lambda: state.resources.insert_image(project, body, rid, force)
        case "GET", ["global", "images", "family", family]:
            return "images.getFromFamily", lambda: state.resources.image_from_family(project, family)
        case "GET", ["global", "images", name]:
            return "images.get", lambda: state.resources.get_image(project, name)
        case "DELETE", ["global", "images", name]:
            return "images.delete", lambda: state.resources.delete_image(project, name, rid)
    return None


def _route_operations(
    service: str,
    state: GceState,
    method: str,
    project: str,
    scope: str,
    rest: Sequence[str],
    query: Mapping[str, str],
) -> tuple[str, Action] | None:
    match method, list(rest):
        case "GET", []:
            return f"{service}.list", lambda: state.list_operations(project, scope, query)
        case "GET", [name]:
            return f"{service}.get", lambda: state.get_operation(project, scope, name)
        case "DELETE", [name]:
            return f"{service}.delete", lambda: state.delete_operation(project, scope, name)
        case "POST", [name, "wait"]:
            return f"{service}.wait", lambda: state.wait_operation(project, scope, name)
    return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler stuck in an injected delay must not block shutdown
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: GceState) -> None:
        super().__init__(address, _Handler)
        self.state = state


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's requests.Session expects
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; without this, Nagle + delayed ACK add ~40 ms per call.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")

    def do_PUT(self) -> None:  # noqa: N802
        self._handle("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._handle("PATCH")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, payload: Mapping[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (an injected timeout)
            self.close_connection = True

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            self._send(400, ApiError(400, "parseError", "Parse Error").body())
            return
        segs = [unquote(s) for s in url.path.strip("/").split("/")]
        if segs[0] == "_emulator":
            self._control(method, segs[1:], body)
            return
        found = None
        if len(segs) >= 4 and segs[:3] == ["compute", "v1", "projects"]:
            found = _route(self.server.state, method, segs[3], segs[4:], query, body)
        elif method == "POST" and len(segs) == 8 and segs[:3] == ["compute", "beta", "projects"] and \
                segs[4] == "regions" and segs[6:] == ["advice", "capacity"]:  # SPOT advice: beta only (gce/advice.py)
            state, project, region = self.server.state, segs[3], segs[5]
            found = "advice.capacity", lambda: state.capacity_advice(project, region, body, beta=True)
        if found is None:
            self._send(404, ApiError(404, "notFound", f"The requested URL {url.path} was not found.").body())
            return
        self._serve(found[0], found[1], segs[3])

    def _serve(self, endpoint: str, action: Action, project: str) -> None:
        state = self.server.state
        fault = state.take_fault(endpoint)
        latency = state.latency(endpoint)
        if latency:
            time.sleep(latency)
        if fault is not None and fault.status:
            time.sleep(fault.delay_s)
            reason, message = default_fault_message(fault.status, endpoint, project)
            error = ApiError(fault.status, fault.reason or reason, fault.message or message)
            self._send(fault.status, error.body())
            return
        try:
            status, payload = 200, action()
        except ApiError as exc:
            status, payload = exc.code, exc.body()
        if fault is not None and fault.delay_s:  # served, but the answer arrives after the client gave up
            time.sleep(fault.delay_s)
        self._send(status, payload)

    def _control(self, method: str, segs: Sequence[str], body: dict[str, Any]) -> None:
        """Test control API: snapshot, preempt, faults, stockouts, quotas, config, advance, reset_calls."""
        state = self.server.state
        result: dict[str, Any] = {}
        try:
            match method, list(segs):
                case "GET", ["snapshot"]:
                    result = state.snapshot()
                case "POST", ["preempt"]:
                    result = {"operation": state.preempt(body["name"], body.get("zone"), body.get("project"))}
                case "POST", ["faults"]:
                    state.add_fault(Fault(**body))
                case "DELETE", ["faults"]:
                    state.clear_faults()
                case "POST", ["stockouts"]:
                    state.set_stockout(**body)
                case "POST", ["quotas"]:
                    state.set_quota(body["region"], body["metric"], body.get("limit"))
                case "POST", ["config"]:
                    state.configure(**body)
                case "POST", ["advance"]:
                    state.advance(float(body["seconds"]))
                case "POST", ["reset_calls"]:
                    state.reset_calls()
                case _:
                    self._send(404, ApiError(404, "notFound", f"no control endpoint {'/'.join(segs)}").body())
                    return
        except ApiError as exc:
            self._send(exc.code, exc.body())
            return
        except (KeyError, TypeError, ValueError) as exc:
            self._send(400, ApiError(400, "invalid", f"bad control request: {exc!r}").body())
            return
        self._send(200, result)


class GceEmulator:
    """The emulated Compute Engine, served over HTTP on ``host:port`` (0 picks a free port)."""

    def __init__(
        self,
        config: EmulatorConfig | Mapping[str, Any] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        on_running: Hook | None = None,
        on_preempted: Hook | None = None,
        on_terminated: Hook | None = None,
        on_deleted: Hook | None = None,
    ) -> None:
        self.config = config if isinstance(config, EmulatorConfig) else EmulatorConfig.from_dict(config or {})
        hooks = {
            "running": on_running,
            "preempted": on_preempted,
            "terminated": on_terminated,
            "deleted": on_deleted,
        }
        self.state = GceState(self.config, hooks)
        self._address = (host, port)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self) -> str:
        """Serve in a background thread; returns the base URL (the client's ``api_endpoint``).

        A loopback URL: the gce provider calls it with anonymous credentials and reaches the emulated VMs on
        127.0.0.1, from the endpoint alone (model/spec/provider.py ``loopback_endpoint``)."""
        if self._server is not None:
            return self.url
        self._server = _Server(self._address, self.state)
        self.state.start()
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="gce-emulator-http",
            daemon=True,
        )
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}"
        return self.url

    def stop(self) -> None:
        if self._server is None:
            return
        self.state.stop()  # first: wakes handlers blocked in operations.wait
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> GceEmulator:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---------------------------------------------------------------- control (same as /_emulator/...)

    def preempt(self, name: str, zone: str | None = None) -> str:
        """Revoke a running spot VM; returns the ``compute.instances.preempted`` operation's name."""
        return self.state.preempt(name, zone)

    def inject_fault(
        self,
        endpoint: str = "*",
        status: int = 503,
        count: int | None = 1,
        delay_s: float = 0.0,
        reason: str = "",
        message: str = "",
    ) -> None:
        """The next ``count`` calls of ``endpoint`` (a glob) fail with ``status`` (None: forever)."""
        self.state.add_fault(Fault(endpoint, status, count, delay_s, reason, message))

    def inject_timeout(self, endpoint: str, delay_s: float, count: int | None = 1) -> None:
        """The next calls are served but answered only after ``delay_s`` (beyond the client's timeout)."""
        self.state.add_fault(Fault(endpoint, 0, count, delay_s))

    def inject_auth_failure(self, status: int = 401, endpoint: str = "*", count: int | None = None) -> None:
        self.state.add_fault(Fault(endpoint, status, count))

    def clear_faults(self) -> None:
        self.state.clear_faults()

    def set_stockout(
        self,
        zone: str,
        gpu: str = "*",
        provisioning: str = "*",
        enabled: bool = True,
        code: str = "ZONE_RESOURCE_POOL_EXHAUSTED",
        capacity: int | None = None,
    ) -> None:
        """A stockout of such VMs in ``zone``; with ``capacity``, room for that many at once (spot counted)."""
        self.state.set_stockout(zone, gpu, provisioning, enabled, code, capacity)

    def set_quota(self, region: str, metric: str, limit: float | None) -> None:
        self.state.set_quota(region, metric, limit)

    def set_latency(self, endpoint: str, seconds: float) -> None:
        self.state.configure(latency_s={**self.config.latency_s, endpoint: seconds})

    def configure(self, **changes: Any) -> None:
        self.state.configure(**changes)

    def set_hook(self, event: str, hook: Hook | None) -> None:
        """Set (or clear) the ``running`` / ``preempted`` / ``terminated`` / ``deleted`` hook."""
        if event not in HOOK_EVENTS:
            raise ValueError(f"unknown emulator hook {event!r}; known: {', '.join(HOOK_EVENTS)}")
        with self.state.lock:
            if hook is None:
                self.state.hooks.pop(event, None)
            else:
                self.state.hooks[event] = hook

    def advance(self, seconds: float) -> None:
        """Move the emulated clock forward (e.g. 86400 to reach a preemptible VM's 24 h limit)."""
        self.state.advance(seconds)

    def snapshot(self) -> dict[str, Any]:
        return self.state.snapshot()

    def reset_calls(self) -> None:
        self.state.reset_calls()

    def instance(self, name: str, zone: str | None = None) -> dict[str, Any] | None:
        """The instance's REST representation, or None."""
        return self.state.instance(name, zone)

    def firewall(self, name: str, project: str) -> dict[str, Any] | None:
        try:
            return self.state.resources.get_firewall(project, name)
        except ApiError:
            return None

    def image(self, name: str, project: str) -> dict[str, Any] | None:
        try:
            return self.state.resources.get_image(project, name)
        except ApiError:
            return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator_testing.gce_emulator",
        description="Serve an emulated Compute Engine REST API. A controller reaches it by the printed URL as "
                    "provider.api_endpoint (a loopback endpoint: anonymous credentials, VMs on 127.0.0.1).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--config", help="JSON file with EmulatorConfig keys")
    parser.add_argument("--latency-s", type=float, default=None,
                        help="seconds added to every API request (a slow cloud), e.g. 2")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    config: dict[str, Any] = {}
    if args.config:
        with open(args.config, encoding="utf-8") as fh:
            config = json.load(fh)
    if args.latency_s:
        config["latency_s"] = {**config.get("latency_s", {}), "*": args.latency_s}
    emulator = GceEmulator(config, host=args.host, port=args.port)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(emulator.start(), flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
