"""Local transport: the instance's work directory is a folder on this machine; processes are detached."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from orchestrator.clock import WALL, Clock
from orchestrator.model.instances import ProcState, ProcStatus
from orchestrator.transport.base import (
    Endpoint,
    Transport,
    UnsafePathError,
    check_relative,
    wrapped_command,
)

__all__ = ["LocalTransport", "UnsafePathError", "kill_all_in", "payload_base_env", "pid_alive", "safe_destination"]


def pid_alive(pid: int) -> bool:
    """True for a live process; a zombie (exited, not yet reaped by init) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Kill the process group led by ``pid`` (and ``pid`` itself, should it have left the group)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, sig)


def kill_all_in(workdir: Path) -> int:
    """Kill every process group recorded under ``workdir/procs`` (revocation, deletion). Returns how many."""
    killed = 0
    procs = workdir / "procs"
    if not procs.is_dir():
        return 0
    for pidfile in procs.glob("*.pid"):
        try:
            pid = int(pidfile.read_text().strip())
        except (ValueError, OSError):
            continue
        if pid_alive(pid):
            kill_group(pid)
            killed += 1
    return killed


def spawn_detached(argv: list[str], cwd: Path, env: dict[str, str]) -> int:
    """Start a new session leader that outlives this process (a killed daemon leaves it running)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    _children.append(proc)
    _reap()
    return proc.pid


_children: list[subprocess.Popen[bytes]] = []


def _reap() -> None:
    # Children of a long-running controller must not pile up as zombies.
    _children[:] = [p for p in _children if p.poll() is None]


# What a payload gets from the controller's environment: the basics a process needs and the knobs of the
# numeric libraries, never the rest (cloud credentials, the DB URL with its password, tokens). A job's
# own variables and secrets come by name from its spec (``env:`` / ``secrets:``).
PASSED_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
                        "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
                        "STORAGE_EMULATOR_HOST"})  # the GCS endpoint (storage.gcs_endpoint: a sibling layer)
PASSED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "OMP_", "MKL_", "OPENBLAS_", "TF_", "TORCH_", "PYTORCH_",
                   "XLA_", "KMP_")


def payload_base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in PASSED_ENV or k.startswith(PASSED_PREFIXES)}


def safe_destination(workdir: Path, local: Path, remote_rel: str) -> Path:
    """Where ``local`` goes under ``workdir``; refuses ``..``/absolute names and a folder copied into itself."""
    check_relative(remote_rel, str(local))
    root = workdir.resolve()
    dest = (root / remote_rel).resolve()
    if dest == root or not dest.is_relative_to(root):
        raise UnsafePathError(f"{local} would be copied to {remote_rel!r}, outside the instance's work directory "
                              f"{root}; list files by a name inside the job's folder")
    source = local.resolve()
    if local.is_dir() and (dest == source or dest.is_relative_to(source)):
        raise UnsafePathError(f"copying the folder {source} to {dest} would copy it into itself")
    return dest


class LocalTransport(Transport):
    def __init__(self, clock: Clock = WALL) -> None:
        self.clock = clock

    def wait_reachable(self, ep: Endpoint, timeout_s: float) -> None:
        deadline = self.clock.monotonic() + timeout_s
        while not Path(ep.workdir).is_dir():
            if self.clock.monotonic() > deadline:
                raise TimeoutError(f"{ep.workdir} did not appear within {timeout_s:.0f}s")
            self.clock.sleep(0.05)

    def put(self, ep: Endpoint, local: Path, remote_rel: str) -> None:
        dest = safe_destination(Path(ep.workdir), local, remote_rel)
        if local.is_dir():
            shutil.copytree(local, dest, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(local, dest)

    def write(self, ep: Endpoint, remote_rel: str, text: str) -> None:
        dest = Path(ep.workdir) / check_relative(remote_rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp")
        tmp.write_text(text)
        tmp.replace(dest)

    def start(self, ep: Endpoint, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        if self.status(ep, [name])[name].state == ProcState.RUNNING:
            return
        workdir = Path(ep.workdir)
        (workdir / "procs").mkdir(parents=True, exist_ok=True)
        full_env = {**payload_base_env(), **ep.env, **(env or {})}
        pid = spawn_detached(["/bin/sh", "-c", wrapped_command(name, argv)], workdir, full_env)
        (workdir / "procs" / f"{name}.pid").write_text(str(pid))

    def status(self, ep: Endpoint, names: list[str]) -> dict[str, ProcStatus]:
        _reap()
        out: dict[str, ProcStatus] = {}
        procs = Path(ep.workdir) / "procs"
        for name in names:
            try:
                pid = int((procs / f"{name}.pid").read_text().strip())
            except (FileNotFoundError, ValueError):
                out[name] = ProcStatus(ProcState.ABSENT)
                continue
            if pid_alive(pid):
                out[name] = ProcStatus(ProcState.RUNNING)
                continue
            try:
                code = int((procs / f"{name}.exit").read_text().strip())
            except (FileNotFoundError, ValueError):
                code = -9  # killed before the shell could record a code
            out[name] = ProcStatus(ProcState.EXITED, code)
        return out

    def stop(self, ep: Endpoint, name: str) -> None:
        pidfile = Path(ep.workdir) / "procs" / f"{name}.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return
        kill_group(pid)
        deadline = self.clock.monotonic() + 5
        while pid_alive(pid) and self.clock.monotonic() < deadline:
            self.clock.sleep(0.02)
        _reap()

    def read_log(self, ep: Endpoint, name: str, offset: int = 0) -> bytes:
        try:
            with (Path(ep.workdir) / "logs" / f"{name}.log").open("rb") as fh:
                fh.seek(offset)
                return fh.read()
        except FileNotFoundError:
            return b""
