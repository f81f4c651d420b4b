"""The job spec itself (``JobSpec``) and its cluster, search, policy and pricing parts."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.model.catalog import load_catalog
from orchestrator.model.spec.base import StrictModel, parse_duration
from orchestrator.model.spec.provider import LocalProvider, ProviderSpec
from orchestrator.model.spec.training import BuiltinTraining, TrainingMode, TrainingSpec
from orchestrator.model.specfile import short

_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")
MIN_DEADLINE_S = 5.0  # a typo (1e-9): a real deadline too short for the cluster is refused by the plan check
LEGACY_BOOK = "2019-02"  # the ICAC'19 study's prices: K80 / P100 / V100 whole VMs


# ---------------------------------------------------------------- cluster


class ParameterServers(StrictModel):
    count: int | None = Field(default=None, ge=0, le=64, description="default: 1 (async), 0 (sync)")
    machine_type: str = "n1-standard-4"
    spot: bool = False
    zone: str | None = None


class Chief(StrictModel):
    machine_type: str = "n1-standard-4"
    spot: bool = False
    zone: str | None = None
    # The ICAC'19 setup: the async chief runs on worker 0's VM, so it has no VM (and no bill) of its own
    # and worker 0's revocation stops it; its task listens on worker 0's host at the next port.
    on_worker0: bool = False


class WorkerGroup(StrictModel):
    gpu: str
    count: int = Field(default=1, ge=1, le=256)
    spot: bool = True
    zone: str | None = None
    machine_type: str | None = None  # default: the GPU's usual host type from the catalog
    batch: int | None = Field(default=None, gt=0, le=65536, description="per-worker batch, overrides training")
    # flex_start: GCE Dynamic Workload Scheduler (A2/A3/A4 only): waits for capacity, then runs without preemption.
    provisioning: Literal["flex_start"] | None = None

    @field_validator("gpu")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.strip().lower()

    @model_validator(mode="before")
    @classmethod
    def _flex_start_is_not_spot(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("provisioning") == "flex_start" and "spot" not in data:
            return {**data, "spot": False}
        return data

    @model_validator(mode="after")
    def _flex_start_spot(self) -> WorkerGroup:
        if self.provisioning == "flex_start" and self.spot:
            raise ValueError("provisioning: flex_start VMs are not spot VMs; drop spot: true (or the provisioning)")
        return self


class Cluster(StrictModel):
    parameter_servers: ParameterServers = Field(default_factory=ParameterServers)
    chief: Chief = Field(default_factory=Chief)
    workers: list[WorkerGroup] = Field(min_length=1)


class SearchSpace(StrictModel):
    """What the planner may choose from when the spec does not pin the cluster."""

    gpus: list[str] = Field(min_length=1)
    min_workers: int = Field(default=1, ge=1, le=256)
    max_workers: int = Field(default=8, ge=1, le=256)
    max_ps: int = Field(default=3, ge=1, le=16)
    zones: list[str] = Field(default_factory=list, description="default: provider.zones")
    spot: list[bool] = Field(default_factory=lambda: [True, False], min_length=1)
    mixed: bool = Field(default=False, description="also consider clusters mixing GPU types")
    objective: Literal["cost", "time"] = "cost"

    @field_validator("gpus")
    @classmethod
    def _lower(cls, v: list[str]) -> list[str]:
        return [g.strip().lower() for g in v]

    @model_validator(mode="after")
    def _range(self) -> SearchSpace:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) is above max_workers ({self.max_workers})")
        return self


# ---------------------------------------------------------------- policy and pricing


class OnRevocation(StrEnum):
    REPLACE = "replace"  # same GPU type, next allowed zone if the first has no capacity
    SHRINK = "shrink"  # carry on with fewer workers
    FALLBACK_ON_DEMAND = "fallback-on-demand"  # replace with an on-demand instance of the same type
    DEADLINE = "deadline"  # wait for spot, take on-demand, or go back to spot: finish by policy.deadline, cheapest


class Policy(StrictModel):
    on_revocation: OnRevocation = OnRevocation.REPLACE
    max_replacements: int = Field(default=20, ge=0, le=10_000)
    budget_usd: float | None = Field(default=None, gt=0, le=10_000_000)
    deadline: float | None = Field(default=None, description="e.g. '6h', '90m', or seconds")
    # A pipeline job's lost stage: re-partition over the survivors or wait for the replacement, whichever
    # costmodel.stage_loss predicts cheaper (auto), or always one of them.
    stage_loss: Literal["auto", "wait", "repartition"] = "auto"
    # on_revocation: deadline: GPU types the spot workers may move to, all together, while their own GPU type's
    # spot is out or dearer per hour of the job's work (decide.deadline_markets; their batch stays as planned).
    also_gpus: list[str] = Field(default_factory=list, max_length=8,
                                 description="GPU types the deadline policy may move the spot workers to")

    @field_validator("also_gpus")
    @classmethod
    def _gpus_lower(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(g.strip().lower() for g in v))

    @field_validator("deadline", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        if v is None:
            return None
        seconds = parse_duration(v)
        if seconds < MIN_DEADLINE_S:  # 1e-9 s would be "launched and billed", then over at once
            raise ValueError(f"{seconds:g} s is too short to train anything; give at least {MIN_DEADLINE_S:g} s "
                             "(e.g. '30m', '6h')")
        return seconds

    @model_validator(mode="after")
    def _deadline_given(self) -> Policy:
        if self.on_revocation == OnRevocation.DEADLINE and self.deadline is None:
            raise ValueError("on_revocation: deadline needs policy.deadline (e.g. deadline: 6h)")
        if self.also_gpus and self.on_revocation != OnRevocation.DEADLINE:
            raise ValueError("also_gpus is where on_revocation: deadline moves spot workers; set on_revocation: "
                             "deadline, or drop also_gpus")
        return self


class PriceOverride(StrictModel):
    on_demand: float = Field(ge=0, le=10_000)
    spot: float = Field(ge=0, le=10_000)

    @model_validator(mode="after")
    def _spot_not_dearer(self) -> PriceOverride:
        # A spot price above on-demand is a swapped pair: the policies would buy on-demand to save money.
        if self.spot > self.on_demand:
            raise ValueError(f"spot ({self.spot}) is above on_demand ({self.on_demand}); are the two swapped?")
        return self


class Pricing(StrictModel):
    book: str = "current"
    overrides: dict[str, PriceOverride] = Field(default_factory=dict)


# ---------------------------------------------------------------- the job


class JobSpec(StrictModel):
    name: str
    provider: ProviderSpec = Field(default_factory=LocalProvider)
    storage: str = Field(default="./runs", description="local directory or gs://bucket/prefix")
    training: TrainingSpec = Field(default_factory=BuiltinTraining)
    cluster: Cluster | None = Field(default=None, description="pinned cluster; omit to let the planner choose")
    search: SearchSpace | None = None
    policy: Policy = Field(default_factory=Policy)
    pricing: Pricing = Field(default_factory=Pricing)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"'{short(v)}' is not a valid job name; use 1-32 lowercase letters, digits and '-', "
                "starting with a letter (it becomes part of every instance name)"
            )
        return v

    @field_validator("storage")
    @classmethod
    def _storage(cls, v: str) -> str:
        if v.startswith("gs://") and not re.fullmatch(r"gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/[^\x00-\x1f]*)?", v):
            raise ValueError(f"'{short(v)}' is not a valid gs:// URL; use gs://bucket/prefix")
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", v) and not v.startswith("gs://"):
            raise ValueError(f"'{short(v)}': only a local folder or gs://bucket/prefix is supported")
        if any(c < " " for c in v):
            raise ValueError("control characters (newline, NUL, ...) are not allowed in a path")
        if not v.strip():
            raise ValueError("give a local directory or gs://bucket/prefix")
        return v

    @model_validator(mode="before")
    @classmethod
    def _default_book(cls, data: Any) -> Any:
        # No pricing.book: "current" (2026-11), except a local/ssh spec whose GPUs only the 2019-02 book
        # prices (K80, P100: the 2019 study's GPUs, kept for the local provider and the simulator).
        pricing = data.get("pricing") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(pricing or {}, dict) or "book" in (pricing or {}):
            return data  # a pricing that is not a mapping is reported by validation, not a TypeError here
        book = _default_book_for(data)
        return data if book is None else {**data, "pricing": {**(data.get("pricing") or {}), "book": book}}

    @model_validator(mode="after")
    def _cluster_or_search(self) -> JobSpec:
        if self.cluster is None and self.search is None:
            raise ValueError("give cluster (what to run) or search (what the planner may choose from)")
        return self

    # ---- derived views used by the planner and the controller

    def with_cluster(self, cluster: Cluster) -> JobSpec:
        """The same job with a concrete cluster (what the planner chose)."""
        return self.model_copy(update={"cluster": cluster})

    @property
    def pinned(self) -> Cluster:
        if self.cluster is None:
            raise ValueError("the spec does not pin a cluster; run the planner first")
        return self.cluster

    @property
    def mode(self) -> TrainingMode:
        return self.training.mode

    @property
    def ps_count(self) -> int:
        count = self.cluster.parameter_servers.count if self.cluster else None
        if count is None:
            return 1 if self.mode == TrainingMode.ASYNC else 0
        return count

    @property
    def worker_count(self) -> int:
        return sum(g.count for g in self.cluster.workers) if self.cluster else 0


def _default_book_for(data: dict[Any, Any]) -> str | None:
    """'2019-02' for a local/ssh spec whose GPUs are priced there but not in the current book, else None."""
    raw = data.get("provider")
    kind = raw.get("kind", "local") if isinstance(raw, dict) else "local"
    cluster, search = data.get("cluster"), data.get("search")
    groups = cluster.get("workers") if isinstance(cluster, dict) else None
    gpus = [g.get("gpu") for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []
    if isinstance(search, dict) and isinstance(search.get("gpus"), list):
        gpus += search["gpus"]
    keys = {g.strip().lower() for g in gpus if isinstance(g, str)}
    if kind not in ("local", "ssh") or not keys:
        return None
    catalog = load_catalog()
    old, current = catalog.price_book(LEGACY_BOOK), catalog.price_book("current")
    if keys <= set(old.gpus) and not keys <= set(current.gpus):
        return LEGACY_BOOK
    return None

