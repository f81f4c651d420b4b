"""One revocation and replacement policy, for the daemon (``core.reconcile``) and the simulator
(``sim.engine``): whether and how a lost instance is replaced, where, which losses roll training back,
and the timings (boot, notice window, checkpoint cost, retries).

Both callers look the functions up on this module at call time (``policy.decide_replacement(...)``),
so a change here (or a monkeypatch in a test) changes the daemon's actions and the simulated runs alike.
Every timing is a named constant read from ``data/``: cloud facts from ``cloud_facts.csv`` (each row
with its source), the controller's own choices from ``policy.csv``.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import numpy as np

from orchestrator.core.gce_rules import load_gce_rules
from orchestrator.core.instances import Role
from orchestrator.core.paths import data_dir
from orchestrator.core.spec import JobSpec, LocalProvider, OnRevocation, ProviderSpec, RevocationMode


def _read(name: str) -> dict[str, float]:
    with (data_dir() / name).open(newline="") as fh:
        return {r["key"]: float(r["value"]) for r in csv.DictReader(fh)}


_CLOUD: Final = _read("cloud_facts.csv")
_CHOICES: Final = _read("policy.csv")

BOOT_S: Final = _CLOUD["replacement_boot_delay"]  # request -> a (replacement) instance is up
SPOT_EXTRA_BOOT_S: Final = _CLOUD["preemptible_extra_staging"]  # spot / preemptible instances stage slower
NOTICE_WINDOW_S: Final = _CLOUD["preemption_notice_window"]  # preemption notice -> hard off
CHECKPOINT_BASE_S: Final = _CLOUD["checkpoint_write_base"]
CHECKPOINT_PER_MB_S: Final = _CLOUD["checkpoint_write_per_mb"]

# A revoked instance is kept through its notice window and as long again, so the chief can finish and upload
# its checkpoint before we delete the VM.
REVOKED_GRACE_S: Final = 2 * NOTICE_WINDOW_S
CREATE_RETRY_S: Final = _CHOICES["create_retry_s"]  # every zone out of capacity -> wait, then ask again
CREATE_REISSUE_S: Final = _CHOICES["create_reissue_s"]  # REQUESTED and unseen this long -> create again
MAX_CREATE_FAILURES: Final = int(_CHOICES["max_create_failures"])  # per slot, then the job fails
EXTRA_RESTARTS: Final = int(_CHOICES["extra_restarts"])  # whole-cluster restarts beyond max_replacements
FLEX_START_REQUEST_VALID_S: Final = _CHOICES["flex_start_request_valid_s"]  # a Flex-start request waits this long
EXTENDED_NOTICE_S: Final = _CLOUD["preemption_notice_extended"]  # scheduling.preemptionNoticeDuration (Preview)


def boot_s(spot: bool, base: float = BOOT_S, spot_extra: float = SPOT_EXTRA_BOOT_S) -> float:
    """Seconds from request to an instance being up (``base`` / ``spot_extra``: measured overrides)."""
    return base + (spot_extra if spot else 0.0)


def checkpoint_s(model_mb: float) -> float:
    """Seconds one checkpoint write stalls training (ICAC'19: base + per MB to GCS)."""
    return CHECKPOINT_BASE_S + CHECKPOINT_PER_MB_S * model_mb


def is_critical(role: Role, hosts_chief: bool = False) -> bool:
    """Losing this instance rolls training back to the last checkpoint and pauses it until a
    replacement is up: a parameter server, the chief, or a worker whose VM also runs the chief."""
    return role != Role.WORKER or hosts_chief


class Verdict(StrEnum):
    REPLACE = "replace"
    SHRINK = "shrink"  # carry on without this worker
    EXHAUSTED = "exhausted"  # policy.max_replacements reached


@dataclass(frozen=True)
class Replacement:
    verdict: Verdict
    spot: bool = False  # the replacement's pricing (REPLACE only)


def decide_replacement(role: Role, *, preempted: bool, spot: bool, on_revocation: OnRevocation,
                       replacements: int, max_replacements: int, hosts_chief: bool = False) -> Replacement:
    """What happens to a slot whose instance was lost (``preempted``: revoked by the cloud, not lost
    otherwise). Under ``shrink`` a preempted plain worker is not replaced; a PS or the chief always is.
    ``fallback-on-demand`` replaces a preempted spot instance with an on-demand one."""
    if on_revocation == OnRevocation.SHRINK and preempted and not is_critical(role, hosts_chief):
        return Replacement(Verdict.SHRINK)
    if replacements >= max_replacements:
        return Replacement(Verdict.EXHAUSTED)
    fallback = preempted and on_revocation == OnRevocation.FALLBACK_ON_DEMAND
    return Replacement(Verdict.REPLACE, spot=spot and not fallback)


def replacement_zones(last_zone: str, zones: tuple[str, ...], rotate: bool = False) -> tuple[str, ...]:
    """Zones to try for a replacement, in order: the lost instance's zone first (its GPUs and disks are
    there), then the slot's other zones; ``rotate`` starts at the zone after it instead."""
    if rotate and last_zone in zones:
        k = zones.index(last_zone) + 1
        return zones[k:] + zones[:k]
    return (last_zone,) + tuple(z for z in zones if z != last_zone)


def in_notice_grace(revoked_at: float, now: float, notice_s: float | None = None) -> bool:
    """A revoked instance still in its notice window (plus the checkpoint upload: as long again) is not
    deleted yet; ``notice_s``: the window the VM really has (``notice_window_s``)."""
    return now - revoked_at < (REVOKED_GRACE_S if notice_s is None else 2 * notice_s)


def notice_window_s(provider: ProviderSpec) -> float:
    """Seconds from a preemption notice to hard off: 30 s, or 120 s on gce Spot VMs whose spec asks for
    scheduling.preemptionNoticeDuration (provider.preemption_notice_s: 120)."""
    gce = provider.as_gce()
    return EXTENDED_NOTICE_S if gce is not None and gce.preemption_notice_s else NOTICE_WINDOW_S


def image_boot_extra_s(route: str) -> float:
    """Seconds a first boot on an image route adds to BOOT_S (data/cloud_facts.csv image_boot_extra_<route>;
    the stock route's VMs have no GPU, and a baked image adds nothing)."""
    return _CLOUD.get(f"image_boot_extra_{route.replace('-', '_')}", 0.0)


def gce_boot_extra_s(spec: JobSpec) -> float:
    """The slowest first boot among a gce job's GPU VMs, from the image route each one takes; 0 elsewhere."""
    gce = spec.provider.as_gce()
    if gce is None:
        return 0.0
    rules = load_gce_rules()
    gpus = [g.gpu for g in spec.cluster.workers] if spec.cluster else list(spec.search.gpus if spec.search else [])
    routes = {rules.image_route(gce.image or rules.default_image(g), gce.project, gce.gpu_driver == "installer").route
              for g in gpus}
    return max((image_boot_extra_s(r) for r in routes), default=0.0)


def _rng(seed: int, slot: str, generation: int) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}/{slot}/{generation}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def revoke_after_s(provider: LocalProvider, role: Role, index: int, generation: int, gpu: str | None,
                   zone: str, spot: bool, job_started_at: float | None, now: float) -> float | None:
    """When the local provider's emulated cloud revokes a spot instance: wall seconds from creation, drawn
    from the fitted hazard model (deterministic per job seed, slot and generation) or from the spec's
    explicit schedule; None: never revoked."""
    if not spot or provider.revocations == RevocationMode.NONE:
        return None
    slot = f"{role.value}-{index}"
    if provider.revocations == RevocationMode.SCHEDULE:
        # The k-th entry naming a slot revokes that slot's k-th instance (generation k), at at_s seconds
        # after the job started; later replacements live on.
        times = sorted(item.at_s for item in provider.schedule if item.instance == slot)
        if generation >= len(times):
            return None
        started = job_started_at if job_started_at is not None else now
        return max(0.1, started + times[generation] - now)
    from orchestrator.core.revocation.model import load_revocation_model  # lazy: SciPy; the reconcile never needs it

    model = load_revocation_model()
    cloud_s = float(model.sample_lifetimes(gpu, None if zone == "local" else zone, 1,
                                           _rng(provider.seed, slot, generation))[0])
    return cloud_s / provider.time_scale
