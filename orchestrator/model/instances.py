"""What the controller and the providers say about instances: roles, names, labels, requests, observations.

Pure vocabulary shared by the core (reconcile, policy), the providers and the transports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    PS = "ps"
    CHIEF = "chief"
    WORKER = "worker"


# Labels every instance carries, so a restarted controller (or `orchestrator gc`) finds its VMs.
LABEL_MANAGED = "orchestrator"  # value "1"
LABEL_JOB = "orch-job"
LABEL_ROLE = "orch-role"
LABEL_INDEX = "orch-index"
LABEL_GENERATION = "orch-gen"
# The image builder VM (control/images.py) is labelled as a job of its own, plus these: the orphan sweep
# leaves it alone until LABEL_BAKE_UNTIL (epoch seconds), when its bake is over whatever happened.
LABEL_BAKE = "orch-bake"
LABEL_BAKE_UNTIL = "orch-bake-until"
# Request metadata the local provider reads: revoke this spot instance when the job's training reaches this step.
REVOKE_AT_STEP = "revoke-at-step"
BAKE_MODE = "bake"  # jobs.mode of the pseudo-job that records one bake and bills its builder VM


def instance_name(job_id: str, role: Role | str, index: int, generation: int) -> str:
    """Deterministic name ``<job>-<role>-<index>-<generation>`` (valid GCE name: lowercase, <=63)."""
    name = f"{job_id}-{Role(role).value}-{index}-{generation}"
    if len(name) > 63:
        raise ValueError(f"instance name {name!r} is longer than 63 characters; shorten the job name")
    return name


@dataclass(frozen=True)
class InstanceRequest:
    """What to create. ``name`` is deterministic, so creating twice is a no-op."""

    name: str
    job_id: str
    role: Role
    index: int
    generation: int
    zone: str
    machine_type: str
    spot: bool
    gpu: str | None = None  # catalog key, e.g. "k80"; None for CPU-only (PS, chief)
    gpu_count: int = 0
    price_per_hour: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    # Local provider only: seconds after creation at which the emulated cloud revokes this instance.
    revoke_after_s: float | None = None
    # Cloud-side deadline: the cloud stops/deletes the VM itself after this many seconds (GCE
    # scheduling.maxRunDuration), so spend stays bounded even if every controller is dead.
    max_run_s: int | None = None
    flex_start: bool = False  # GCE Dynamic Workload Scheduler (provisioningModel=FLEX_START); not spot

    def all_labels(self) -> dict[str, str]:
        base = {
            LABEL_MANAGED: "1",
            LABEL_JOB: self.job_id,
            LABEL_ROLE: self.role.value,
            LABEL_INDEX: str(self.index),
            LABEL_GENERATION: str(self.generation),
        }
        return {**self.labels, **base}


class ObservedState(StrEnum):
    """What the provider reports, normalised across clouds."""

    PENDING = "pending"  # PROVISIONING / STAGING
    RUNNING = "running"
    STOPPING = "stopping"  # GCE STOPPING: a preemption in progress, or a stop we asked for
    TERMINATED = "terminated"  # stopped / preempted / host unreachable; still billed for disk only


@dataclass(frozen=True)
class ObservedInstance:
    name: str
    job_id: str
    role: Role
    index: int
    generation: int
    zone: str
    state: ObservedState
    provider_id: str = ""
    host: str | None = None  # address the transport connects to
    ssh_port: int | None = None
    workdir: str | None = None  # the instance's "disk" (local / emulated instances)
    preempted: bool = False  # the provider says the cloud revoked it (not a stop we asked for)
    gpu: str | None = None
    spot: bool = False
    # Address inside the cluster's network (TensorFlow traffic; the firewall opens its ports only there).
    internal_host: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)  # as the provider reports them


class ProcState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    ABSENT = "absent"  # never started here (or the instance's disk was replaced)


@dataclass(frozen=True)
class ProcStatus:
    state: ProcState
    exit_code: int | None = None
