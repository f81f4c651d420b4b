"""When the local provider's emulated cloud revokes a spot instance: the spec's schedule or the
fitted hazard model, deterministic per job seed, slot and generation."""

from __future__ import annotations

import hashlib

import numpy as np

from orchestrator.model.instances import Role
from orchestrator.model.spec import (
    LocalProvider,
    RevocationMode,
    ScheduledRevocation,
)


def _rng(seed: int, slot: str, generation: int) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}/{slot}/{generation}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def scheduled_revocation(provider: LocalProvider, slot: str, generation: int) -> ScheduledRevocation | None:
    """The schedule entry that revokes a slot's ``generation``-th instance (entries of a slot in time order;
    the spec checks refuse a slot that mixes at_s and at_step), or None."""
    items = sorted((i for i in provider.schedule if i.instance == slot), key=lambda i: (i.at_step or 0, i.at_s or 0.0))
    return items[generation] if generation < len(items) else None


def revoke_at_step(provider: LocalProvider, role: Role, index: int, generation: int, spot: bool) -> int | None:
    """The training step at which the local provider revokes a spot instance (a schedule's ``at_step``)."""
    if not spot or provider.revocations != RevocationMode.SCHEDULE:
        return None
    item = scheduled_revocation(provider, f"{role.value}-{index}", generation)
    return None if item is None else item.at_step


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
        # after the job started; later replacements live on. An at_step entry is on the progress clock.
        item = scheduled_revocation(provider, slot, generation)
        if item is None or item.at_s is None:
            return None
        started = job_started_at if job_started_at is not None else now
        return max(0.1, started + item.at_s - now)
    from orchestrator.costmodel.revocation.model import (
        load_revocation_model,  # lazy: SciPy; the reconcile never needs it
    )

    model = load_revocation_model()
    cloud_s = float(model.sample_lifetimes(gpu, None if zone == "local" else zone, 1,
                                           _rng(provider.seed, slot, generation))[0])
    return cloud_s / provider.time_scale


# ---------------------------------------------------------------- finishing by a deadline (issue 23)
#
# Each decision point (a tick of an availability trace in the simulator, a reconcile pass in the daemon)
# picks what the job runs on next: a spot VM, an on-demand VM, or nothing (wait for spot). Starting a VM
# (from nothing, or switching pricing) costs the restart overhead: boot + restore + lost steps. Every
# function below is pure, so the simulator (``sim.availability``) and the daemon (``decide.reconcile``) make
# the same decision from the same state.


