"""The daemon's metrics (job ids, names, spend, budgets; no authentication) listen on 127.0.0.1 unless
``--metrics-host`` widens them. The address is read back from the kernel's table of listening sockets
(/proc/net/tcp), for the server ``metrics.serve`` starts and for a real ``orchestrator daemon`` process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from orchestrator.control import metrics
from tests.cli_inproc import run_cli

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def _listening(port: int) -> list[str]:
    """The IPv4 addresses listening on ``port``, as dotted quads."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == LISTEN and int(hex_port, 16) == port:
            found.append(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("host", "expected"), [(None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0"),
                                                ("127.0.0.2", "127.0.0.2")])
def test_the_metrics_server_binds_loopback_unless_told(tmp_path: Path, host: str | None, expected: str) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    kwargs = {} if host is None else {"host": host}
    port = metrics.serve(0, registry=CollectorRegistry(), url=url, **kwargs)
    assert _listening(port) == [expected]


def _daemon(tmp_path: Path, *args: str) -> list[str]:
    """Start ``orchestrator daemon`` with its metrics on a free port; the addresses they listen on."""
    port = _free_port()
    env = {**os.environ, "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path / 'd.db'}"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "daemon", "--interval", "30",
                             "--metrics-port", str(port), *args], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # a bound on start-up on a loaded host, not a speed target
        while not (found := _listening(port)) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1]
        return found
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def test_the_daemon_serves_metrics_on_loopback_by_default(tmp_path: Path) -> None:
    assert _daemon(tmp_path) == ["127.0.0.1"]


def test_metrics_host_widens_the_daemons_metrics(tmp_path: Path) -> None:
    assert _daemon(tmp_path, "--metrics-host", "0.0.0.0") == ["0.0.0.0"]


@pytest.mark.parametrize(("args", "says"), [
    (["--metrics-host", "0.0.0.0"], "--metrics-host: only with --metrics-port"),
    (["--metrics-port", "9", "--metrics-host", "no-such-host.invalid"],
     "--metrics-host: 'no-such-host.invalid' is not an address of this machine"),
    (["--metrics-port", "9", "--metrics-host", "192.0.2.1"], "--metrics-host: cannot listen on 192.0.2.1:9"),
])
def test_a_bad_metrics_host_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "COLUMNS": "200",
           "ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    out = run_cli(["daemon", *args], env, tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
