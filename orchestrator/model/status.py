"""Statuses ("what") and the explicit table of allowed transitions; reasons ("why") live apart.

Every change goes through ``orchestrator.store.queries.switch_status``, which checks this table
and writes an event row in the same transaction.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    PENDING = "pending"  # recorded, nothing created yet
    PROVISIONING = "provisioning"  # creating instances, pushing files, starting processes
    RUNNING = "running"  # training
    RECOVERING = "recovering"  # lost an instance; replacing it / restarting from a checkpoint
    TEARING_DOWN = "tearing_down"  # deleting every instance; the outcome is already decided
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class InstanceStatus(StrEnum):
    REQUESTED = "requested"  # intent recorded; the create call may or may not have happened
    PROVISIONING = "provisioning"  # the provider accepted the create
    READY = "ready"  # running and reachable; files pushed
    TRAINING = "training"  # its job process is running
    REVOKED = "revoked"  # the cloud took it back (preemption notice or observed termination)
    LOST = "lost"  # vanished or unreachable without a preemption signal
    FAILED = "failed"  # the create failed (stockout, quota, ...)
    DELETING = "deleting"
    DELETED = "deleted"


class EndReason(StrEnum):
    """Why an instance ended (kept apart from its status)."""

    PREEMPTED = "preempted"
    LOST = "lost"
    JOB_FINISHED = "job_finished"
    JOB_CANCELLED = "job_cancelled"
    JOB_FAILED = "job_failed"
    CREATE_FAILED = "create_failed"
    REPLACED = "replaced"
    ORPHAN = "orphan"


JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.PROVISIONING, JobStatus.TEARING_DOWN}),
    JobStatus.PROVISIONING: frozenset({JobStatus.RUNNING, JobStatus.RECOVERING, JobStatus.TEARING_DOWN}),
    JobStatus.RUNNING: frozenset({JobStatus.RECOVERING, JobStatus.TEARING_DOWN}),
    JobStatus.RECOVERING: frozenset({JobStatus.RUNNING, JobStatus.TEARING_DOWN}),
    JobStatus.TEARING_DOWN: frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}

_S = InstanceStatus
INSTANCE_TRANSITIONS: dict[InstanceStatus, frozenset[InstanceStatus]] = {
    # LOST: seen stopped or terminated before it ever ran, without a preemption (the create's VM died).
    _S.REQUESTED: frozenset({_S.PROVISIONING, _S.READY, _S.FAILED, _S.REVOKED, _S.LOST, _S.DELETING}),
    _S.PROVISIONING: frozenset({_S.READY, _S.REVOKED, _S.LOST, _S.FAILED, _S.DELETING}),
    _S.READY: frozenset({_S.TRAINING, _S.REVOKED, _S.LOST, _S.DELETING}),
    _S.TRAINING: frozenset({_S.READY, _S.REVOKED, _S.LOST, _S.DELETING}),
    _S.REVOKED: frozenset({_S.DELETING}),
    _S.LOST: frozenset({_S.DELETING}),
    _S.FAILED: frozenset({_S.DELETING}),
    _S.DELETING: frozenset({_S.DELETED}),
    _S.DELETED: frozenset(),
}

ACTIVE_JOB = frozenset({JobStatus.PENDING, JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.RECOVERING,
                        JobStatus.TEARING_DOWN})
FINAL_JOB = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
# Instances that may exist in the cloud and cost money.
LIVE_INSTANCE = frozenset({_S.REQUESTED, _S.PROVISIONING, _S.READY, _S.TRAINING})
GONE_INSTANCE = frozenset({_S.REVOKED, _S.LOST, _S.FAILED, _S.DELETING, _S.DELETED})

# Seconds an instance may stay in a state before the reconciler acts (Ray v2 style timeouts).
INSTANCE_TIMEOUT_S: dict[InstanceStatus, float] = {
    _S.REQUESTED: 180.0,
    _S.PROVISIONING: 900.0,
    _S.READY: 300.0,
    _S.DELETING: 30.0,  # a delete that failed outright is asked again this soon
}


class TransitionError(ValueError):
    def __init__(self, kind: str, name: str, current: str, new: str) -> None:
        super().__init__(f"{kind} {name}: {current} -> {new} is not an allowed transition")
        self.current = current
        self.new = new
