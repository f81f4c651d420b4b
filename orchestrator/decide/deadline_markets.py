"""Where ``on_revocation: deadline`` trains when the job may run spot in several markets: zones, and GPU types of
other speeds and prices (issue 23, item 2). Pure: the simulator (``sim.multizone``) calls it each tick, the daemon
each pass where the job may move its spot workers to other GPU types (``decide.deadline_gpus``, ``policy.also_gpus``).

The deadline rule (``policy.deadline_policy``) reads the markets at least as fast as the job's GPU as its spot,
each priced per hour of the job's work, and ``policy.choose_zone`` picks among them. Where the rule waits out an
outage of those, the job trains on a slower GPU's spot if ``choose_slower_spot`` finds it pays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from orchestrator.decide import deadline as policy
from orchestrator.decide import knobs
from orchestrator.decide.deadline import Availability, Mode, Progress


@dataclass(frozen=True)
class MarketView:
    """One market as the policy sees it now."""

    speed: float  # work per hour there, in hours of the job's own GPU
    spot_usd_per_h: float
    seen: Availability  # its spot stretches seen so far
    up_age_h: float | None  # the age of its spot stretch; None: no spot there now


OWN = ""  # the name of the job's own market in a set of one (``MarketSet.of_one``)


@dataclass(frozen=True)
class MarketSet:
    """Where the job stands with the markets it may run spot in: the several-markets family's state
    (``decide.policies``). ``base``: the job against its deadline (its ``mode`` SPOT while a spot VM runs in
    ``current``); ``outages``: the outages of spot in every market as fast as the job's GPU at once."""

    base: Progress
    markets: Mapping[str, MarketView]
    current: str | None
    outages: Availability

    @classmethod
    def of_one(cls, p: Progress, seen: Availability) -> MarketSet:
        """One market is a market set of one: the job's own, whose ``decide`` is ``policy.deadline_policy``'s."""
        own = MarketView(1.0, p.spot_usd_per_h, seen, p.spot_up_h if p.spot_available else None)
        return cls(p, {OWN: own}, OWN if p.mode == Mode.SPOT else None, seen)


def decide_set(s: MarketSet) -> tuple[Mode, str | None]:
    """``decide`` of a ``MarketSet``: the several-markets family's ``decide.policies.Rule``."""
    return decide(s.base, s.markets, s.current, s.outages)


@dataclass(frozen=True)
class SlowerSpot:
    """Spot on a slower GPU type than the job's (another market the job may move to while its own is out)."""

    speed: float  # work per hour there, in hours of the job's own GPU (< 1)
    spot_usd_per_h: float
    up_left_h: float  # how much longer its spot stretch is expected to last, at its age




def decide(base: Progress, markets: Mapping[str, MarketView], current: str | None,
           outages: Availability) -> tuple[Mode, str | None]:
    """What to run next and, for spot, in which market. ``base``: where the job stands (its ``mode`` SPOT while a
    spot VM runs in ``current``); ``outages``: the outages of spot in every market as fast as the job's GPU at once."""
    fast = {n for n, m in markets.items() if m.speed >= 1.0}
    up = {n: m.up_age_h for n, m in markets.items() if m.up_age_h is not None}
    seen = {n: m.seen for n, m in markets.items()}
    on_slower = base.mode == Mode.SPOT and current not in fast  # the rule sees a job on a slower GPU as waiting
    where = policy.choose_zone(None if on_slower else current, {n: a for n, a in up.items() if n in fast}, seen)
    m = markets[where] if where is not None else None
    p = replace(base, mode=Mode.IDLE if on_slower else base.mode,
                overhead_left_h=0.0 if on_slower else base.overhead_left_h, spot_available=where is not None,
                spot_up_h=up[where] if where is not None else 0.0,
                spot_usd_per_h=m.spot_usd_per_h / m.speed if m is not None else base.spot_usd_per_h)
    c = policy.deadline_policy(p, policy.zone_availability(m.seen if m is not None else None, outages))
    if c != Mode.IDLE:
        return c, where if c == Mode.SPOT else None
    slower = {n: SlowerSpot(markets[n].speed, markets[n].spot_usd_per_h, seen[n].up_left(a))
              for n, a in up.items() if n not in fast}
    pick = choose_slower_spot(p, outages, slower, current if current in slower else None)
    return (Mode.SPOT, pick) if pick is not None else (Mode.IDLE, None)


def choose_slower_spot(p: Progress, outages: Availability, slower: dict[str, SlowerSpot],
                       current: str | None) -> str | None:
    """Where to train while the deadline rule waits for the job's own spot (it chose IDLE): stay on the slower
    GPU it runs on (``current``), or move to the one whose expected gain is largest and positive: the work done
    before the outage (``outages``, at its age) or that GPU's spot stretch ends, less its start, valued at the
    job's spot price plus SLOWER_VALUE of on-demand's premium, minus what it is billed. None: wait."""
    if current is not None and current in slower:
        return current
    outage_left = outages.down_left(p.outage_h)
    value = p.spot_usd_per_h + knobs.SLOWER_VALUE * max(0.0, p.on_demand_usd_per_h - p.spot_usd_per_h)

    def gain(s: SlowerSpot) -> float:
        run = min(outage_left, s.up_left_h)
        return s.speed * max(0.0, run - p.overhead_h) * value - s.spot_usd_per_h * run

    best = max(sorted(slower), key=lambda z: gain(slower[z]), default=None)
    return best if best is not None and gain(slower[best]) > 0 else None
