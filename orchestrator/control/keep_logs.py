"""Keep an instance's task log in the job's storage before the instance (and its disk) goes.

``orchestrator logs JOB --instance SLOT`` reads it from there once the instance is deleted.
"""

from __future__ import annotations

import logging

from orchestrator.model.instances import ObservedInstance, ObservedState
from orchestrator.providers.registry import Backend
from orchestrator.storage.base import JobStorage
from orchestrator.transport.local import LocalTransport

log = logging.getLogger(__name__)
LOGS = "logs"
KEEP_BYTES = 2_000_000  # the tail; a runaway log must not fill the bucket


def log_key(instance: str) -> str:
    return f"{LOGS}/{instance}.log"


def keep_log(backend: Backend, storage: JobStorage, observed: ObservedInstance | None, instance: str,
             task: str) -> None:
    """Best effort: an unreachable (revoked, terminated) host's log may be gone already; never block a delete."""
    if observed is None:
        return
    if observed.state == ObservedState.TERMINATED and not isinstance(backend.transport, LocalTransport):
        return  # a stopped VM is unreachable over SSH; waiting for a timeout would only delay the delete
    try:
        data = backend.transport.read_log(backend.endpoint(observed), task)
        if data:
            storage.write_text(log_key(instance), data[-KEEP_BYTES:].decode(errors="replace"))
    except Exception as exc:  # noqa: BLE001 - any failure here only costs the log, not the teardown
        log.info("could not keep the log of %s: %s", instance, exc)
