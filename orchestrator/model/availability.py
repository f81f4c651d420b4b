"""Spot availability traces: how many spot VMs could be had at each tick (shared/spot-traces, the data of
"Can't Be Late", NSDI'24, measured by asking the cloud for spot capacity at fixed intervals). Read by the
deadline-policy simulator (``sim.availability``) and replayed by the local provider."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class AvailabilityTraceError(ValueError):
    pass


@dataclass(frozen=True)
class AvailabilityTrace:
    counts: tuple[int, ...]  # spot VMs obtainable at each tick
    gap_s: float
    name: str = "trace"

    @property
    def tick_min(self) -> int:
        return max(1, round(self.gap_s / 60))

    def available(self, need: int = 1) -> tuple[bool, ...]:
        return tuple(c >= need for c in self.counts)

    def count_at(self, tick: int) -> int:
        """Past its end a trace has no spot VMs (a replay that long is not what it measured)."""
        return self.counts[tick] if 0 <= tick < len(self.counts) else 0

    def next_drop(self, tick: int, need: int = 1) -> int | None:
        """The first tick after ``tick`` with fewer than ``need`` spot VMs (None: never, within the trace)."""
        for k in range(tick + 1, len(self.counts)):
            if self.counts[k] < need:
                return k
        return None


def load_trace(path: Path) -> AvailabilityTrace:
    """A trace file: {"metadata": {"gap_seconds": N}, "data": [count per tick, ...]}."""
    try:
        doc = json.loads(path.read_text())
        gap = float(doc["metadata"]["gap_seconds"])
        counts = tuple(int(x) for x in doc["data"])
    except OSError as exc:
        raise AvailabilityTraceError(f"{path}: cannot read the availability trace ({exc.strerror})") from None
    except (ValueError, KeyError, TypeError):
        raise AvailabilityTraceError(f"{path}: not an availability trace; expected "
                                     '{"metadata": {"gap_seconds": N}, "data": [counts per tick]}') from None
    if not gap > 0 or not counts or min(counts) < 0:
        raise AvailabilityTraceError(f"{path}: gap_seconds must be > 0 and data non-empty counts >= 0")
    return AvailabilityTrace(counts, gap, path.stem)
