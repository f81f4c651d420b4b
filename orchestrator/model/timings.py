"""Replacement timings, from data/: boot, notice window, checkpoint cost, retries (cloud facts from
cloud_facts.csv, each with its source; the controller's choices from policy.csv); the cost model's
overheads and the daemon's timeouts read the same figures."""

from __future__ import annotations

import csv
from typing import Final

from orchestrator.model.gce_rules import load_gce_rules
from orchestrator.model.paths import data_dir
from orchestrator.model.spec import (
    JobSpec,
    ProviderSpec,
)
from orchestrator.model.torch_spec import payload_framework


def _read(name: str) -> dict[str, float]:
    with (data_dir() / name).open(newline="") as fh:
        return {r["key"]: float(r["value"]) for r in csv.DictReader(fh)}


_CLOUD: Final = _read("cloud_facts.csv")


def _verified() -> dict[str, bool]:
    with (data_dir() / "cloud_facts.csv").open(newline="") as fh:
        return {r["key"]: r["verified"] == "1" for r in csv.DictReader(fh)}


_CLOUD_VERIFIED: Final = _verified()
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
DEADLINE_TICK_S: Final = _CHOICES["deadline_tick_s"]  # cloud seconds between on_revocation: deadline decisions
SPOT_OBTAINABLE: Final = _CHOICES["spot_obtainable"]  # GCE capacity advice's score from which spot counts as there


def boot_s(spot: bool, base: float = BOOT_S, spot_extra: float = SPOT_EXTRA_BOOT_S) -> float:
    """Seconds from request to an instance being up (``base`` / ``spot_extra``: measured overrides)."""
    return base + (spot_extra if spot else 0.0)


# Survivors' pause when a torchft replica group is lost: the Lighthouse's heartbeat timeout (1000 ms) plus the retried
# step; bench/torchft_pause.py measured 1.06 s median, 1.09 s max (2-core host, 2026-12-03). Replaces a world restart.
TORCHFT_PAUSE_S: Final = 1.1
# A PyTorch world that torchrun re-forms on a GPU VM: the workers' start-up (process, torch import, rendezvous: 9.19 s
# measured for 3 nodes on 2 cores, data/local_host.csv torch_startup_s) plus the CUDA/cuDNN warm-up (the first 20
# steps at 0.3-0.5 s each on an H100, docs/pytorch.md: about 8 s). What a revocation costs every rank, twice.
TORCH_WORLD_RESTART_S: Final = 17.0


def checkpoint_s(model_mb: float) -> float:
    """Seconds one checkpoint write stalls training (ICAC'19: base + per MB to GCS)."""
    return CHECKPOINT_BASE_S + CHECKPOINT_PER_MB_S * model_mb


def notice_window_s(provider: ProviderSpec) -> float:
    """Seconds from a preemption notice to hard off: 30 s, or 120 s on gce Spot VMs whose spec asks for
    scheduling.preemptionNoticeDuration (provider.preemption_notice_s: 120)."""
    gce = provider.as_gce()
    return EXTENDED_NOTICE_S if gce is not None and gce.preemption_notice_s else NOTICE_WINDOW_S


def image_boot_extra_s(route: str) -> float:
    """Seconds a first boot on an image route adds to BOOT_S (data/cloud_facts.csv image_boot_extra_<route>;
    the stock route's VMs have no GPU, and a baked image adds nothing)."""
    return _CLOUD.get(f"image_boot_extra_{route.replace('-', '_')}", 0.0)


def image_boot_source(route: str) -> str:
    """Where a route's first-boot figure comes from: "measured" or "ESTIMATE, not measured" (cloud_facts.csv)."""
    key = f"image_boot_extra_{route.replace('-', '_')}"
    if key not in _CLOUD:
        return "no first-boot extra"
    return f"data/cloud_facts.csv {key}: " + ("sourced" if _CLOUD_VERIFIED.get(key) else "ESTIMATE, not measured")


def gce_boot_routes(spec: JobSpec) -> set[str]:
    """The image routes a gce job's GPU VMs take (the default image is the job's framework's); empty elsewhere."""
    gce = spec.provider.as_gce()
    if gce is None:
        return set()
    rules, framework = load_gce_rules(), payload_framework(spec)
    gpus = [g.gpu for g in spec.cluster.workers] if spec.cluster else list(spec.search.gpus if spec.search else [])
    return {rules.image_route(gce.image or rules.default_image(g, framework), gce.project,
                              gce.gpu_driver == "installer").route for g in gpus}


def gce_boot_extra_s(spec: JobSpec) -> float:
    """The slowest first boot among a gce job's GPU VMs, from the image route each one takes; 0 elsewhere."""
    return max((image_boot_extra_s(r) for r in gce_boot_routes(spec)), default=0.0)


def gce_boot_note(spec: JobSpec) -> str | None:
    """What `plan` says about the first boot its figures assume: the route, the seconds and whether that
    figure is measured (today every route's figure is an estimate)."""
    routes = sorted(gce_boot_routes(spec))
    if not routes:
        return None
    parts = [f"{r} +{image_boot_extra_s(r):.0f} s" for r in routes]
    estimated = [r for r in routes if not _CLOUD_VERIFIED.get(f"image_boot_extra_{r.replace('-', '_')}", True)]
    what = ("ESTIMATES, not measured (no published figure found; data/cloud_facts.csv image_boot_extra_*)"
            if estimated else "from data/cloud_facts.csv")
    return (f"first boot of each gce VM: {BOOT_S:.0f} s + image route ({', '.join(parts)}); the route figures "
            f"are {what}; every replacement boots again")


