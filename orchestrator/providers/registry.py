"""Which provider and transport drive a job: one entry per provider kind (``spec.provider.kind``).

Each provider is a package (``providers/<kind>/``) whose ``backend`` module says how to build its
``Backend`` (``build``) and which jobs share one (``cache_key``). Adding a provider is one folder and one
line in ``KINDS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from orchestrator.core.spec import JobSpec
from orchestrator.providers.base import TF_PORT, Backend
from orchestrator.providers.gce import backend as gce
from orchestrator.providers.local import backend as local
from orchestrator.providers.ssh import backend as ssh

__all__ = ["KINDS", "TF_PORT", "Backend", "BackendKind", "backend_for"]
S = TypeVar("S")


@dataclass(frozen=True)
class BackendKind(Generic[S]):
    """How one provider kind builds its Backend from the spec's provider section (of type ``S``)."""

    cache_key: Callable[[S], str]  # jobs whose provider sections give one key share a Backend
    build: Callable[[str, S], Backend]


# The dispatch is by the spec's discriminator (``kind``), so each entry only ever sees its own section.
KINDS: dict[str, BackendKind[Any]] = {
    "local": BackendKind(local.cache_key, local.build),
    "gce": BackendKind(gce.cache_key, gce.build),
    "ssh": BackendKind(ssh.cache_key, ssh.build),
}

_cache: dict[str, Backend] = {}


def backend_for(spec: JobSpec) -> Backend:
    kind = KINDS[spec.provider.kind]
    key = kind.cache_key(spec.provider)
    if key not in _cache:
        _cache[key] = kind.build(key, spec.provider)
    return _cache[key]
