"""Google Compute Engine: spot GPU VMs through the google-cloud-compute REST client.

``GceProvider`` is the Provider interface put together from parts, one concern each: ``api.GceApi`` (the
clients, bounded retries, typed errors, operation waits), ``instances.Instances`` (VM requests and the
listing), ``firewalls.Firewalls``, ``disk_images.DiskImages`` (image bake) and ``passes.GcePasses`` (the
controller passes' non-blocking side, over ``background.GceBackground``).

``create`` / ``delete`` / ``list`` block (the CLI, gc, image bake use them). The controller's passes use the
non-blocking side instead (``passes.GcePasses``: ``start_create`` / ``start_delete`` / ``operation`` /
``snapshot``), so no pass waits on an operation or a listing.
"""

from __future__ import annotations

import builtins
import os
import threading
import uuid
from collections.abc import Collection, Sequence

from google.auth.credentials import Credentials

from orchestrator.costmodel.slots import Slot
from orchestrator.model.instances import InstanceRequest, ObservedInstance
from orchestrator.providers.base import Provider, SupportsFirewall, SupportsImages, SupportsSpotCapacity
from orchestrator.providers.gce.advice import SpotAdvice
from orchestrator.providers.gce.api import GceApi, RetrySettings
from orchestrator.providers.gce.compute_api import compute_v1
from orchestrator.providers.gce.disk_images import DiskImages
from orchestrator.providers.gce.errors import GceCredentialsError, GcePermissionError, GceProjectError
from orchestrator.providers.gce.firewalls import Firewalls
from orchestrator.providers.gce.instances import Instances
from orchestrator.providers.gce.passes import GcePasses
from orchestrator.providers.gce.requests import (
    CLOUD_PLATFORM_SCOPE,
    DEFAULT_IMAGE,
    GPU_ACCELERATORS,
    STORAGE_SCOPE,
    GceRequestSettings,
    accelerator_type,
    bundled_machine_types,
    firewall_rules,
)

__all__ = [
    "CLOUD_PLATFORM_SCOPE", "DEFAULT_IMAGE", "GPU_ACCELERATORS", "GceCredentialsError", "GcePermissionError",
    "GceProjectError", "GceProvider", "RetrySettings", "accelerator_type",
]


class GceProvider(GcePasses, Provider, SupportsFirewall, SupportsImages, SupportsSpotCapacity):
    """Creates, deletes and lists the orchestrator's VMs in one GCE project."""

    name = "gce"
    spot_capacity_forecast = True
    spot_count_of_more = True

    def __init__(
        self, project: str, *, credentials: Credentials | str | os.PathLike[str] | None = None,
        api_endpoint: str | None = None, image: str = DEFAULT_IMAGE, network: str = "global/networks/default",
        subnetwork: str | None = None, network_tag: str | None = "orchestrator", external_ip: bool = True,
        use_internal_ip: bool = False, disk_size_gb: int = 50, disk_type: str | None = None,
        service_account_email: str | None = None, scopes: Sequence[str] = (STORAGE_SCOPE,),
        ssh_source_ranges: Sequence[str] = ("0.0.0.0/0",), termination_action: str = "DELETE",
        retry: RetrySettings | None = None, page_size: int = 500, settings: GceRequestSettings | None = None,
    ) -> None:
        """``credentials``: None for Application Default Credentials, a service-account key file path, or a
        Credentials object; never sent to a loopback ``api_endpoint`` (providers/gce/credentials.py).
        ``api_endpoint``: another Compute endpoint: an https Google API host, or a loopback one (anonymous).
        ``image``: a public image (``projects/debian-cloud/global/images/family/debian-12``) or one of
        this project's (``images/<name>``, ``images/family/<family>``, ``global/images/...``).
        ``use_internal_ip``: report ``networkIP`` as the host even when the VM has an external IP.
        ``termination_action``: what GCE does to a preempted or time-limited spot VM (DELETE or STOP).
        ``settings``: the request settings whole (then the request fields above are not used).
        """
        self.project = project
        # ``settings``: the request settings of a job spec (backend.request_settings), used as given.
        self.settings = settings or GceRequestSettings(
            project=project, image=image, network=network, subnetwork=subnetwork, network_tag=network_tag,
            external_ip=external_ip, disk_size_gb=disk_size_gb, disk_type=disk_type,
            service_account_email=service_account_email, scopes=tuple(scopes),
            ssh_source_ranges=tuple(ssh_source_ranges), termination_action=termination_action,
            bundled=bundled_machine_types(),
        )
        self.image = self.settings.image_url
        self.network = self.settings.network
        self.api = GceApi(project, credentials, api_endpoint, retry)
        self.instances = Instances(self.api, self.settings, use_internal_ip=use_internal_ip, page_size=page_size)
        self.firewalls = Firewalls(self.api)
        self.images = DiskImages(self.api)
        self._background = None
        self._background_lock = threading.Lock()
        self.advice = SpotAdvice(self.api, self.settings.bundled, accelerator_type)

    def __repr__(self) -> str:
        return f"GceProvider(project={self.project!r})"

    @property
    def retry(self) -> RetrySettings:
        return self.api.retry

    @retry.setter
    def retry(self, value: RetrySettings) -> None:
        self.api.retry = value

    def close(self) -> None:
        self.close_background()
        self.advice.close()
        self.api.close()

    # ------------------------------------------------------------------ quotas (providers.gce.quotas.QuotaSource)

    def region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        """metric -> (limit, usage) of one region (``regions.get``); an unknown region is an InvalidRequestError."""
        return self.api.quotas(region)

    def project_quotas(self) -> dict[str, tuple[float, float]]:
        """metric -> (limit, usage) of the project's global quotas (``projects.get``), e.g. GPUS_ALL_REGIONS."""
        return self.api.quotas(None)

    # ------------------------------------------------------------------ Provider (blocking)

    def create(self, request: InstanceRequest) -> None:
        # One requestId per create(): the retries reuse it, so a retried insert whose first try did reach
        # GCE never creates twice. Not derived from the name alone, because GCE replays the original
        # (possibly failed) operation for a known requestId: a later create after a stockout, or in another
        # zone, must be a new request.
        op = self._send_insert(request, str(uuid.uuid4()))
        if op is not None:
            self.api.finish(op, f"create {request.name} in {request.zone}", zone=request.zone,
                            resource=request.gpu or request.machine_type, fine="RESOURCE_ALREADY_EXISTS")

    def delete(self, name: str, zone: str) -> None:
        op = self.instances.send_delete(name, zone, str(uuid.uuid4()))
        if op is not None:
            self.api.finish(op, f"delete {name} in {zone}", zone=zone, fine="RESOURCE_NOT_FOUND")
        self._after_delete(name)

    def list(self, job_ids: Collection[str] | None = None) -> list[ObservedInstance]:
        return self.instances.observed(job_ids)

    def host_keys(self, name: str, zone: str) -> builtins.list[str]:
        """The SSH host keys VM ``name`` published through the API (pinned by the transport)."""
        return self.instances.host_keys(name, zone)

    # ------------------------------------------------------------------ hooks (IsolatedGceProvider)

    def _before_create(self, request: InstanceRequest) -> None:
        """What must exist before the job's VM (IsolatedGceProvider: the job's firewall rules)."""

    def _after_delete(self, name: str) -> None:
        """What goes once the VM is gone (IsolatedGceProvider: the job's rules, with its last VM)."""

    def _send_insert(self, request: InstanceRequest, request_id: str) -> compute_v1.Operation | None:
        self._before_create(request)
        return self.instances.send_insert(request, request_id)

    # ------------------------------------------------------------------ optional capabilities

    def ensure_cluster_firewall(self, network_tag: str, ports: str) -> None:
        """Open ``ports`` (e.g. ``"2222-2230,8470"``) only between VMs carrying ``network_tag`` (the TF
        gRPC ports have no authentication), and ssh from ``ssh_source_ranges``. Two rules, because
        sourceTags and sourceRanges in one rule are OR-ed by GCE."""
        for rule in firewall_rules(self.settings, network_tag, ports):
            self.firewalls.ensure(rule)

    def create_image(self, name: str, source_instance: str, zone: str, family: str | None = None) -> None:
        self.images.create(name, source_instance, zone, family)

    def spot_capacity(self, job_id: str, slots: Sequence[Slot]) -> bool | None:
        """GCE's capacity advice for the job's spot VMs (providers/gce/advice.py; None: not known now)."""
        return self.advice.can_have(slots)

    def spot_capacity_by_zone(self, job_id: str, slots: Sequence[Slot]) -> dict[str, bool] | None:
        """GCE's capacity advice asked zone by zone, where the job's spot VMs may use several zones."""
        return self.advice.by_zone(slots)

    def spot_capacity_count(self, job_id: str, slots: Sequence[Slot]) -> int | None:
        """GCE's capacity advice asked for 1, 2, ... of the slots' spot VMs (more than the job holds: the daemon
        passes the slots without one, ``spot_count_of_more``), where they are of one shape in one zone."""
        return self.advice.count(slots)
