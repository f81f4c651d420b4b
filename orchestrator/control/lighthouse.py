"""The torchft Lighthouse of a job whose PyTorch workers are replica groups (``fault_tolerance: torchft``).

It runs with the controller (the daemon's host), never on a spot worker: ``torchft_lighthouse`` (the console
script beside this interpreter) as a process of its own session. Its port is written to the job's storage
(``lighthouse.json``) before the process starts, so a daemon killed at any line leaves nothing a later one cannot
find: the process is looked up by its ``--bind`` argument in /proc, reused while it runs, started again where it
does not, and stopped when the job ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from orchestrator.storage.base import JobStorage

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
    # loopback only: the local provider's workers run on this host, and a training port is reachable only inside
    # the cluster (a cloud job's Lighthouse would bind the controller's cluster address: not built yet)
    return f"127.0.0.1:{port}"


def find(port: int, proc: Path = Path("/proc")) -> int | None:
    """The pid of the Lighthouse bound to ``port`` (from the processes' command lines), or None."""
    want = _bind(port).encode()
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # the console script runs as `python .../torchft_lighthouse ...` (its shebang) or as itself
        if any(a.endswith(PROGRAM.encode()) for a in argv[:2]) and want in argv:
            return int(entry.name)
    return None


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
