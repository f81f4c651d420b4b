"""How local workers that share this host's cores step: a processor-sharing queue, not a demand ratio.

Each local worker cycles between CPU work (``cpu_s`` core-seconds a step: the model on the CPU) and the
emulated GPU's sleep (``nap_s``: no CPU). While ``k`` workers want the CPU on ``cores`` cores, each gets
``min(1, cores / k)`` of a core (the kernel's fair scheduler). Queueing happens well before the average
demand reaches the core count: at 91% average demand on 2 cores, three workers still meet often enough to
stretch each step by ~10%, which a demand-ratio stretch (``max(1, demand / cores)``) misses entirely.

Whatever else runs on the host takes its share too: ``background`` other runnable processes (measured by
the caller, e.g. ``planning/host_load.py``; 0 on an idle host) are customers that never leave, so ``k`` busy
workers each get ``min(1, cores / (k + background))`` of a core.

Synchronous training (DDP) is a lockstep instead: every worker starts a step together after the
all-reduce, so :func:`lockstep_steps` runs one cycle from that common start.

The cycle is deterministic, so the mean step comes from a short exact event run (a few thousand events,
well under a millisecond per hundred cycles); +/-30% jitter on both parts moved the rates by < 0.5% in a
check against a randomised run, so the deterministic run stands for the noisy one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

CYCLES = 400  # steps of the slowest worker averaged over (after as many again of warm-up)
_EPS = 1e-12


def shared_steps(cpu_s: Sequence[float], nap_s: Sequence[float], cores: float,
                 background: float = 0.0) -> list[float]:
    """Mean seconds a step of each worker takes when they share ``cores`` cores with ``background`` other
    always-runnable processes."""
    key = (tuple(round(c, 6) for c in cpu_s), tuple(round(s, 6) for s in nap_s), float(cores),
           round(max(background, 0.0), 3))
    return list(_shared_steps(*key))


@functools.lru_cache(maxsize=4096)
def _shared_steps(cpu: tuple[float, ...], nap: tuple[float, ...], cores: float,
                  background: float) -> tuple[float, ...]:
    busy = [i for i, c in enumerate(cpu) if c > 0]  # a worker with no CPU work never waits, nor delays
    if len(busy) + background <= cores:  # nobody ever waits for a core
        return tuple(c + s for c, s in zip(cpu, nap, strict=True))
    run = _Run(tuple(cpu[i] for i in busy), tuple(nap[i] for i in busy), cores, background=background)
    run.until(CYCLES)  # warm-up: the start (everyone on the CPU at once) is not the steady state
    t0, done0 = run.t, list(run.done)
    run.until(2 * CYCLES)
    mean = dict(zip(busy, ((run.t - t0) / (d - d0) for d, d0 in zip(run.done, done0, strict=True)), strict=True))
    return tuple(mean.get(i, c + s) for i, (c, s) in enumerate(zip(cpu, nap, strict=True)))


def lockstep_steps(cpu_s: Sequence[float], nap_s: Sequence[float], cores: float,
                   background: float = 0.0) -> list[float]:
    """When each worker of a synchronous step is done (CPU part, then its nap), all starting together: the
    step is the last of them (the all-reduce waits for it)."""
    run = _Run(tuple(cpu_s), tuple(nap_s), cores, repeat=False, background=max(background, 0.0))
    run.until(1)
    return run.finished_at


class _Run:
    """Exact event run of the cycle; ``done[i]`` counts worker i's finished steps. Without ``repeat`` a
    worker that has finished its step waits (off the CPU) for the others: a synchronous step."""

    def __init__(self, cpu: tuple[float, ...], nap: tuple[float, ...], cores: float, repeat: bool = True,
                 background: float = 0.0) -> None:
        self.cpu, self.nap, self.cores, self.repeat, self.background = cpu, nap, cores, repeat, background
        self.t = 0.0
        self.left = list(cpu)  # CPU seconds left of the current step
        self.wake = [0.0] * len(cpu)  # when a sleeping worker's nap ends
        self.on_cpu = [True] * len(cpu)
        self.done = [0] * len(cpu)
        self.finished_at = [0.0] * len(cpu)  # when each worker last finished a step

    def until(self, cycles: int) -> None:
        while self.done and min(self.done) < cycles:
            self._step()

    def _step(self) -> None:
        busy = [i for i, on in enumerate(self.on_cpu) if on]
        share = min(1.0, self.cores / (len(busy) + self.background)) if busy else 0.0
        waits = [self.left[i] / share for i in busy] + [self.wake[i] - self.t for i, on in enumerate(self.on_cpu)
                                                        if not on]
        dt = max(min(waits), 0.0)
        self.t += dt
        for i in busy:
            self.left[i] -= dt * share
        for i in range(len(self.cpu)):
            if self.on_cpu[i] and self.left[i] <= _EPS:
                self.on_cpu[i], self.wake[i] = False, self.t + self.nap[i]
            elif not self.on_cpu[i] and self.wake[i] - self.t <= _EPS:
                self.done[i] += 1
                self.finished_at[i] = self.t
                if self.repeat:
                    self.on_cpu[i], self.left[i] = True, self.cpu[i]
                else:
                    self.wake[i] = math.inf


__all__ = ["lockstep_steps", "shared_steps"]
