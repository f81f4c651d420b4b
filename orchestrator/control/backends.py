"""Which provider and transport drive a job, chosen by the spec's provider type (an explicit match)."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from orchestrator.paths import user_dir
from orchestrator.providers.base import ObservedInstance, Provider
from orchestrator.providers.local import LocalProvider as LocalProviderImpl
from orchestrator.spec import GceProvider, JobSpec, LocalProvider, SshProvider
from orchestrator.transport.base import Endpoint, Transport
from orchestrator.transport.local import LocalTransport

TF_PORT = 2222  # the TensorFlow task port on cloud instances (one task per VM)


@dataclass
class Backend:
    key: str  # jobs with the same key share one provider.list() per pass
    provider: Provider
    transport: Transport
    local_ports: bool  # every task on this machine: one port per slot instead of TF_PORT everywhere

    def endpoint(self, observed: ObservedInstance) -> Endpoint:
        if observed.workdir is not None and observed.ssh_port is None:
            return Endpoint(workdir=observed.workdir)
        return Endpoint(workdir=observed.workdir or "orchestrator", host=observed.host or "127.0.0.1",
                        port=observed.ssh_port or 22)

    def task_port(self, previous: int | None) -> int:
        if previous is not None:
            return previous  # a replacement takes over its slot's address
        if not self.local_ports:
            return TF_PORT
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])


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
        case GceProvider() | SshProvider():
            from orchestrator.control.cloud_backends import cloud_backend

            backend = cloud_backend(spec)
            return _cache.setdefault(backend.key, backend)
    raise AssertionError(f"unhandled provider {provider!r}")
