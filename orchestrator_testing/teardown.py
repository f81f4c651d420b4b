"""For the benches (bench/*.py) that start jobs: `kill -TERM`, `timeout` or Ctrl-C never leaves an instance
running. The processes a bench starts (foreground launches, daemons) and the instances they created are
torn down before it exits non-zero (143 for SIGTERM, 130 for Ctrl-C), as `orchestrator launch` itself does.

Children run in sessions of their own, so a signal sent to the bench's process group (`timeout`, a
terminal's Ctrl-C) reaches them once, from here: a foreground launch given a second SIGTERM would leave
its teardown to a daemon instead of doing it.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.control.signals import Terminated, sigterm_raises
from orchestrator.providers.local.provider import LocalProvider  # here, not at teardown: nothing left to fail then

STOP_WAIT_S = 120.0  # a launch's teardown of local or emulated instances takes seconds


class Children:
    """The processes a bench started, stopped with one signal each when the bench is stopped."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[Any]] = []

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc: subprocess.Popen[Any] = subprocess.Popen(argv, start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """``subprocess.run(..., capture_output=True, text=True)``, but interruptible without killing the
        child outright (``subprocess.run`` SIGKILLs it, which would orphan its instances)."""
        proc = self.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        out, err = proc.communicate()
        self.procs.remove(proc)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def stop(self, sig: int = signal.SIGTERM, wait_s: float = STOP_WAIT_S) -> None:
        """``sig`` to each live child, then wait for it (a launch tears its instances down first)."""
        live = [p for p in self.procs if p.poll() is None]
        for proc in live:
            proc.send_signal(sig)
        for proc in live:
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                proc.kill()  # stuck: what it leaves behind, delete_local_instances deletes
                proc.wait()


def delete_local_instances(home: Path) -> list[str]:
    """Delete whatever the local provider under ``home`` still runs (its processes with it)."""
    if not (home / "local" / "instances").is_dir():
        return []
    provider = LocalProvider(home / "local")
    left = provider.list()
    for inst in left:
        provider.delete(inst.name, inst.zone)
    return [inst.name for inst in left]


@contextlib.contextmanager
def _ignored(*signals: int) -> Iterator[None]:
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def stopped_cleanly(children: Children, home: Path, *, before: Callable[[], None] | None = None) -> Iterator[None]:
    """Run the bench; on SIGTERM or Ctrl-C stop ``children`` (``before`` first, e.g. stopping daemons), delete
    any local instance left under ``home`` and exit non-zero."""
    try:
        with sigterm_raises():
            yield
    except KeyboardInterrupt as exc:
        what, code = ("SIGTERM", 143) if isinstance(exc, Terminated) else ("Ctrl-C", 130)
        print(f"{what}: stopping the bench's launches (each tears its instances down)", file=sys.stderr, flush=True)
        with _ignored(signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the teardown short
            if before is not None:
                before()
            children.stop()
            left = delete_local_instances(home)
        if left:
            print(f"deleted {len(left)} instance(s) the launches left: {', '.join(left)}", file=sys.stderr)
        print(f"{what}: bench stopped; no instance left running", file=sys.stderr, flush=True)
        raise SystemExit(code) from None
