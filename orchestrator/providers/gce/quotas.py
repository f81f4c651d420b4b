"""GCE quota pre-check: what a cluster needs per region, against what the project has free.

GCE charges a spot VM to the ``PREEMPTIBLE_*`` quota when the region has one, else to the regular
metric (``CPUS``, ``NVIDIA_<TYPE>_GPUS``); every GPU also counts against the global ``GPUS_ALL_REGIONS``.
Only metrics the region reports are checked: an unreported metric has no known limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from orchestrator.costmodel.slots import Slot
from orchestrator.model.catalog import Catalog, load_catalog

GLOBAL = "global"  # the scope of project-wide quotas (GPUS_ALL_REGIONS)
QUOTA_HINT = "ask for more quota (IAM & Admin > Quotas) or use another region/zone"

Quotas = dict[str, tuple[float, float]]  # metric -> (limit, usage)


@runtime_checkable
class QuotaSource(Protocol):
    """A provider that reads its project's quotas (a capability; gce has it)."""

    def region_quotas(self, region: str) -> Quotas: ...

    def project_quotas(self) -> Quotas: ...


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def gpu_quota_metric(accelerator: str, preemptible: bool = False) -> str:
    """``nvidia-tesla-k80`` -> ``NVIDIA_K80_GPUS`` (``PREEMPTIBLE_NVIDIA_K80_GPUS`` for spot).

    GCE names the H100 80 GB quota ``NVIDIA_H100_GPUS`` (the A100 80 GB keeps its suffix).
    """
    core = accelerator.removeprefix("nvidia-").removeprefix("tesla-")
    core = {"h100-80gb": "H100"}.get(core, core.upper().replace("-", "_"))
    metric = f"NVIDIA_{core}_GPUS"
    return f"PREEMPTIBLE_{metric}" if preemptible else metric


def _regular(metric: str) -> str:
    return metric.removeprefix("PREEMPTIBLE_")


def quota_needs(slots: Iterable[Slot], catalog: Catalog | None = None) -> dict[str, dict[str, float]]:
    """region (or ``global``) -> metric -> amount the slots need at once (each slot in its first zone)."""
    cat = catalog or load_catalog()
    needs: dict[str, dict[str, float]] = {}

    def add(scope: str, metric: str, amount: float) -> None:
        needs.setdefault(scope, {})
        needs[scope][metric] = needs[scope].get(metric, 0.0) + amount

    for slot in slots:
        region = region_of(slot.zone)
        prefix = "PREEMPTIBLE_" if slot.spot else ""
        add(region, "INSTANCES", 1)
        if slot.machine_type in cat.machine_types:  # an unknown machine type: its vCPUs are not checked
            add(region, f"{prefix}CPUS", cat.machine_type(slot.machine_type).vcpus)
        if slot.gpu:
            # An accelerator-optimized type (a3-highgpu-2g) holds its fixed GPU count.
            add(region, gpu_quota_metric(cat.gpu(slot.gpu).gce_accelerator, preemptible=slot.spot), slot.gpu_count)
            add(GLOBAL, "GPUS_ALL_REGIONS", slot.gpu_count)
    return needs


@dataclass(frozen=True)
class Headroom:
    scope: str  # region or "global"
    metric: str  # the metric charged (a PREEMPTIBLE_* need falls back to the regular one if unreported)
    need: float
    limit: float
    usage: float

    @property
    def free(self) -> float:
        return max(0.0, self.limit - self.usage)

    @property
    def ok(self) -> bool:
        return self.need <= self.free


def headroom(
    needs: Mapping[str, Mapping[str, float]], quotas_by_region: Mapping[str, Quotas]
) -> list[Headroom]:
    """Each needed metric with a known limit, after folding PREEMPTIBLE_* needs the region lacks."""
    rows: list[Headroom] = []
    for scope in sorted(needs):
        quotas = quotas_by_region.get(scope)
        if quotas is None:
            continue  # not read: nothing known
        charged: dict[str, float] = {}
        for metric, amount in needs[scope].items():
            target = metric if metric in quotas else _regular(metric)
            charged[target] = charged.get(target, 0.0) + amount
        for metric in sorted(charged):
            if metric in quotas:
                limit, usage = quotas[metric]
                rows.append(Headroom(scope, metric, charged[metric], limit, usage))
    return rows


def _n(x: float) -> str:
    return f"{x:g}"


def quota_problems(
    needs: Mapping[str, Mapping[str, float]], quotas_by_region: Mapping[str, Quotas]
) -> list[str]:
    """One message per metric the cluster needs more of than is free."""
    return [
        f"cluster: needs {_n(h.need)} {h.metric} {'in all regions' if h.scope == GLOBAL else 'in ' + h.scope} "
        f"but only {_n(h.free)} of {_n(h.limit)} are free; {QUOTA_HINT}"
        for h in headroom(needs, quotas_by_region)
        if not h.ok
    ]


def read_quotas(source: QuotaSource, scopes: Iterable[str]) -> dict[str, Quotas]:
    """One ``regions.get`` per region (``projects.get`` for ``global``); errors propagate."""
    return {s: source.project_quotas() if s == GLOBAL else source.region_quotas(s) for s in sorted(set(scopes))}
