"""When the local provider's emulated cloud revokes a spot instance: drawn from the fitted hazard model
(deterministic per job seed, slot and generation), or from the spec's explicit schedule."""

from __future__ import annotations

import hashlib

import numpy as np

from orchestrator.providers.base import Role
from orchestrator.spec import LocalProvider, RevocationMode


def _rng(seed: int, slot: str, generation: int) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}/{slot}/{generation}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def revoke_after_s(provider: LocalProvider, role: Role, index: int, generation: int, gpu: str | None,
                   zone: str, spot: bool, job_started_at: float | None, now: float) -> float | None:
    """Wall seconds from creation to revocation, or None (never revoked)."""
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
    from orchestrator.sim.revocation import load_revocation_model

    model = load_revocation_model()
    cloud_s = float(model.sample_lifetimes(gpu, None if zone == "local" else zone, 1,
                                           _rng(provider.seed, slot, generation))[0])
    return cloud_s / provider.time_scale
