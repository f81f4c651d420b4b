"""``provider.api_endpoint`` decides where credentials may go: the user's only over https to a Google API host; a
Compute API on this machine's loopback is called with anonymous credentials; any other endpoint is refused when
the spec is read, by plan, dry run and launch alike (exit 2, one line naming the field), before anything is created.

The credentials are real ones as google-auth loads them (a throwaway service-account key file through
GOOGLE_APPLICATION_CREDENTIALS, tests/conftest.py), and the calls are the real google-cloud-compute client's, made
by the launch's own set-up check against a loopback server that records what reaches it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.model.spec import SpecError, validate_spec
from orchestrator.providers import registry
from tests.cli_inproc import run_cli

SPEC = """name: endpoint
provider: {{kind: gce, project: endpoint-project, zones: [us-central1-c], api_endpoint: "{endpoint}"}}
training: {{job: command, command: "sleep 1", mode: sync, train_steps: 10}}
storage: gs://endpoint-bucket/runs
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: t4, count: 1, spot: true, zone: us-central1-c}}]
"""
# Endpoints a shared spec could use to collect the caller's OAuth token (or reach what it should not).
HOSTILE = ["http://169.254.169.254", "https://example.com", "http://compute.googleapis.com",
           "https://compute.googleapis.com.example.com", "https://evilgoogleapis.com",
           "https://user@compute.googleapis.com", "https://example.com\\@compute.googleapis.com",
           "http://metadata.google.internal", "http://0.0.0.0:8080", "https://compute.googleapis.com/x?y=1"]
ACCEPTED = {"https://compute.googleapis.com": False, "compute.googleapis.com": False,
            "https://private.googleapis.com:443": False, "https://compute-psc1.p.googleapis.com": False,
            "http://127.0.0.1:8080": True, "http://localhost:9": True, "http://[::1]:9": True}


class Recorder(ThreadingHTTPServer):
    """A Compute API stand-in on loopback: answers every call with an empty JSON object, keeps the headers."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        pass


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def adc_key(throwaway_key: Path) -> Path:
    """The caller's service-account key, as Application Default Credentials find it (tests/conftest.py)."""
    assert os.environ["GOOGLE_APPLICATION_CREDENTIALS"] == str(throwaway_key)
    return throwaway_key


def test_a_loopback_endpoint_gets_no_bearer_token(recorder: Recorder, adc_key: Path) -> None:
    spec = validate_spec(yaml.safe_load(SPEC.format(endpoint=recorder.url)))
    registry.check_setup(spec)  # the launch's own check: credentials, then one projects.get
    backend = registry.backend_for(spec)
    try:
        backend.provider.list()
    finally:
        backend.provider.close()
    paths = [path for _, path, _ in recorder.requests]
    assert any("/projects/endpoint-project" in p for p in paths) and any("aggregated/instances" in p for p in paths)
    sent = [(path, headers["authorization"]) for _, path, headers in recorder.requests if "authorization" in headers]
    assert sent == []  # the caller's credentials never left for the loopback endpoint


def _run(tmp_path: Path, verb: list[str], endpoint: str) -> tuple[int, list[str]]:
    spec = tmp_path / "endpoint.yaml"
    spec.write_text(SPEC.format(endpoint=endpoint.replace("\\", "\\\\")))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "COLUMNS": "200",
           "ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path / 'x.db'}",
           "GOOGLE_APPLICATION_CREDENTIALS": os.environ["GOOGLE_APPLICATION_CREDENTIALS"],
           # Nothing leaves this machine: any call (the dry run sends none) and the address lookup are refused.
           "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
           "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"}
    out = run_cli([*verb, str(spec)], env, tmp_path)
    return out.returncode, out.stderr.strip().splitlines()


def _jobs(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])


@pytest.mark.parametrize("verb", [["plan"], ["launch", "--dry-run"], ["launch", "--detach"]])
@pytest.mark.parametrize("endpoint", HOSTILE[:3])
def test_a_hostile_endpoint_is_refused_by_every_verb(tmp_path: Path, adc_key: Path, verb: list[str],
                                                     endpoint: str) -> None:
    code, lines = _run(tmp_path, verb, endpoint)
    assert code == 2 and len(lines) == 1, lines
    assert "provider.api_endpoint" in lines[0] and "https://compute.googleapis.com" in lines[0], lines[0]
    assert "nothing was created" in lines[0] and _jobs(tmp_path / "x.db") == 0


@pytest.mark.parametrize("endpoint", HOSTILE)
def test_no_other_host_is_an_endpoint(endpoint: str) -> None:
    from orchestrator.model.spec.provider import check_api_endpoint, loopback_endpoint

    with pytest.raises(ValueError, match="https://compute.googleapis.com"):
        check_api_endpoint(endpoint)
    assert not loopback_endpoint(endpoint)


def test_google_api_hosts_and_loopback_are_accepted(tmp_path: Path, adc_key: Path) -> None:
    from orchestrator.model.spec.provider import check_api_endpoint, loopback_endpoint

    for endpoint, loopback in ACCEPTED.items():
        assert check_api_endpoint(endpoint) == endpoint and loopback_endpoint(endpoint) is loopback, endpoint
    # A dry run with GCE's own endpoint: the caller's credentials are found, nothing is sent.
    code, lines = _run(tmp_path, ["launch", "--dry-run"], "https://compute.googleapis.com")
    assert code == 0 and not any("api_endpoint" in line for line in lines), lines


def test_a_key_file_beside_a_loopback_endpoint_is_refused(adc_key: Path) -> None:
    text = SPEC.format(endpoint="http://127.0.0.1:9").replace("project: endpoint-project,",
                                                              f"project: endpoint-project, credentials: {adc_key},")
    with pytest.raises(SpecError, match="provider.credentials: a key file is never sent to a loopback"):
        validate_spec(yaml.safe_load(text))
