"""Whether and how a lost instance is replaced, and where: one rule for the daemon (decide.reconcile)
and the simulator (sim.engine), which look it up on this module at call time."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from orchestrator.model.instances import Role
from orchestrator.model.spec import (
    OnRevocation,
)
from orchestrator.model.timings import REVOKED_GRACE_S


def is_critical(role: Role, hosts_chief: bool = False) -> bool:
    """Losing this instance rolls training back to the last checkpoint and pauses it until a
    replacement is up: a parameter server, the chief, or a worker whose VM also runs the chief."""
    return role != Role.WORKER or hosts_chief


class Verdict(StrEnum):
    REPLACE = "replace"
    SHRINK = "shrink"  # carry on without this worker
    EXHAUSTED = "exhausted"  # policy.max_replacements reached


@dataclass(frozen=True)
class Replacement:
    verdict: Verdict
    spot: bool = False  # the replacement's pricing (REPLACE only)


def decide_replacement(role: Role, *, preempted: bool, spot: bool, on_revocation: OnRevocation,
                       replacements: int, max_replacements: int, hosts_chief: bool = False) -> Replacement:
    """What happens to a slot whose instance was lost (``preempted``: revoked by the cloud, not lost
    otherwise). Under ``shrink`` a preempted plain worker is not replaced; a PS or the chief always is.
    ``fallback-on-demand`` replaces a preempted spot instance with an on-demand one."""
    if on_revocation == OnRevocation.SHRINK and preempted and not is_critical(role, hosts_chief):
        return Replacement(Verdict.SHRINK)
    if replacements >= max_replacements:
        return Replacement(Verdict.EXHAUSTED)
    fallback = preempted and on_revocation == OnRevocation.FALLBACK_ON_DEMAND
    return Replacement(Verdict.REPLACE, spot=spot and not fallback)


def replacement_zones(last_zone: str, zones: tuple[str, ...], rotate: bool = False) -> tuple[str, ...]:
    """Zones to try for a replacement, in order: the lost instance's zone first (its GPUs and disks are
    there), then the slot's other zones; ``rotate`` starts at the zone after it instead."""
    if rotate and last_zone in zones:
        k = zones.index(last_zone) + 1
        return zones[k:] + zones[:k]
    return (last_zone,) + tuple(z for z in zones if z != last_zone)


def in_notice_grace(revoked_at: float, now: float, notice_s: float | None = None) -> bool:
    """A revoked instance still in its notice window (plus the checkpoint upload: as long again) is not
    deleted yet; ``notice_s``: the window the VM really has (``notice_window_s``)."""
    return now - revoked_at < (REVOKED_GRACE_S if notice_s is None else 2 * notice_s)


