"""The one place the product reads the time: a ``Clock`` passed through the layers above the pure ones (control's
job context and pass loop, the providers, store timestamps, transport, cli). ``WALL`` is the real clock, the
default everywhere; ``VirtualClock`` is time the caller advances, so that the daemon's pass loop, the local
provider and its emulated hosts can run a job of many minutes in a fraction of a second (tests/fastforward.py).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time as _time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

__all__ = ["WALL", "Clock", "ClockClosed", "VirtualClock", "WallClock"]


@runtime_checkable
class Clock(Protocol):
    def time(self) -> float:
        """Unix time, seconds."""

    def monotonic(self) -> float:
        """Seconds for measuring intervals (never goes back)."""

    def sleep(self, seconds: float) -> None: ...

    def now(self) -> datetime:
        """The local date and time, naive (what a scheduler's first run takes)."""

    def utcnow(self) -> datetime:
        """The date and time in UTC, aware."""


class WallClock:
    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    def sleep(self, seconds: float) -> None:
        _time.sleep(seconds)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.time())

    def utcnow(self) -> datetime:
        return datetime.now(UTC)


WALL: Clock = WallClock()


class ClockClosed(BaseException):
    """Raised in a thread sleeping on a VirtualClock that was closed: it unwinds whatever loop the thread runs
    (a BaseException, so a loop's ``except Exception`` does not swallow it)."""


class VirtualClock:
    """Time that moves only when a thread sleeps on it.

    The threads that take part (the caller's, and those started with ``spawn``) run one at a time: ``sleep``
    hands over to the thread due next, and time jumps to when it is due. Which thread runs, and at what time,
    depends only on the sleeps (ties: the order they were asked for), never on the host's speed or load, so a run
    is the same every time. With one thread, ``sleep`` simply advances time."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01 00:00 UTC
        self._t = start
        self._cv = threading.Condition()
        self._due: list[tuple[float, int, int]] = []  # (wake time, order asked, thread ident)
        self._order = itertools.count()
        self._running: int | None = None  # the ident of the one thread that runs now
        self._closed = False

    def time(self) -> float:
        return self._t

    def monotonic(self) -> float:
        return self._t

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._t)

    def utcnow(self) -> datetime:
        return datetime.fromtimestamp(self._t, UTC)

    def sleep(self, seconds: float) -> None:
        me = threading.get_ident()
        with self._cv:
            heapq.heappush(self._due, (self._t + max(0.0, seconds), next(self._order), me))
            if self._running in (me, None):
                self._running = None
                self._hand_over()
            self._wait_turn(me)

    advance = sleep

    def spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        """Start ``target`` in a thread that takes part: it first runs when the caller next sleeps."""
        ready = threading.Event()

        def body() -> None:
            me = threading.get_ident()
            with self._cv:
                heapq.heappush(self._due, (self._t, next(self._order), me))
                ready.set()
                self._wait_turn(me)
            try:
                target()
            except ClockClosed:
                pass
            finally:
                with self._cv:
                    if self._running == me:
                        self._running = None
                        self._hand_over()

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        ready.wait()  # queued before the caller goes on: the order of spawns is the order they run in
        return thread

    def close(self) -> None:
        """End every thread still sleeping here (each gets ClockClosed)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def _hand_over(self) -> None:
        if self._due:
            wake, _, who = heapq.heappop(self._due)
            self._t = max(self._t, wake)
            self._running = who
            self._cv.notify_all()

    def _wait_turn(self, me: int) -> None:
        while self._running != me:
            if self._closed:
                raise ClockClosed
            self._cv.wait()
