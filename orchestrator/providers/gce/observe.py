"""What a GCE instance record says, as the controller's ``ObservedInstance``: state, addresses, labels,
and when it stopped by itself (``lastStopTimestamp``, which closes its bill)."""

from __future__ import annotations

import logging

from orchestrator.model.instances import (
    LABEL_GENERATION,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_ROLE,
    ObservedInstance,
    ObservedState,
    Role,
)
from orchestrator.providers.gce.background import epoch
from orchestrator.providers.gce.compute_api import compute_v1
from orchestrator.providers.gce.requests import GPU_ACCELERATORS

log = logging.getLogger(__name__)
# Metadata items a VM may carry to say where its sshd listens and where tasks run, when not on port 22 and
# in ``~/orchestrator`` (e.g. VMs that share one machine, as a Compute API emulator's do). GCE sets neither.
SSH_PORT_KEY = "orchestrator-ssh-port"
WORKDIR_KEY = "orchestrator-workdir"

_STATES = {
    "PROVISIONING": ObservedState.PENDING,
    "STAGING": ObservedState.PENDING,
    "REPAIRING": ObservedState.PENDING,  # host failure being repaired; the VM comes back
    "RUNNING": ObservedState.RUNNING,
    "STOPPING": ObservedState.STOPPING,
    "SUSPENDING": ObservedState.STOPPING,
    "TERMINATED": ObservedState.TERMINATED,
    "SUSPENDED": ObservedState.TERMINATED,
}




def last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _gpu(inst: compute_v1.Instance) -> str | None:
    """The catalog key of the VM's GPU (the GCE accelerator name when the catalog has none)."""
    if not inst.guest_accelerators:
        return None
    accelerator = last_segment(inst.guest_accelerators[0].accelerator_type)
    return next((key for key, name in GPU_ACCELERATORS.items() if name == accelerator), accelerator)


def _labels(inst: compute_v1.Instance) -> tuple[Role, int, int, str] | None:
    labels = dict(inst.labels)
    try:
        return (Role(labels[LABEL_ROLE]), int(labels[LABEL_INDEX]), int(labels[LABEL_GENERATION]),
                labels[LABEL_JOB])
    except (KeyError, ValueError):
        log.warning("instance %s carries the orchestrator label but malformed job labels %s; ignored",
                    inst.name, labels)
        return None


def observe(inst: compute_v1.Instance, use_internal_ip: bool) -> tuple[ObservedInstance | None, float | None]:
    """(the observation, or None for malformed labels; when it stopped, if it is TERMINATED)."""
    parsed = _labels(inst)
    if parsed is None:
        return None, None
    role, index, generation, job_id = parsed
    state = _STATES.get(inst.status)
    if state is None:
        log.warning("instance %s has unknown status %r; treating it as pending", inst.name, inst.status)
        state = ObservedState.PENDING
    spot = inst.scheduling.provisioning_model == "SPOT" or bool(inst.scheduling.preemptible)
    host, internal = _addresses(inst, use_internal_ip)
    metadata = {item.key: item.value for item in inst.metadata.items}
    port = metadata.get(SSH_PORT_KEY)
    stopped = epoch(inst.last_stop_timestamp) if inst.status == "TERMINATED" else None
    return ObservedInstance(
        name=inst.name, job_id=job_id, role=role, index=index, generation=generation,
        zone=last_segment(inst.zone), state=state, provider_id=str(inst.id), host=host,
        ssh_port=int(port) if port and port.isdigit() else None, workdir=metadata.get(WORKDIR_KEY),
        # A spot VM stopping or stopped was revoked, unless the controller stopped it itself (it knows).
        preempted=spot and state in (ObservedState.STOPPING, ObservedState.TERMINATED),
        gpu=_gpu(inst), spot=spot, internal_host=internal, labels=dict(inst.labels),
    ), stopped


def _addresses(inst: compute_v1.Instance, use_internal_ip: bool) -> tuple[str | None, str | None]:
    """(the address to reach the VM at, its internal address): the NAT IP unless use_internal_ip."""
    if not inst.network_interfaces:
        return None, None
    nic = inst.network_interfaces[0]
    nat = next((ac.nat_i_p for ac in nic.access_configs if ac.nat_i_p), None)
    host = nic.network_i_p if (use_internal_ip or not nat) else nat
    return host or None, nic.network_i_p or None
