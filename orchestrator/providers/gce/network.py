"""Who may reach a job's VMs on GCE: the job's own VMs (training ports), the controller (SSH), and the host
keys that prove a VM is the one the API created.

- Every VM carries its job's network tag ``orch-<job>``; a firewall rule per job opens the (unauthenticated)
  TensorFlow / torch ports only from instances with that tag, and SSH only from ``ssh_source_ranges``
  (default: this controller's public address). The rules are made before the job's first VM and deleted
  with its last.
- A network that already opens those ports to every VM (GCE's ``default`` network ships
  ``default-allow-internal``: every port between all VMs of the project) makes per-job rules pointless: the
  launch is refused, naming the rule and the fix (a dedicated network, ``provider.network``), unless the
  spec opts in with ``provider.allow_open_network: true``.
- A VM's SSH host keys come from its guest attributes (``hostkeys/``, published by the guest agent when the
  VM has ``enable-guest-attributes=TRUE``), read over the authenticated Compute API and pinned.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import urllib.request
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from orchestrator.model.cloud_errors import ProviderError
from orchestrator.model.errors import UserError
from orchestrator.model.instances import InstanceRequest
from orchestrator.model.spec.provider import loopback_endpoint
from orchestrator.providers.gce.compute_api import compute_v1
from orchestrator.providers.gce.provider import GceProvider
from orchestrator.providers.gce.requests import PORTS_RE, Body, firewall

log = logging.getLogger(__name__)

JOB_TAG = "orch-{job}"  # GceRequestSettings.network_tag: "{job}" becomes the job id on each VM
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"  # metadata: lets the guest agent publish the host keys
# Where the controller learns its public address: GCE's metadata server when it runs on a VM, else two
# plain-text echo services (no account, no key).
_METADATA_IP = ("http://metadata.google.internal/computeMetadata/v1/instance/network-interfaces/0/"
                "access-configs/0/external-ip")
PUBLIC_IP_URLS = ("https://checkip.amazonaws.com", "https://api.ipify.org")


class NetworkError(ProviderError, UserError):
    """The network or the SSH source cannot be made safe as configured: the message names the field."""


def job_tag(job_id: str) -> str:
    """The network tag of job ``job_id``'s VMs (a job id is a valid GCE name prefix, so a valid tag)."""
    return JOB_TAG.format(job=job_id)[:63].rstrip("-")


_INSTANCE = re.compile(r"^(?P<job>.+)-(ps|chief|worker)-\d+-\d+$")  # model.instances.instance_name


def _job_of(instance: str) -> str:
    """The job of a VM named by ``instance_name``; any other VM (an image builder) is its own job."""
    m = _INSTANCE.match(instance)
    return m["job"] if m else instance


# ---------------------------------------------------------------- SSH source


def public_address(urls: Sequence[str] = PUBLIC_IP_URLS, timeout_s: float = 3.0) -> str | None:
    """This controller's public IPv4 address, or None if no source answers with one."""
    sources: list[tuple[str, dict[str, str]]] = [(_METADATA_IP, {"Metadata-Flavor": "Google"})]
    sources += [(u, {}) for u in urls]
    for url, headers in sources:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as r:
                text = r.read(64).decode().strip()
            return str(ipaddress.IPv4Address(text))
        except (OSError, ValueError):
            continue
    return None


def address_learner(api_endpoint: str | None) -> Callable[[], str | None]:
    """How to learn the controller's address, as the API's VMs see it: ask the internet; for a Compute API on
    this machine's loopback, whose VMs this machine reaches over loopback, 127.0.0.1 (for a tunnel to a real
    API that would only narrow SSH to nobody: provider.ssh_source_ranges says otherwise)."""
    return (lambda: "127.0.0.1") if loopback_endpoint(api_endpoint) else public_address


def ssh_source_ranges(configured: Sequence[str] | None, learn: Callable[[], str | None] = public_address) -> list[str]:
    """The SSH rule's sources: ``provider.ssh_source_ranges`` if set, else this controller's address/32."""
    if configured:
        return list(configured)
    address = learn()
    if address is None:
        raise NetworkError("cannot learn this controller's public IP address to allow SSH from it only; set "
                           "provider.ssh_source_ranges (e.g. [203.0.113.7/32], your network's CIDR)")
    return [f"{address}/32"]


# ---------------------------------------------------------------- per-job firewall rules


def _opens(rule: compute_v1.Firewall, port: int) -> bool:
    """Does an enabled ingress rule open ``port`` from address ranges to every VM (no target filter)?"""
    if rule.disabled or (rule.direction or "INGRESS") != "INGRESS" or not rule.source_ranges:
        return False
    if rule.target_tags or rule.target_service_accounts:
        return False
    for allowed in rule.allowed:
        if allowed.I_p_protocol not in ("all", "tcp"):
            continue
        if not allowed.ports:
            return True
        for spec in allowed.ports:
            low, _, high = spec.partition("-")
            if int(low) <= port <= int(high or low):
                return True
    return False


def job_rules(network: str, job_id: str, ports: str, ssh_ranges: Sequence[str]) -> list[Body]:
    """The job's two rules as the API's JSON (sourceTags and sourceRanges in one rule would be OR-ed by GCE)."""
    port_list = [p.strip() for p in ports.split(",") if p.strip()]
    if not port_list or not all(PORTS_RE.match(p) for p in port_list):
        raise NetworkError(f"bad port list {ports!r}; expected e.g. '2222-2230,8470'")
    tag = job_tag(job_id)
    internal = firewall(
        f"{tag[:54]}-internal", network,
        f"orchestrator job {job_id}: training ports, only between the job's VMs (no authentication)", port_list,
        target_tag=tag, source_tags=[tag])
    ssh = firewall(f"{tag[:58]}-ssh", network, f"orchestrator job {job_id}: ssh from the controller", ["22"],
                   target_tag=tag, source_ranges=list(ssh_ranges))
    return [internal, ssh]


class IsolatedGceProvider(GceProvider):
    """A GceProvider that gives each job its own firewall rules: made before the job's first VM, deleted
    after its last one is gone."""

    def __init__(self, project: str, *, ports: str, ssh_ranges: Sequence[str] | None = None,
                 allow_open_network: bool = False,
                 learn_address: Callable[[], str | None] | None = None, **kwargs: Any) -> None:
        super().__init__(project, network_tag=JOB_TAG, **kwargs)
        self.ports = ports
        self.allow_open_network = allow_open_network
        self._configured_ranges = list(ssh_ranges) if ssh_ranges else None
        self._learn = learn_address or address_learner(kwargs.get("api_endpoint"))
        self._ranges: list[str] | None = None
        self._ready: set[str] = set()
        self._lock = threading.Lock()
        self._job_locks: dict[str, threading.Lock] = {}

    def check_network(self) -> None:
        """Refuse a network whose existing rules open the training ports to every VM."""
        if self.allow_open_network:
            return
        port = int(self.ports.split(",")[0].split("-")[0])
        network = self.network.rstrip("/").rsplit("/", 1)[-1]
        for rule in self.firewalls.all():
            if rule.network.rstrip("/").rsplit("/", 1)[-1] == network and _opens(rule, port):
                raise NetworkError(
                    f"network {network} lets every VM reach the training ports (firewall rule {rule.name} opens "
                    f"tcp:{port} from {', '.join(rule.source_ranges)}), so other jobs' VMs could reach this "
                    "job's unauthenticated ports; set provider.network to a dedicated VPC network (gcloud "
                    "compute networks create orchestrator --subnet-mode=auto), or accept it with "
                    "provider.allow_open_network: true")

    def _job_lock(self, job_id: str) -> threading.Lock:
        # One lock per job: jobs set up their rules in parallel (each takes several API calls).
        with self._lock:
            return self._job_locks.setdefault(job_id, threading.Lock())

    def _ssh_ranges(self) -> list[str]:
        with self._lock:  # once per provider; every job's first VM needs it
            if self._ranges is None:
                self.check_network()
                self._ranges = ssh_source_ranges(self._configured_ranges, self._learn)
            return self._ranges

    def ensure_job_network(self, job_id: str) -> None:
        if job_id in self._ready:
            return
        with self._job_lock(job_id):
            if job_id in self._ready:
                return
            for rule in job_rules(self.network, job_id, self.ports, self._ssh_ranges()):
                self.firewalls.ensure(rule)
            self._ready.add(job_id)

    def delete_job_network(self, job_id: str) -> None:
        """Delete the job's rules (missing is fine)."""
        with self._job_lock(job_id):
            self._ready.discard(job_id)
            for rule in job_rules(self.network, job_id, self.ports, ["0.0.0.0/32"]):
                self.firewalls.delete(rule["name"])

    def _before_create(self, request: InstanceRequest) -> None:
        self.ensure_job_network(request.job_id)

    def _prerequisite(self, request: InstanceRequest) -> tuple[str, Callable[[], None]] | None:
        if request.job_id in self._ready:
            return None
        return request.job_id, partial(self.ensure_job_network, request.job_id)

    def _cleanup_key(self, name: str) -> str | None:
        return _job_of(name)

    def _after_delete(self, name: str) -> None:
        job = _job_of(name)
        if not self.list([job]):  # the job's last VM is gone: so are its rules
            self.delete_job_network(job)
