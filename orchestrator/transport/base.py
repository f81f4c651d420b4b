"""The transport interface shared by local processes and SSH hosts.

On every instance a process named ``NAME`` leaves ``procs/NAME.pid`` (its process group), ``procs/NAME.exit``
(its exit code, once it ends) and ``logs/NAME.log`` in the instance's work directory, so that a restarted
controller (or the emulated cloud revoking the instance) finds and stops it.
"""

from __future__ import annotations

import abc
import shlex
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


@dataclass(frozen=True)
class Endpoint:
    """Where an instance is reached: a work directory, on this machine or over SSH."""

    workdir: str
    host: str = "127.0.0.1"
    port: int = 22
    user: str | None = None
    key_path: str | None = None
    env: dict[str, str] = field(default_factory=dict)


class ProcState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    ABSENT = "absent"  # never started here (or the instance's disk was replaced)


@dataclass(frozen=True)
class ProcStatus:
    state: ProcState
    exit_code: int | None = None


class TransportError(Exception):
    """The instance could not be reached or the command failed."""


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
