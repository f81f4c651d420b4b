"""When did the provider itself start and end an instance? The ledger runs between the two, not between when
the controller recorded the create and when it noticed the end (a create recorded by a daemon killed before
it sent it, and sent by a later one, must not add the downtime to the bill; nor a daemon down for a minute
during a preemption)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def provider_end_time(provider: object, name: str) -> float | None:
    """The provider's own end time of ``name``: ``ended_at(name)`` where a provider has it (e.g. from the
    deletion / preemption operation), else its ``history(name)`` record's kill or deletion time."""
    try:
        ended_at: Callable[[str], float | None] | None = getattr(provider, "ended_at", None)
        if callable(ended_at):
            value = ended_at(name)
            if value is not None:
                return float(value)
        history: Callable[[str], dict[str, Any] | None] | None = getattr(provider, "history", None)
        record = history(name) if callable(history) else None
        if isinstance(record, dict):
            for key in ("killed_at", "deleted_at"):  # a preemption's hard off comes before our delete
                value = record.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    return float(value)
    except Exception as exc:  # noqa: BLE001 - without the provider's time the bill closes now, as before
        log.info("no end time from the provider for %s: %s", name, exc)
    return None


def provider_start_time(provider: object, name: str) -> float | None:
    """The provider's own creation time of ``name`` (the send that created it, whichever process sent it):
    ``started_at(name)`` where a provider has it, else its ``history(name)`` record's ``created_at``."""
    try:
        started_at: Callable[[str], float | None] | None = getattr(provider, "started_at", None)
        if callable(started_at):
            value = started_at(name)
            if value is not None:
                return float(value)
        history: Callable[[str], dict[str, Any] | None] | None = getattr(provider, "history", None)
        record = history(name) if callable(history) else None
        if isinstance(record, dict):
            created = record.get("created_at")
            if isinstance(created, int | float) and not isinstance(created, bool):
                return float(created)
    except Exception as exc:  # noqa: BLE001 - without the provider's time the bill runs from our latest send
        log.info("no start time from the provider for %s: %s", name, exc)
    return None
