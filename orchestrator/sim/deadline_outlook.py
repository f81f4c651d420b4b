"""``plan``'s deadline outlook, one entry over the three families of deadline policy
(issue 53, item 3; ``decide.policies``): one market (``sim.availability``), several markets at once (zones, GPU types:
``sim.multizone``) and elastic counts (``sim.elastic``). Each family's rows replay the same start ticks
(``sim.availability.outlook_starts``), so the rows compare run for run; planning (``planning.outlook``) asks here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.decide import policies
from orchestrator.model.availability import AvailabilityTrace
from orchestrator.sim.availability import OUTLOOK_STARTS, Job, Outlook, outlook
from orchestrator.sim.elastic import elastic_outlook
from orchestrator.sim.multizone import Market, zones_outlook


@dataclass(frozen=True)
class Markets:
    """Where the job may run spot, as its outlook replays it. ``traces``: the job's own market (each trace a market
    replayed on its own, the rows averaged over them); ``zoned``: the traces are zones the job holds at once (the
    several-markets row too); ``typed``: other GPU types the job holds with its own, each with its trace;
    ``elastic_workers``: the traces count spot VMs and the job's world shrinks and grows over that many workers
    (the elastic row too; 0: all or nothing)."""

    traces: list[AvailabilityTrace]
    zoned: bool = False
    typed: tuple[tuple[Market, AvailabilityTrace], ...] = field(default=())
    elastic_workers: int = 0


def outlook_rows(job: Job, markets: Markets, starts: int = OUTLOOK_STARTS) -> list[Outlook]:
    """Every online deadline policy that applies to ``markets``: its mean cost and chance of meeting the deadline.
    One market's policies first (``policies.ONLINE_POLICIES``), then the zones row, the GPU types row and the
    elastic row where they apply."""
    zones, typed = policies.ZONE_POLICIES[0], policies.MARKET_POLICIES[0]
    rows = outlook(job, markets.traces, starts)
    if markets.zoned:
        rows.append(zones_outlook(job, markets.traces, starts, name=zones))
    if markets.typed:
        every = [*markets.traces, *(t for _, t in markets.typed)]
        rows.append(zones_outlook(job, every, starts, markets=(Market(), *(m for m, _ in markets.typed)), name=typed))
    if markets.elastic_workers:
        rows.append(elastic_outlook(job, markets.elastic_workers, markets.traces, starts))
    return rows
