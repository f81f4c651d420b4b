"""When did the provider itself end an instance? The ledger closes there, not when the controller noticed
(a daemon down for a minute during a preemption must not add a minute to the bill)."""

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
