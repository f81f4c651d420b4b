"""Which processes belong to a local instance, read from /proc: its hypervisor by command line (``python -m
orchestrator.providers.local.host DIR``), and whatever runs in its folder by working directory (the
hypervisor runs in DIR, the job's processes in DIR/disk).

Both follow the instance, not a pid file: a pid read from a file is killed only once /proc says it is still
that instance's process, so a pid the system gave to another process since is never killed. A folder that
was removed (or moved aside by a delete) stays the working directory of what ran in it, which is how the
processes of an instance whose folder is gone are still found.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.transport.local import kill_group

HOST_MODULE = "orchestrator.providers.local.host"
_GONE = " (deleted)"  # how /proc shows a working directory that was removed


@dataclass(frozen=True)
class Proc:
    pid: int
    cwd: str  # as /proc shows it, without the " (deleted)" of a removed folder
    argv: tuple[str, ...]
    removed: bool  # its working directory was removed


def host_argv(instance_dir: Path) -> list[str]:
    """The hypervisor's command line: the instance's folder is its identity (and its working directory)."""
    return [sys.executable, "-m", HOST_MODULE, str(instance_dir)]


def read(pid: int) -> Proc | None:
    """The live process ``pid`` (None: gone, a zombie, or not readable)."""
    base = Path("/proc") / str(pid)
    try:
        stat = (base / "stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return None
        cwd = os.readlink(base / "cwd")
        raw = (base / "cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    removed = cwd.endswith(_GONE)
    argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0")[:-1])
    return Proc(pid, cwd[: -len(_GONE)] if removed else cwd, argv, removed)


def all_processes() -> list[Proc]:
    out = []
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != me:
            proc = read(int(entry.name))
            if proc is not None:
                out.append(proc)
    return out


def host_dir(proc: Proc) -> Path | None:
    """The instance folder ``proc`` is the hypervisor of, or None."""
    if len(proc.argv) == 4 and proc.argv[1:3] == ("-m", HOST_MODULE):
        return Path(proc.argv[3])
    return None


def _same(a: Path | None, b: Path) -> bool:
    return a is not None and (a == b or os.path.realpath(a) == os.path.realpath(b))


def is_host_of(pid: int, instance_dir: Path) -> bool:
    proc = read(pid)
    return proc is not None and _same(host_dir(proc), instance_dir)


def hosts_of(instance_dir: Path, procs: list[Proc] | None = None) -> list[int]:
    """The live hypervisors of ``instance_dir`` (one: a create starts one, and its resends none while it runs)."""
    return [p.pid for p in (all_processes() if procs is None else procs) if _same(host_dir(p), instance_dir)]


def inside(proc: Proc, folder: str) -> bool:
    """Does ``proc`` run in ``folder`` or below it? (``folder`` as /proc shows it: real, absolute.)"""
    return proc.cwd == folder or proc.cwd.startswith(folder.rstrip("/") + "/")


def running_in(folder: Path | str, procs: list[Proc] | None = None) -> list[int]:
    """The live processes whose working directory is ``folder`` or below it (removed or not)."""
    real = os.path.realpath(folder) if isinstance(folder, Path) else folder
    return [p.pid for p in (all_processes() if procs is None else procs) if inside(p, real)]


def end(pids: list[int]) -> None:
    """SIGKILL each process and the group it leads (a job's shell leads its training processes)."""
    for pid in pids:
        kill_group(pid)
