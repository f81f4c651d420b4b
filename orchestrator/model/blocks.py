"""Places a provider said no to, remembered with an expiry (the ``blocks`` table): a zone out of a GPU, a
region's quota, a project's global GPU quota (GPUS_ALL_REGIONS). Creates skip them; replacements prefer
zones that are not blocked. Pure helpers; the executor writes and reads the rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from orchestrator.model.catalog import region_of
from orchestrator.model.cloud_errors import CapacityError, QuotaError
from orchestrator.model.spec import JobSpec

STOCKOUT_BLOCK_S = 600.0  # a zone out of capacity: skipped this long, then tried again
QUOTA_BLOCK_S = 1800.0  # a quota rarely frees by itself (our own deletes free it: blocks expire anyway)
ANY_GPU = "gpu"  # resource of a block that stops every GPU request (GPUS_ALL_REGIONS)


class BlockLike(Protocol):
    @property
    def scope(self) -> str: ...
    @property
    def location(self) -> str: ...
    @property
    def resource(self) -> str: ...
    @property
    def reason(self) -> str | None: ...


def provider_key(spec: JobSpec) -> str:
    """Whose blocks these are: one cloud project (or inventory); never credentials."""
    return spec.provider.owner_key()


def resource_of(gpu: str | None) -> str:
    return gpu or "cpu"


def blocked(blocks: Sequence[BlockLike], zone: str, gpu: str | None) -> str | None:
    """Why ``zone`` cannot take this request now, or None."""
    for b in blocks:
        if b.resource != resource_of(gpu) and not (b.resource == ANY_GPU and gpu is not None):
            continue
        where = {"zone": zone, "region": region_of(zone), "global": "global"}.get(b.scope)
        if where == b.location:
            return f"{b.scope} {b.location} blocked: {b.reason or '?'}"
    return None


def block_for(exc: CapacityError | QuotaError, zone: str, gpu: str | None) -> tuple[str, str, str, float]:
    """(scope, location, resource, ttl_s) of the block an error means."""
    if isinstance(exc, QuotaError):
        if exc.region == "global" or "ALL_REGIONS" in (exc.metric or ""):
            return "global", "global", ANY_GPU if gpu else "cpu", QUOTA_BLOCK_S
        return "region", exc.region or region_of(zone), resource_of(gpu), QUOTA_BLOCK_S
    return "zone", zone, resource_of(gpu), STOCKOUT_BLOCK_S


def prefer_unblocked(zones: Sequence[str], blocked_zones: Sequence[str]) -> tuple[str, ...]:
    """Zones in order, the blocked ones last (the executor skips them while their block lasts)."""
    return tuple(z for z in zones if z not in blocked_zones) + tuple(z for z in zones if z in blocked_zones)
