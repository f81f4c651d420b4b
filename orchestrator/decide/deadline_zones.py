"""Where ``on_revocation: deadline`` runs spot when the job may use several zones and the provider says which of
them have spot (GCE's capacity advice asked zone by zone, the local provider's trace per zone): the simulator's
choice (``sim.multizone``: ``decide.deadline.choose_zone`` and ``decide.deadline.zone_availability``), from the capacity
of each zone the daemon has recorded during the job.

Pure: reconcile calls it once a pass. Each zone's changes of capacity are recorded as note events
(``policy.ZONE_SEEN_EVENTS``, the zone leading the reason), so a daemon started later reads the same stretches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.costmodel.slots import Slot
from orchestrator.decide import deadline as policy
from orchestrator.decide.actions import RecordSpotAvailability
from orchestrator.decide.state import DeadlineInputs


@dataclass(frozen=True)
class ZoneChoice:
    zone: str | None  # where spot runs next (``policy.choose_zone``); None: no zone the job may use has spot now
    seen: policy.Availability | None  # the stretches seen in that zone
    up_age_h: float  # the age of that zone's spot stretch (hours of cloud time; 0 without a zone)
    records: tuple[RecordSpotAvailability, ...]  # the zones whose capacity changed since the last record

    def view(self, anywhere: policy.Availability) -> policy.Availability:
        """What the deadline policy reads, given the stretches of spot in any zone (``policy.zone_availability``)."""
        return policy.zone_availability(self.seen, anywhere)


def zone_reason(zone: str, available: bool) -> str:
    return f"{zone}: spot capacity {'there' if available else 'none'}"


def zone_of_reason(reason: str) -> str:
    """The zone of a ``zone_reason`` (what ``control.deadline`` reads back from the note events)."""
    return reason.partition(":")[0]


def shared_zones(slots: Iterable[Slot]) -> tuple[str, ...]:
    """The zones every one of the spot ``slots`` may use, in the first one's order (the job's VMs run together)."""
    slots = list(slots)
    if not slots:
        return ()
    return tuple(z for z in slots[0].zones if all(z in s.zones for s in slots[1:]))


def choose(slots: Iterable[Slot], by_zone: Mapping[str, bool] | None, blocked: Iterable[str],
           current: str | None, di: DeadlineInputs, started: float, now: float, hour_s: float
           ) -> ZoneChoice | None:
    """``policy.choose_zone`` over the zones the spot slots share. None where there is no choice to make: the
    provider does not say by zone, or the slots share fewer than two zones it answered for. ``blocked``: zones a
    create was refused in lately (the advice is a forecast; the refusal overrules it). ``current``: the zone of
    the spot VM that runs now, if one does."""
    if by_zone is None:
        return None
    zones = [z for z in shared_zones(slots) if z in by_zone]
    if len(zones) < 2:
        return None
    blocked = set(blocked)
    recorded = dict(di.zone_spot_seen)
    records = tuple(RecordSpotAvailability(by_zone[z], zone_reason(z, by_zone[z]), zone=z) for z in zones
                    if not recorded.get(z) or recorded[z][-1][1] != by_zone[z])
    changes = {z: (*recorded.get(z, ()), *((now, r.available) for r in records if r.zone == z)) for z in zones}
    seen: dict[str, policy.Availability] = {}
    up_ages: dict[str, float] = {}
    for z in zones:
        seen[z], age = policy.seen_during_job(changes[z], started, now, di.tick_s, hour_s)
        if by_zone[z] and z not in blocked:
            up_ages[z] = age
    where = policy.choose_zone(current if current in zones else None, up_ages, seen)
    if where is None:
        return ZoneChoice(None, None, 0.0, records)
    return ZoneChoice(where, seen[where], up_ages[where], records)


def zones_from(chosen: str | None, order: tuple[str, ...]) -> tuple[str, ...]:
    """The chosen zone first, then the rest in ``order`` (a create falls through them if it is refused); ``order``
    as it is without a choice."""
    return (chosen, *(z for z in order if z != chosen)) if chosen in order else order
