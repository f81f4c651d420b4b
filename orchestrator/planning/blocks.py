"""The stockouts and quotas in force for a spec's cloud project, read from the results DB for placement."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from orchestrator.model.blocks import provider_key
from orchestrator.model.spec import JobSpec
from orchestrator.store.env import db_exists, default_url

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KnownBlock:
    """A block row read out of its session (placement only reads these four fields)."""

    scope: str
    location: str
    resource: str
    reason: str | None


def known_blocks(spec: JobSpec) -> list[KnownBlock]:
    """The stockouts and quotas in force for this spec's cloud project, for placement. Read from an existing
    results DB only: planning creates no file, and a DB it cannot read means no blocks, not an error."""
    url = default_url()
    if not spec.provider.is_cloud or not db_exists(url):
        return []
    from orchestrator.store import queries  # lazy: SQLAlchemy and the ORM only where a DB is there to read
    from orchestrator.store.db import open_session

    try:
        with open_session(url) as session:
            rows = queries.active_blocks(session, provider_key(spec))
            return [KnownBlock(b.scope, b.location, b.resource, b.reason) for b in rows]
    except Exception as exc:  # a courtesy: the executor still skips blocked zones at create time
        log.warning("could not read stockout/quota blocks from %s: %s", url.split("@")[-1], exc)
        return []
