"""The provider interface: three methods (``create``, ``delete``, ``list``) and optional capabilities.

A provider is deliberately small (like dstack's ``Compute``): ``create`` (idempotent by the
deterministic instance name), ``delete`` (not-found is success) and ``list`` (one call sees every
instance of the given jobs). Optional capabilities are separate small protocols. The typed requests,
observations and errors live in orchestrator.model (instances, cloud_errors).

A ``Backend`` is what each provider package (``providers/<kind>/backend.py``) builds for the controller:
the provider plus what differs between providers beyond create/delete/list: how to reach an instance
(endpoint), what an instance must carry at creation (metadata: SSH key, shutdown script), which Python
runs the payload, and whether a replacement keeps its slot's network address.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from orchestrator.clock import WALL, Clock
from orchestrator.costmodel.launch_plan import LaunchPlan
from orchestrator.costmodel.slots import Slot
from orchestrator.model.instances import InstanceRequest, ObservedInstance
from orchestrator.model.spec import JobSpec
from orchestrator.providers.ports import free_port
from orchestrator.storage.base import JobStorage
from orchestrator.transport.base import Endpoint, Transport

TF_PORT = 2222  # the TensorFlow task port on cloud instances (one task per VM)
StepSleep = Callable[[str | None, int], float]  # (gpu, batch) -> emulated seconds per step (local GPUs)


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


class SupportsHostGpus(abc.ABC):
    """Optional capability: the GPUs of the host an instance was placed on (an inventory host's ``gpus``), where
    its type does not say; a PyTorch node there runs one rank per GPU."""

    @abc.abstractmethod
    def gpus_on(self, name: str) -> int | None: ...


class SupportsSpotCapacity(abc.ABC):
    """Optional capability: say whether the job's spot VMs (its spot ``slots``) could be had now: the local
    provider's replayed trace, GCE's capacity advice. None: not known now."""

    # True: the answer is a forecast (GCE's advice), which a create refused or a VM preempted since overrules.
    spot_capacity_forecast: bool = False
    # True: spot_capacity_count answers for VMs more than the job holds (GCE's advice is about new VMs): the daemon
    # asks it of the spot slots without a live spot VM and adds the ones it holds. False: the count is of all of
    # them, held or not (a replayed trace's).
    spot_count_of_more: bool = False

    @abc.abstractmethod
    def spot_capacity(self, job_id: str, slots: Sequence[Slot]) -> bool | None: ...

    def spot_capacity_by_zone(self, job_id: str, slots: Sequence[Slot]) -> dict[str, bool] | None:
        """The same answer for each zone the slots may use, where the provider can say by zone (the deadline
        policy then picks the zone, ``decide.deadline_zones``); None: it cannot."""
        return None

    def spot_capacity_count(self, job_id: str, slots: Sequence[Slot]) -> int | None:
        """How many of the slots' spot VMs could be had now, where the provider can count them (a replayed 16-node
        trace): the deadline policy then shrinks onto them and tops up with on-demand (``decide.elastic``)."""
        return None


class SupportsImages(abc.ABC):
    """Optional capability: make a boot image from an instance's disk (``orchestrator image bake``)."""

    @abc.abstractmethod
    def create_image(self, name: str, source_instance: str, zone: str, family: str | None = None) -> None: ...


S_contra = TypeVar("S_contra", contravariant=True)


class ChecksSetup(Protocol[S_contra]):
    """Capability, registered by kind (providers/registry.py): is the provider set up for this spec's
    provider section (credentials, project, keys, inventory)? Raises a one-line ``UserError`` naming what is
    missing and how to fix it, before any job row or resource exists. ``provider`` builds the job's provider
    when the check may ask the API (a launch); None for a check that sends nothing (a dry run)."""

    def __call__(self, spec: S_contra, provider: Callable[[], Provider] | None) -> None: ...


class DryRuns(Protocol):
    """Capability, registered by kind: what a launch of ``spec`` would send to the cloud, as JSON-ready data
    (gce: the exact Compute API bodies). Kinds without it get the generic table of ``launch --dry-run``."""

    def __call__(self, spec: JobSpec, plan: LaunchPlan) -> dict[str, Any]: ...


class CloudDeadline(Protocol):
    """Capability of a Backend: the time limit the cloud itself enforces on a VM (seconds), from what is left
    of the job's deadline and budget, so spend stays bounded even with no controller alive."""

    def __call__(self, *, deadline_s: float | None, elapsed_s: float, budget_usd: float | None, spent_usd: float,
                 cluster_usd_per_hour: float, flex_start: bool = False) -> int: ...


def _local_endpoint(observed: ObservedInstance) -> Endpoint:
    return Endpoint(workdir=observed.workdir or ".")


def _no_metadata(job_id: str, name: str, storage: JobStorage) -> dict[str, str]:
    return {}


def _no_request_metadata(spec: JobSpec, slots: Sequence[Slot], step_sleep: StepSleep) -> dict[str, str]:
    return {}


@dataclass
class Backend:
    key: str  # jobs with the same key share one provider.list() per pass
    provider: Provider
    transport: Transport
    # None: every task gets a distinct free port on this machine (all instances share its address);
    # else every task listens on this port of its own instance.
    fixed_task_port: int | None
    endpoint: Callable[[ObservedInstance], Endpoint] = _local_endpoint
    instance_metadata: Callable[[str, str, JobStorage], dict[str, str]] = _no_metadata
    # Per-job create-request metadata that depends on the spec and its slots (local: the progress clock).
    request_metadata: Callable[[JobSpec, Sequence[Slot], StepSleep], dict[str, str]] = _no_request_metadata
    python: str = sys.executable
    # What a `job: command` task's argv runs behind (its argv goes after it, as arguments): gce's wait for
    # the first-boot set-up where ``python`` waits too; empty elsewhere, so the command runs as it is.
    command_prefix: tuple[str, ...] = ()
    task_env: dict[str, str] = field(default_factory=dict)
    # False on real clouds: a replacement VM gets a new IP, so an async chief must restart to reach it.
    stable_addresses: bool = True
    prepare_network: Callable[[], None] | None = None  # run once before the first create (firewall)
    cloud_deadline: CloudDeadline | None = None  # None: the provider enforces no time limit itself
    network_ready: bool = False
    clock: Clock = WALL  # what its provider and every pass over its jobs read the time from

    def task_port(self, previous: int | None) -> int:
        if previous is not None:
            return previous  # a replacement takes over its slot's address
        if self.fixed_task_port is not None:
            return self.fixed_task_port
        return free_port()

    def ensure_network(self) -> None:
        if self.prepare_network is not None and not self.network_ready:
            self.prepare_network()
            self.network_ready = True
