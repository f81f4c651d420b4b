"""Re-splitting a running synchronous job's fixed global batch so that every rank finishes its compute together.

In synchronous DDP the slowest rank sets the pace: a rank whose GPU is slower than planned (or that slows
mid-run) makes every other rank wait at each collective. Each rank therefore measures its own compute time per
step now and then (a *probe*: forward + backward of its current slice with no collective, device synced, plus the
emulated GPU's time on the local provider), the ranks share those times, and every rank computes the same new
split: examples move from slow ranks to fast ones in proportion to their measured speed (examples per second of
compute). The global batch, the examples in it and the gradient stay exact (the loss is weighted by the global
batch and batch norm sums its statistics over every rank), so only the time per step changes.

A verdict takes two probes since the last change and each rank's faster one (a probe that another process on the
host interrupted reads slow; a real slowdown reads slow in both), and re-splits only while the ranks' compute
times differ by more than ``TOLERANCE``. After a balanced
verdict the probes become rarer (``MAX_BACKOFF`` times the base interval) to keep their cost small; a re-split,
a world change (a new Rebalancer) resets the interval.

A re-split is not free on a GPU: every rank meets new tensor shapes, and cuDNN's autotuner (``cudnn.benchmark``)
times its algorithms again for each (measured on an H200 under MPS: about 3.3 s per re-split, 18 steps' worth;
data/measurements/raw/h200-mps-resplit-2026-11-28-*). So the job measures what its last re-split cost (the
first step at the new split less the second) and declines a re-split whose saving over the steps left (the
slowest rank's compute now less the balanced compute at the measured speeds, per step) would not repay that.

Pure Python (no torch import): the trainer, the local emulation and tests use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchjob.split import proportional_split

TOLERANCE = 0.05  # ranks finish within 5% of each other: balanced
PROBES_PER_VERDICT = 2  # probes averaged before a decision
MAX_BACKOFF = 4  # a balanced job probes at most every 4x the base interval


def spread(compute_s: list[float]) -> float:
    """(slowest - fastest) / slowest of the ranks' compute seconds per step."""
    hi = max(compute_s)
    return (hi - min(compute_s)) / hi if hi > 0 else 0.0


def rebalanced(batches: list[int], compute_s: list[float], tolerance: float = TOLERANCE) -> list[int] | None:
    """New per-rank batches with the same total, proportional to each rank's measured speed, or None when the
    ranks already finish within ``tolerance`` of each other (or the split cannot change)."""
    if len(batches) < 2 or spread(compute_s) <= tolerance or min(compute_s) <= 0:
        return None
    speeds = [b / t for b, t in zip(batches, compute_s, strict=True)]
    new = proportional_split(sum(batches), speeds)
    return None if new == batches else new


def resplit_gain_s(batches: list[int], compute_s: list[float]) -> float:
    """Seconds per step a proportional re-split would save: the slowest rank's compute now less the compute
    every rank would take with examples in proportion to its measured speed (speed taken as constant)."""
    if min(compute_s) <= 0:
        return 0.0
    return max(compute_s) - sum(batches) / sum(b / t for b, t in zip(batches, compute_s, strict=True))


def initial_weights(planned: list[int], measured_speed: list[float | None]) -> list[float]:
    """Split weights for a (re)started world: each rank's measured examples/s where the job has measured its slot,
    else its planned batch scaled to the measured ranks' speed per planned example (the planner's proportions)."""
    known = [(p, s) for p, s in zip(planned, measured_speed, strict=True) if s]
    if not known:
        return [float(p) for p in planned]
    per_planned = sum(s for _, s in known) / sum(p for p, _ in known)
    return [float(s) if s else p * per_planned for p, s in zip(planned, measured_speed, strict=True)]


def slowdown_factor(slowdowns: list[tuple[int, float]], step: int) -> float:
    """The emulated device's slowdown at ``step``: the factor of the latest slowdown that has begun (1 before)."""
    factor = 1.0
    for at_step, f in sorted(slowdowns):
        if step >= at_step:
            factor = f
    return factor


@dataclass
class Rebalancer:
    """When to probe and what to do with the probes (one per rank; every rank holds the same state)."""

    every: int  # base probe interval in steps; 0 = never re-split
    tolerance: float = TOLERANCE
    backoff: int = 1
    last_probe_step: int = 0
    window: list[list[float]] = field(default_factory=list)  # the ranks' compute seconds per probe
    verdict: list[float] = field(default_factory=list)  # the compute seconds of the latest verdict, per rank
    cost_s: float = 0.0  # what the latest re-split cost the job (seconds; 0 until one is measured)
    declined: dict[str, float] | None = None  # the latest verdict's declined re-split: gain, steps left, cost

    def start(self, step: int) -> None:
        """A (re)started world begins at ``step``: its first probe comes one interval later."""
        self.last_probe_step = step

    def due(self, step: int) -> bool:
        return self.every > 0 and step - self.last_probe_step >= self.every * self.backoff

    def record(self, step: int, compute_s: list[float], batches: list[int],
               steps_left: int | None = None) -> list[int] | None:
        """Add one probe (every rank's compute seconds); the new batches when a re-split is due, else None.
        ``steps_left``: the steps the job has still to run (None: as many as it takes to repay any cost)."""
        self.last_probe_step = step
        self.window.append(compute_s)
        self.declined = None
        if len(self.window) < PROBES_PER_VERDICT:
            return None
        self.verdict = [min(col) for col in zip(*self.window, strict=True)]
        self.window.clear()
        new = rebalanced(batches, self.verdict, self.tolerance)
        if new is not None and steps_left is not None and self.cost_s > 0:
            gain = resplit_gain_s(batches, self.verdict)
            if gain * steps_left <= self.cost_s:
                self.declined = {"gain_s_per_step": gain, "steps_left": float(steps_left), "cost_s": self.cost_s}
                new = None
        if new is None:
            self.backoff = min(self.backoff * 2, MAX_BACKOFF)
        else:
            self.backoff = 1
        return new
