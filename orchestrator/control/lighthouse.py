"""The torchft Lighthouse of a job whose PyTorch workers are replica groups (``fault_tolerance: torchft``).

It runs with the controller (the daemon's host), never on a spot worker: ``torchft_lighthouse`` (the console
script beside this interpreter) as a process of its own session. Its port is written to the job's storage
(``lighthouse.json``) before the process starts, so a daemon killed at any line leaves nothing a later one cannot
find: the process is looked up by its ``--bind`` argument in /proc, reused while it runs, started again where it
does not, and stopped when the job ends.

A worker on another machine (the gce and ssh providers) reaches it through a reverse SSH forward of its own
(transport/tunnel.py): a port on the worker's loopback, carried to the Lighthouse by an ``ssh -N -R`` process on this
host, also of its own session and found by its log's path (one per job and instance, under the user directory). The
port the server gave it is read back from that log, and asked for again where the forward must start anew, so the
worker's task.json stays right.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from orchestrator.clock import WALL, Clock
from orchestrator.model.paths import user_dir
from orchestrator.storage.base import JobStorage
from orchestrator.transport import tunnel
from orchestrator.transport.base import Endpoint, TransportError

STATE = "lighthouse.json"
PROGRAM = "torchft_lighthouse"
# A quorum forms at once when every heartbeating group has joined; a lost group is dropped after 1 s without a
# heartbeat (the survivors' pause, bench/torchft_pause.py); stragglers are waited for 1 s.
OPTIONS = ("--min_replicas", "1", "--join_timeout_ms", "1000", "--quorum_tick_ms", "50",
           "--heartbeat_timeout_ms", "1000")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _bind(port: int) -> str:
    # loopback only: the local provider's workers run on this host, remote ones arrive through their SSH forwards
    # (reach), and no training port is reachable from outside the cluster
    return f"127.0.0.1:{port}"


def _processes(proc: Path = Path("/proc")) -> dict[int, list[bytes]]:
    """Every process's command line (its NUL-separated arguments), by pid."""
    found = {}
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            found[int(entry.name)] = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
    return found


def find(port: int, proc: Path = Path("/proc")) -> int | None:
    """The pid of the Lighthouse bound to ``port`` (from the processes' command lines), or None."""
    want = _bind(port).encode()
    # the console script runs as `python .../torchft_lighthouse ...` (its shebang) or as itself
    pids = [pid for pid, argv in _processes(proc).items()
            if any(a.endswith(PROGRAM.encode()) for a in argv[:2]) and want in argv]
    return pids[0] if pids else None


def _state_port(storage: JobStorage) -> int | None:
    try:
        return int(json.loads(storage.read_text(STATE) or "null")["port"])
    except (ValueError, TypeError, KeyError):
        return None


def ensure(storage: JobStorage, advertise: str = "127.0.0.1") -> str:
    """The job's Lighthouse address (``http://host:port``), starting it where none runs."""
    port = _state_port(storage)
    if port is None:
        port = _free_port()
        storage.write_text(STATE, json.dumps({"port": port}) + "\n")  # first: a later daemon finds what starts next
    if find(port) is None:
        program = str(Path(sys.executable).with_name(PROGRAM))
        local = storage.local_path()
        with (local / "lighthouse.log").open("ab") if local is not None else open(os.devnull, "wb") as log:
            subprocess.Popen([program, "--bind", _bind(port), *OPTIONS], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)  # outlives a daemon's restart
    return f"http://{advertise}:{port}"


def stop(storage: JobStorage) -> bool:
    """Stop the job's Lighthouse (the job ended); True if one was running."""
    port = _state_port(storage)
    pid = find(port) if port is not None else None
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return pid is not None


def _tunnel_dir(job_id: str) -> Path:
    return user_dir() / "tunnels" / job_id


def _tunnels(job_id: str) -> dict[int, Path]:
    """``job_id``'s reverse forwards that run: pid -> the log each writes (the ``-E`` path in its command line)."""
    d, found = _tunnel_dir(job_id), {}
    for pid, argv in _processes().items():
        if b"-E" in argv[:-1]:
            path = Path(argv[argv.index(b"-E") + 1].decode(errors="replace"))
            if path.parent == d:
                found[pid] = path
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended (its parent, a daemon that started it, reaps it later)


def _kill(pids: list[int], clock: Clock = WALL, wait_s: float = 5.0) -> None:
    """SIGTERM each, and wait (up to ``wait_s``) until they have ended: stopped means stopped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = clock.monotonic() + wait_s
    while any(_alive(p) for p in pids) and clock.monotonic() < deadline:
        clock.sleep(0.05)


def _wait_forward(proc: subprocess.Popen[bytes], log: Path, local_port: int, asked: int, clock: Clock,
                  timeout_s: float) -> int:
    """The remote port once the server accepted the forward (OpenSSH logs it; ExitOnForwardFailure ends a refused
    one): ``asked``, or for ``-R 0`` the port it was given."""
    deadline = clock.monotonic() + timeout_s
    while clock.monotonic() < deadline:
        text = log.read_bytes() if log.exists() else b""
        if (got := tunnel.allocated_port(text, local_port, asked)) is not None:
            return got
        if proc.poll() is not None:
            raise TransportError(f"the Lighthouse's reverse forward to {log.stem} ended at once: "
                                 f"{text.decode(errors='replace').strip()[-300:]}")
        clock.sleep(0.1)
    proc.kill()
    raise TransportError(f"the Lighthouse's reverse forward to {log.stem} did not open in {timeout_s:.0f} s")


def reach(storage: JobStorage, job_id: str, instance: str, ep: Endpoint, clock: Clock = WALL,
          timeout_s: float = 30.0) -> str:
    """The Lighthouse's address as remote ``instance`` reaches it (``http://127.0.0.1:PORT`` on its own loopback):
    its reverse forward, started where none runs (asking for the port it had before, if it had one)."""
    local_port = int(ensure(storage).rsplit(":", 1)[1])
    d = _tunnel_dir(job_id)
    log, port_file = d / f"{instance}.log", d / f"{instance}.port"
    recorded = int(port_file.read_text()) if port_file.exists() else 0
    running = [pid for pid, path in _tunnels(job_id).items() if path == log]
    if recorded and running:
        return f"http://127.0.0.1:{recorded}"
    _kill(running)  # one of unknown port (a daemon killed before it wrote the port down)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    known = tunnel.write_known_hosts(ep, d / f"{instance}.known_hosts")
    argv = tunnel.reverse_forward_argv(ep, local_port=local_port, remote_port=recorded, known_hosts=known, log=log)
    log.write_bytes(b"")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # outlives a daemon's restart, as the Lighthouse does
    port = _wait_forward(proc, log, local_port, recorded, clock, timeout_s)
    port_file.write_text(f"{port}\n")
    return f"http://127.0.0.1:{port}"


def stop_tunnels(job_id: str, only: str | None = None) -> int:
    """End ``job_id``'s reverse forwards (``only``: that instance's; else all, and their state goes too); how many
    were running."""
    pids = [pid for pid, path in _tunnels(job_id).items() if only is None or path.stem == only]
    _kill(pids)
    if only is None:
        shutil.rmtree(_tunnel_dir(job_id), ignore_errors=True)
    return len(pids)
