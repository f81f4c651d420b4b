"""The deadline studies' job and its prices, in minutes of cloud time (``sim.availability``, ``sim.optimum``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.decide.deadline import Mode


@dataclass(frozen=True)
class Job:
    """The study's job, in minutes of cloud time."""

    work_min: int
    deadline_min: int
    overhead_min: int
    spot_usd_per_h: float
    on_demand_usd_per_h: float
    # A what-if (bench/deadline_policy.py --overlap-hops): make-before-break hops. From on-demand, spot means a
    # standby spot VM boots while the on-demand one trains (the boot, overhead - this, billed at the spot price);
    # once it is up (and spot still there) the hop costs only this much (restore). Spot going while it boots
    # takes only the boot's money. None: a hop costs the whole overhead, as the daemon's hops do today.
    hop_overhead_min: int | None = None
    # torchft replica groups (sim.elastic): a change of membership costs the workers that stay only this (a quorum's
    # pause), a joiner its boot (overhead_min); None: every change restarts the whole cluster (elastic torchrun).
    change_min: float | None = None


@dataclass
class Outcome:
    policy: str
    cost_usd: float
    finish_min: float
    deadline_met: bool
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (minute, mode) at each change
    work_at: list[tuple[float, float]] = field(default_factory=list)  # (minute, work done) per tick

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "cost_usd": round(self.cost_usd, 4), "finish_h": round(self.finish_min / 60, 4),
                "deadline_met": self.deadline_met,
                "timeline": [{"t_h": round(t / 60, 4), "mode": m} for t, m in self.timeline]}


def price_per_min(job: Job, mode: Mode) -> float:
    return {Mode.IDLE: 0.0, Mode.SPOT: job.spot_usd_per_h, Mode.ON_DEMAND: job.on_demand_usd_per_h}[mode] / 60.0


def boot_ticks(job: Job, tick: int) -> int:
    """Ticks a standby spot VM boots before it can take over (``Job.hop_overhead_min``)."""
    assert job.hop_overhead_min is not None
    return max(1, math.ceil((job.overhead_min - job.hop_overhead_min) / tick))


def boot_bill(job: Job, tick: int, left: int, spot_usd_per_h: float | None = None) -> float:
    """Dollars of a standby's boot billed in a tick with ``left`` boot ticks to go, this one included
    (``spot_usd_per_h``: its market's spot price; None: the job's)."""
    assert job.hop_overhead_min is not None
    done = (boot_ticks(job, tick) - left) * tick
    price = price_per_min(job, Mode.SPOT) if spot_usd_per_h is None else spot_usd_per_h / 60.0
    return price * max(0, min(tick, job.overhead_min - job.hop_overhead_min - done))
