"""The provider interface: three methods, typed requests and observations, typed cloud errors.

A provider is deliberately small (like dstack's ``Compute``): ``create`` (idempotent by the
deterministic instance name), ``delete`` (not-found is success) and ``list`` (one call sees every
instance of the given jobs). Optional capabilities are separate mixins.
"""

from __future__ import annotations

import abc
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    PS = "ps"
    CHIEF = "chief"
    WORKER = "worker"


# Labels every instance carries, so a restarted controller (or `orchestrator gc`) finds its VMs.
LABEL_MANAGED = "orchestrator"  # value "1"
LABEL_JOB = "orch-job"
LABEL_ROLE = "orch-role"
LABEL_INDEX = "orch-index"
LABEL_GENERATION = "orch-gen"


def instance_name(job_id: str, role: Role | str, index: int, generation: int) -> str:
    """Deterministic name ``<job>-<role>-<index>-<generation>`` (valid GCE name: lowercase, <=63)."""
    name = f"{job_id}-{Role(role).value}-{index}-{generation}"
    if len(name) > 63:
        raise ValueError(f"instance name {name!r} is longer than 63 characters; shorten the job name")
    return name


@dataclass(frozen=True)
class InstanceRequest:
    """What to create. ``name`` is deterministic, so creating twice is a no-op."""

    name: str
    job_id: str
    role: Role
    index: int
    generation: int
    zone: str
    machine_type: str
    spot: bool
    gpu: str | None = None  # catalog key, e.g. "k80"; None for CPU-only (PS, chief)
    gpu_count: int = 0
    price_per_hour: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    # Local provider only: seconds after creation at which the emulated cloud revokes this instance.
    revoke_after_s: float | None = None
    # Cloud-side deadline: the cloud stops/deletes the VM itself after this many seconds (GCE
    # scheduling.maxRunDuration), so spend stays bounded even if every controller is dead.
    max_run_s: int | None = None
    flex_start: bool = False  # GCE Dynamic Workload Scheduler (provisioningModel=FLEX_START); not spot

    def all_labels(self) -> dict[str, str]:
        base = {
            LABEL_MANAGED: "1",
            LABEL_JOB: self.job_id,
            LABEL_ROLE: self.role.value,
            LABEL_INDEX: str(self.index),
            LABEL_GENERATION: str(self.generation),
        }
        return {**self.labels, **base}


class ObservedState(StrEnum):
    """What the provider reports, normalised across clouds."""

    PENDING = "pending"  # PROVISIONING / STAGING
    RUNNING = "running"
    STOPPING = "stopping"  # GCE STOPPING: a preemption in progress, or a stop we asked for
    TERMINATED = "terminated"  # stopped / preempted / host unreachable; still billed for disk only


@dataclass(frozen=True)
class ObservedInstance:
    name: str
    job_id: str
    role: Role
    index: int
    generation: int
    zone: str
    state: ObservedState
    provider_id: str = ""
    host: str | None = None  # address the transport connects to
    ssh_port: int | None = None
    workdir: str | None = None  # the instance's "disk" (local / emulated instances)
    preempted: bool = False  # the provider says the cloud revoked it (not a stop we asked for)
    gpu: str | None = None
    spot: bool = False
    # Address inside the cluster's network (TensorFlow traffic; the firewall opens its ports only there).
    internal_host: str | None = None


# ---------------------------------------------------------------- typed cloud errors


class ProviderError(Exception):
    """Base of every provider error. Fields are constructor arguments, never bolted on later."""

    retryable: bool = False

    def __init__(self, message: str, *, zone: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.zone = zone


class CapacityError(ProviderError):
    """The zone has no capacity for this shape (GCE ZONE_RESOURCE_POOL_EXHAUSTED): try the next zone."""

    def __init__(self, message: str, *, zone: str, resource: str = "") -> None:
        super().__init__(message, zone=zone)
        self.resource = resource


class QuotaError(ProviderError):
    """A regional quota is exhausted (GCE QUOTA_EXCEEDED): try the next region or ask for more quota."""

    def __init__(self, message: str, *, zone: str | None, region: str, metric: str) -> None:
        super().__init__(message, zone=zone)
        self.region = region
        self.metric = metric


class AuthError(ProviderError):
    """Credentials missing or lacking permission: fail fast, say what to fix."""


class InvalidRequestError(ProviderError):
    """The cloud rejected the request as malformed (unknown machine type, bad image, ...)."""


class TransientError(ProviderError):
    """5xx, timeouts, rate limits: retried with bounded backoff."""

    retryable = True


class Provider(abc.ABC):
    """A backend implements these three methods and nothing else on the controller's hot path."""

    name: str = ""

    @abc.abstractmethod
    def create(self, request: InstanceRequest) -> None:
        """Create the instance unless one with that name exists. Raises a ``ProviderError``."""

    @abc.abstractmethod
    def delete(self, name: str, zone: str) -> None:
        """Delete the instance; an instance that does not exist counts as deleted."""

    @abc.abstractmethod
    def list(self, job_ids: Collection[str] | None = None) -> list[ObservedInstance]:
        """Every managed instance (of these jobs, or of all jobs), in one call per page."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients / connections."""


class SupportsFirewall(abc.ABC):
    """Optional capability: open the cluster's (unauthenticated) gRPC ports only inside the cluster."""

    @abc.abstractmethod
    def ensure_cluster_firewall(self, network_tag: str, ports: str) -> None: ...


class SupportsOwnPricing(abc.ABC):
    """Optional capability: the provider knows what an instance costs once placed (an inventory's price)."""

    @abc.abstractmethod
    def price_per_hour(self, name: str) -> float | None: ...


class SupportsImages(abc.ABC):
    """Optional capability: make a boot image from an instance's disk (``orchestrator image bake``)."""

    @abc.abstractmethod
    def create_image(self, name: str, source_instance: str, zone: str, family: str | None = None) -> None: ...
