"""SIGTERM handled like Ctrl-C by the commands that own cloud resources while they run (a foreground launch,
an image bake): `kill`, `timeout` and a stopping service then tear down instead of orphaning instances."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM: unwinds like Ctrl-C (every ``finally`` runs), so nothing is left running or billing."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises ``Terminated``; the previous handler is back afterwards."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread (embedded use): SIGTERM keeps its handler
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
