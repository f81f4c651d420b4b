"""Stopping what a test started, and finding what it left behind.

``stop``: SIGTERM, then SIGKILL after a timeout. Never SIGINT alone: a suite started with SIGINT ignored (a
background job of a non-interactive shell, as some CI runners start it) passes that disposition on to
every child, which then never stops.

``left_behind``: the live processes a test session started, found without psutil by walking /proc: those
whose environment carries the session's marker (``SESSION_ENV``, set by the conftest and inherited), whose
working directory or command line lies under the session's temporary folder (a payload started with a
built environment), or that descend from the session's process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

SESSION_ENV = "ORCHESTRATOR_TEST_SESSION"
STOP_TIMEOUT_S = 20.0


def stop(proc: subprocess.Popen[Any], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM ``proc``, wait ``timeout_s``, then SIGKILL it; its exit code (negative: killed by a signal)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def _read(pid: str, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def _stat(pid: str) -> tuple[str, int] | None:
    """(state, parent pid), or None for a process gone meanwhile."""
    fields = _read(pid, "stat").rsplit(b")", 1)
    if len(fields) != 2 or len(fields[1].split()) < 2:
        return None
    parts = fields[1].split()
    return parts[0].decode(), int(parts[1])


def _ancestors(pid: int) -> set[int]:
    out: set[int] = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = _stat(str(pid))
        if st is None:
            break
        pid = st[1]
    return out


def _started_here(pid: str, marker: bytes, root: str | None, descendants: set[int]) -> bool:
    if int(pid) in descendants or marker in _read(pid, "environ").split(b"\0"):
        return True
    if root is None:
        return False
    with contextlib.suppress(OSError):
        if (os.readlink(f"/proc/{pid}/cwd") + "/").startswith(root):
            return True
    return root.encode() in _read(pid, "cmdline").replace(b"\0", b" ")


def left_behind(session_id: str, tmp_root: Path | None) -> dict[int, str]:
    """{pid: command line} of the live processes this session started (see the module doc)."""
    me = os.getpid()
    mine = _ancestors(me)  # pytest itself and whatever started it
    marker = f"{SESSION_ENV}={session_id}".encode()
    root = str(tmp_root.resolve()) + "/" if tmp_root is not None else None
    parents: dict[int, int] = {}
    states: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(entry)) is not None:
            states[int(entry)], parents[int(entry)] = st
    descendants: set[int] = set()
    for pid in parents:  # parent chains are short: walk each one up
        chain: list[int] = []
        p = pid
        while p in parents and p not in descendants and p != me and p > 1:
            chain.append(p)
            p = parents[p]
        if p == me or p in descendants:
            descendants.update(chain)
    found: dict[int, str] = {}
    for pid, state in states.items():
        if pid in mine or state == "Z" or not _started_here(str(pid), marker, root, descendants):
            continue
        cmd = _read(str(pid), "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        if cmd and "multiprocessing.resource_tracker" not in cmd:  # kernel threads have none; pytest's own
            found[pid] = cmd[:160]  # resource tracker (torch.multiprocessing.spawn starts it) ends with pytest
    return found


def kill_all(pids: list[int], timeout_s: float = 5.0) -> None:
    """SIGTERM each, then SIGKILL whatever still runs after ``timeout_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    st = _stat(str(pid))
    return st is not None and st[0] != "Z"
