"""Which provider and transport drive a job, chosen by the spec's provider type (an explicit match).

A backend also knows what differs between providers beyond create/delete/list: how to reach an instance
(endpoint), what an instance must carry at creation (metadata: SSH key, shutdown script), which Python
runs the payload, and whether a replacement keeps its slot's network address.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.paths import user_dir
from orchestrator.providers.base import ObservedInstance, Provider
from orchestrator.providers.local import LocalProvider as LocalProviderImpl
from orchestrator.spec import GceProvider, JobSpec, LocalProvider, SshProvider
from orchestrator.storage.base import JobStorage
from orchestrator.transport.base import Endpoint, Transport
from orchestrator.transport.local import LocalTransport

TF_PORT = 2222  # the TensorFlow task port on cloud instances (one task per VM)


def _local_endpoint(observed: ObservedInstance) -> Endpoint:
    return Endpoint(workdir=observed.workdir or ".")


def _no_metadata(job_id: str, name: str, storage: JobStorage) -> dict[str, str]:
    return {}


@dataclass
class Backend:
    key: str  # jobs with the same key share one provider.list() per pass
    provider: Provider
    transport: Transport
    local_ports: bool  # every task on one host: one port per slot instead of TF_PORT everywhere
    endpoint: Callable[[ObservedInstance], Endpoint] = _local_endpoint
    instance_metadata: Callable[[str, str, JobStorage], dict[str, str]] = _no_metadata
    python: str = sys.executable
    task_env: dict[str, str] = field(default_factory=dict)
    # False on real clouds: a replacement VM gets a new IP, so an async chief must restart to reach it.
    stable_addresses: bool = True
    prepare_network: Callable[[], None] | None = None  # run once before the first create (firewall)
    network_ready: bool = False

    def task_port(self, previous: int | None) -> int:
        if previous is not None:
            return previous  # a replacement takes over its slot's address
        if not self.local_ports:
            return TF_PORT
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def ensure_network(self) -> None:
        if self.prepare_network is not None and not self.network_ready:
            self.prepare_network()
            self.network_ready = True


_cache: dict[str, Backend] = {}


def backend_for(spec: JobSpec) -> Backend:
    provider = spec.provider
    match provider:
        case LocalProvider():
            key = f"local:{user_dir()}:{provider.time_scale}"
            if key not in _cache:
                _cache[key] = Backend(key, LocalProviderImpl(user_dir() / "local", time_scale=provider.time_scale),
                                      LocalTransport(), local_ports=True)
            return _cache[key]
        case GceProvider():
            from orchestrator.control.cloud_backends import gce_backend

            key = f"gce:{provider.project}:{provider.api_endpoint or ''}:{provider.credentials or ''}"
            if key not in _cache:
                _cache[key] = gce_backend(key, provider)
            return _cache[key]
        case SshProvider():
            from orchestrator.control.cloud_backends import ssh_backend

            key = f"ssh:{provider.inventory.expanduser().resolve()}"
            if key not in _cache:
                _cache[key] = ssh_backend(key, provider)
            return _cache[key]
    raise AssertionError(f"unhandled provider {provider!r}")
