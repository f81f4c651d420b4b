"""The quota read of a cloud spec, once per admission: the needs per region of the launch plan's slots and
those regions' quotas. A failure to *read* them (network, permissions) never blocks: it comes back as a warning,
and the create-time QUOTA_EXCEEDED handling still applies."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.costmodel.launch_plan import LaunchPlan
from orchestrator.model.cloud_errors import ProviderError
from orchestrator.model.errors import UserError
from orchestrator.model.spec import JobSpec
from orchestrator.providers.gce.quotas import Headroom, Quotas, headroom, quota_needs, quota_problems, read_quotas


@dataclass(frozen=True)
class QuotaRead:
    """What the quota read found: needs per region and metric, each region's quotas, or why none were read."""

    needs: dict[str, dict[str, float]]
    quotas: dict[str, Quotas]
    unread: str | None = None  # the read failed: not pre-checked

    @property
    def headroom(self) -> list[Headroom]:
        return headroom(self.needs, self.quotas) if self.unread is None else []

    @property
    def problems(self) -> list[str]:
        return quota_problems(self.needs, self.quotas) if self.unread is None else []


def read_spec_quotas(spec: JobSpec, plan: LaunchPlan) -> QuotaRead | None:
    """The quotas of a spec whose provider reads them (one read a region); None for a provider without."""
    from orchestrator.providers.registry import quota_source  # lazy: the provider backends and cloud clients

    try:
        source = quota_source(spec)
        if source is None:
            return None
        needs = quota_needs(list(plan.slots))
        return QuotaRead(needs, read_quotas(source, needs))
    except ProviderError as exc:
        return QuotaRead({}, {}, unread=f"could not read quotas, not pre-checked ({exc})")


def refuse_short_quota(found: QuotaRead | None) -> None:
    """A launch refuses, before anything is created, a cluster that needs more quota than the project has."""
    if found is not None and (problems := found.problems):
        raise UserError(f"not enough quota ({len(problems)} problem(s)):\n  " + "\n  ".join(problems))
