"""Which provider and transport drive a job: one entry per provider kind (``spec.provider.kind``).

Each provider is a package (``providers/<kind>/``) whose ``backend`` module says how to build its
``Backend`` (``build``) and which jobs share one (``cache_key``), plus its optional capabilities (small
protocols in providers/base.py): the set-up check, a cloud dry run, quotas. Adding a provider is one folder
and one line in ``KINDS``; callers ask for a capability here, never for a kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from orchestrator.clock import WALL, Clock
from orchestrator.model.errors import UserError
from orchestrator.model.spec import JobSpec
from orchestrator.model.torch_spec import payload_framework
from orchestrator.providers.bake import ImageBuilder
from orchestrator.providers.base import TF_PORT, Backend, ChecksSetup, DryRuns, Provider
from orchestrator.providers.gce import backend as gce
from orchestrator.providers.gce.capabilities import dry_run as gce_dry_run
from orchestrator.providers.gce.quotas import QuotaSource
from orchestrator.providers.gce.setup import check_setup as gce_setup
from orchestrator.providers.local import backend as local
from orchestrator.providers.ssh import backend as ssh
from orchestrator.providers.ssh.setup import check_setup as ssh_setup

if TYPE_CHECKING:
    from orchestrator.model.spec import GceProvider as GceSpec

__all__ = ["KINDS", "TF_PORT", "Backend", "BackendKind", "backend_for", "check_setup", "dry_run_for",
           "image_builder_for", "quota_source", "use_backend"]
S = TypeVar("S")


def gce_images(section: GceSpec) -> ImageBuilder:
    """GCE's image builder, imported when one is asked for: the daemon, report and every local job never need it."""
    from orchestrator.providers.gce.bake import image_builder

    return image_builder(section)


def _nothing_to_check(spec: object, provider: Callable[[], Provider] | None) -> None:
    """The local provider needs nothing but this machine."""


@dataclass(frozen=True)
class BackendKind(Generic[S]):
    """How one provider kind builds its Backend from the spec's provider section (of type ``S``)."""

    # Jobs whose provider sections and framework (model.torch_spec.payload_framework) give one key share a Backend.
    cache_key: Callable[[S, str], str]
    build: Callable[[str, S, str, Clock], Backend]
    check_setup: ChecksSetup[S] = _nothing_to_check
    dry_run: DryRuns | None = None  # None: launch --dry-run prints the generic table
    quotas: bool = False  # the built provider is a providers.gce.quotas.QuotaSource worth asking before a launch
    image_builder: Callable[[S], ImageBuilder] | None = None  # `orchestrator image bake` on this kind


# The dispatch is by the spec's discriminator (``kind``), so each entry only ever sees its own section.
KINDS: dict[str, BackendKind[Any]] = {
    "local": BackendKind(local.cache_key, local.build),
    "gce": BackendKind(gce.cache_key, gce.build, gce_setup, gce_dry_run, quotas=True, image_builder=gce_images),
    "ssh": BackendKind(ssh.cache_key, ssh.build, ssh_setup),
}

_cache: dict[str, Backend] = {}


def backend_for(spec: JobSpec, clock: Clock = WALL) -> Backend:
    """The job's Backend, shared by the jobs of one cache key on one clock (a virtual clock's jobs get their own)."""
    kind = KINDS[spec.provider.kind]
    framework = payload_framework(spec)  # a cloud's default image carries the job's framework
    key = kind.cache_key(spec.provider, framework)
    cached = key if clock is WALL else f"{key}@clock{id(clock)}"
    if cached not in _cache:
        _cache[cached] = kind.build(key, spec.provider, framework, clock)
    return _cache[cached]


def use_backend(spec: JobSpec, clock: Clock, backend: Backend) -> None:
    """Drive the jobs of ``spec``'s cache key on ``clock`` with ``backend`` (a fast-forward harness's own, its hosts
    and payload on the virtual clock: tests/fastforward.py); the wall clock's backends are never replaced."""
    if clock is WALL:
        raise ValueError("use_backend is for a clock of one's own, not the wall clock")
    kind = KINDS[spec.provider.kind]
    _cache[f"{kind.cache_key(spec.provider, payload_framework(spec))}@clock{id(clock)}"] = backend


def check_setup(spec: JobSpec, *, probe: bool = True) -> None:
    """The provider's set-up for ``spec`` (credentials, project, keys, inventory), before anything is created:
    raises a one-line UserError naming what is missing and the fix. ``probe``: may ask the provider's API
    (one read; a launch), else sends nothing (a dry run). The one function every verb calls."""
    KINDS[spec.provider.kind].check_setup(spec.provider, (lambda: backend_for(spec).provider) if probe else None)


def dry_run_for(spec: JobSpec) -> DryRuns | None:
    """The provider's own dry run (the requests a launch would send), or None for the generic one."""
    return KINDS[spec.provider.kind].dry_run


def quota_source(spec: JobSpec) -> QuotaSource | None:
    """The provider that reads ``spec``'s quotas, or None when its kind has none."""
    if not KINDS[spec.provider.kind].quotas:
        return None
    provider = backend_for(spec).provider
    return provider if isinstance(provider, QuotaSource) else None


def image_builder_for(spec: JobSpec) -> ImageBuilder:
    """The kind's part of `orchestrator image bake`; a UserError for a kind that bakes no images."""
    make = KINDS[spec.provider.kind].image_builder
    if make is None:
        baking = ", ".join(k for k, v in KINDS.items() if v.image_builder is not None)
        raise UserError(f"provider.kind is {spec.provider.kind!r}; images are baked on a cloud (provider.kind: "
                        f"{baking})")
    return make(spec.provider)
