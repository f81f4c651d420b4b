"""Where ``on_revocation: deadline`` runs the job's spot workers when it may move them to other GPU types
(``policy.also_gpus``): the simulator's choice (``sim.multizone`` over markets, ``decide.deadline_markets.decide``)
made by the daemon, from the capacity of each GPU type it has recorded during the job.

Pure: reconcile calls it once a pass. Each GPU type's changes of capacity are recorded as the zones' are (note
events, ``policy.ZONE_SEEN_EVENTS``), under ``market_key(gpu)``, so a daemon started later reads the same stretches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from orchestrator.decide import deadline as policy
from orchestrator.decide import deadline_markets, deadline_zones
from orchestrator.decide.actions import RecordSpotAvailability
from orchestrator.decide.deadline import Availability, Mode, Progress
from orchestrator.decide.state import GpuMarket, InstanceView, JobView

OWN = deadline_markets.OWN  # the market of the job's own GPU types (in its zones: decide.deadline_zones picks one)


def market_key(gpu: str) -> str:
    """The name a GPU type's capacity changes are recorded under (never a zone's: zones have no spaces)."""
    return f"gpu {gpu}"


@dataclass(frozen=True)
class GpuChoice:
    mode: Mode
    market: GpuMarket | None  # spot on this GPU type; None: on the job's own (spot or on-demand) or nothing
    records: tuple[RecordSpotAvailability, ...]  # the GPU types whose capacity changed since the last record


def union(changes: Iterable[tuple[tuple[float, bool], ...]]) -> tuple[tuple[float, bool], ...]:
    """The changes of "spot in any of these markets", from each market's (time, available) changes."""
    events = sorted((at, k, up) for k, c in enumerate(changes) for at, up in c)
    state: dict[int, bool] = {}
    out: list[tuple[float, bool]] = []
    for at, k, up in events:
        state[k] = up
        anywhere = any(state.values())
        if not out or out[-1][1] != anywhere:
            out.append((at, anywhere))
    return tuple(out)


def choose(base: Progress, own_seen: Availability, job: JobView, by_gpu: Mapping[str, bool] | None,
           live_spot: Iterable[InstanceView], now: float, blocked: Iterable[str | None] = ()) -> GpuChoice | None:
    """``deadline_markets.decide`` over the job's own spot (``base`` and ``own_seen``, as the deadline policy reads
    them without other GPU types) and each GPU type the provider answered for (``by_gpu``). None without such a
    type. ``live_spot``: the job's spot VMs that run now (on its own GPU types or another). ``blocked``: types
    that refused a create lately or preempted a VM just now (the advice is a forecast; that overrules it)."""
    di = job.deadline_inputs
    markets = [m for m in di.markets if m.gpu in by_gpu] if di is not None and by_gpu is not None else []
    if di is None or by_gpu is None or not markets:
        return None
    planned = {s.gpu for s in job.slots}
    running = next((i.gpu for i in live_spot if i.gpu not in planned), None)
    started = job.started_at if job.started_at is not None else now
    hour_s = 3600.0 / di.time_scale
    recorded, gone = dict(di.zone_spot_seen), set(blocked)
    records, views, fast = [], {}, []
    for m in markets:
        key, up = market_key(m.gpu), by_gpu[m.gpu]
        changes = recorded.get(key, ())
        if not changes or changes[-1][1] != up:
            records.append(RecordSpotAvailability(up, deadline_zones.zone_reason(key, up), zone=key))
            changes = (*changes, (now, up))
        seen, age = policy.seen_during_job(changes, started, now, di.tick_s, hour_s)
        views[m.gpu] = deadline_markets.MarketView(m.speed, m.spot_usd_per_h, seen,
                                                   age if up and m.gpu not in gone else None)
        if m.speed >= 1.0:
            fast.append(changes)
    views[OWN] = deadline_markets.MarketView(1.0, base.spot_usd_per_h, own_seen,
                                             base.spot_up_h if base.spot_available else None)
    own = di.spot_seen
    if not own or own[-1][1] != base.spot_available:
        own = (*own, (now, base.spot_available))
    anywhere = union([own, *fast])
    outages, _ = policy.seen_during_job(anywhere, started, now, di.tick_s, hour_s, di.spot_before)
    # the outage the rule reads is of spot as fast as the job's own, in every such market at once
    outage_h = 0.0 if anywhere[-1][1] else (now - max(started, anywhere[-1][0])) / hour_s
    current = (running or OWN) if base.mode == Mode.SPOT else None
    mode, where = deadline_markets.decide(replace(base, outage_h=outage_h), views, current, outages)
    market = next((m for m in markets if m.gpu == where), None) if mode == Mode.SPOT else None
    return GpuChoice(mode, market, tuple(records))
