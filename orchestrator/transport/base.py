"""The transport interface shared by local processes and SSH hosts.

On every instance a process named ``NAME`` leaves ``procs/NAME.pid`` (its process group), ``procs/NAME.exit``
(its exit code, once it ends) and ``logs/NAME.log`` in the instance's work directory, so that a restarted
controller (or the emulated cloud revoking the instance) finds and stops it.
"""

from __future__ import annotations

import abc
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.model.instances import ProcStatus


@dataclass(frozen=True)
class Endpoint:
    """Where an instance is reached: a work directory, on this machine or over SSH."""

    workdir: str
    host: str = "127.0.0.1"
    port: int = 22
    user: str | None = None
    key_path: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # The SSH host keys the server must show (transport/host_keys.py): pinned lines, and/or a source
    # asked at connect time (a VM's published keys); with neither, the known_hosts file is the judge.
    host_keys: tuple[str, ...] = ()
    known_hosts: str | None = None
    host_key_source: Callable[[], Sequence[str]] | None = field(default=None, compare=False, repr=False)


class TransportError(Exception):
    """The instance could not be reached or the command failed."""


class FatalTransportError(TransportError):
    """Retrying cannot help (a wrong host key, a refused login): the job fails at once with this reason."""


class UnsafePathError(TransportError):
    """A file to push would land outside the instance's work directory, or inside itself: never retried."""


def check_relative(remote_rel: str, what: str = "a file") -> str:
    """``remote_rel`` if it names a place inside the work directory: relative, no ``..``, not the
    directory itself (the same check for every transport, before anything reaches a host)."""
    parts = [p for p in remote_rel.replace("\\", "/").split("/") if p not in ("", ".")]
    if remote_rel.startswith(("/", "~")) or ".." in parts or not parts or "\0" in remote_rel:
        raise UnsafePathError(f"{what} would be copied to {remote_rel!r}, outside the instance's work "
                              "directory; list files by a name inside the job's folder")
    return remote_rel


def wrapped_command(name: str, argv: list[str]) -> str:
    """A shell line that records the process's exit code beside its pid file and logs to logs/NAME.log."""
    cmd = " ".join(shlex.quote(a) for a in argv)
    return (f"mkdir -p procs logs; rm -f procs/{name}.exit; "
            f"({cmd}) >>logs/{name}.log 2>&1 </dev/null; echo $? > procs/{name}.exit.tmp; "
            f"mv procs/{name}.exit.tmp procs/{name}.exit")


class Transport(abc.ABC):
    @abc.abstractmethod
    def wait_reachable(self, ep: Endpoint, timeout_s: float) -> None: ...

    @abc.abstractmethod
    def put(self, ep: Endpoint, local: Path, remote_rel: str) -> None:
        """Copy a file or a directory tree into the work directory."""

    @abc.abstractmethod
    def write(self, ep: Endpoint, remote_rel: str, text: str) -> None: ...

    @abc.abstractmethod
    def start(self, ep: Endpoint, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``argv`` detached in the work directory (a no-op if it is already running)."""

    @abc.abstractmethod
    def status(self, ep: Endpoint, names: list[str]) -> dict[str, ProcStatus]: ...

    @abc.abstractmethod
    def stop(self, ep: Endpoint, name: str) -> None:
        """Kill the process group (not-running is success)."""

    @abc.abstractmethod
    def read_log(self, ep: Endpoint, name: str, offset: int = 0) -> bytes: ...
