"""orchestrator/clock.py: the virtual clock's threads take turns in an order fixed by their sleeps alone."""

from __future__ import annotations

from orchestrator.clock import WALL, Clock, VirtualClock


def test_wall_and_virtual_clocks_are_clocks() -> None:
    assert isinstance(WALL, Clock) and isinstance(VirtualClock(), Clock)
    assert abs(WALL.utcnow().timestamp() - WALL.time()) < 5


def test_a_sleep_on_one_thread_advances_virtual_time() -> None:
    clock = VirtualClock(start=1000.0)
    clock.sleep(2.5)
    clock.sleep(-1)  # never back
    assert clock.time() == clock.monotonic() == 1002.5
    assert clock.utcnow().timestamp() == 1002.5


def test_threads_run_one_at_a_time_in_the_order_of_their_wake_times() -> None:
    clock = VirtualClock(start=0.0)
    seen: list[tuple[str, float]] = []

    def every(name: str, period: float, times: int) -> None:
        for _ in range(times):
            clock.sleep(period)
            seen.append((name, clock.time()))

    clock.spawn(lambda: every("a", 1.0, 3), "a")
    clock.spawn(lambda: every("b", 1.5, 2), "b")
    clock.sleep(10.0)
    # b asked for 3.0 at 1.5, a at 2.0: the one asked first runs first
    assert seen == [("a", 1.0), ("b", 1.5), ("a", 2.0), ("b", 3.0), ("a", 3.0)]
    assert clock.time() == 10.0


def test_close_ends_the_threads_still_sleeping() -> None:
    clock = VirtualClock()
    thread = clock.spawn(lambda: clock.sleep(1e9), "sleeper")
    clock.sleep(1.0)
    clock.close()
    thread.join(timeout=5)
    assert not thread.is_alive()
