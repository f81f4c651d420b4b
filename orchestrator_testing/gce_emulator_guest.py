"""Guest attributes for the Compute API emulator: ``instances.getGuestAttributes``.

On GCE the guest agent of a VM started with ``enable-guest-attributes=TRUE`` publishes the sshd's host
keys under the ``hostkeys/`` namespace, and the controller pins them. Here every emulated VM is the real
sshd listening at the instance's ``emulator-ssh-port``: once the VM is RUNNING its "guest agent"
publishes the key that sshd shows (read from the server itself, as the agent reads /etc/ssh). Before
that, or with guest attributes disabled, GCE answers 404, and so does this.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import paramiko

from orchestrator_testing.gce_emulator_model import ApiError
from orchestrator_testing.gce_emulator_state import GceState

ENDPOINT = "instances.getGuestAttributes"


def _metadata(body: Mapping[str, Any]) -> dict[str, str]:
    return {i["key"]: i.get("value", "") for i in (body.get("metadata") or {}).get("items", [])}


def sshd_host_key(host: str, port: int, timeout_s: float = 5.0) -> tuple[str, str]:
    """(key type, base64 blob) of the SSH server at host:port, as ``ssh-keyscan`` would print it."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        transport = paramiko.Transport(sock)
        try:
            transport.start_client(timeout=timeout_s)
            key = transport.get_remote_server_key()
            return str(key.get_name()), str(key.get_base64())
        finally:
            transport.close()


def guest_attributes(state: GceState, project: str, zone: str, name: str, query: Mapping[str, str]) -> dict[str, Any]:
    """The body of ``GET .../instances/{name}/getGuestAttributes?queryPath=hostkeys/``."""
    inst = state.get_instance(project, zone, name)  # 404 for an unknown instance
    path = f"projects/{project}/zones/{zone}/instances/{name}/guestAttributes"
    query_path = query.get("queryPath", "")
    meta = _metadata(inst)
    port = meta.get("orchestrator-ssh-port") or meta.get("emulator-ssh-port") or str(state.config.ssh_port or "")
    enabled = meta.get("enable-guest-attributes", "").upper() == "TRUE"
    if inst.get("status") != "RUNNING" or not enabled or not port.isdigit() or not query_path.startswith("hostkeys"):
        raise ApiError(404, "notFound", f"The resource '{path}/{query_path}' was not found")
    try:
        key_type, blob = sshd_host_key(state.config.network_ip, int(port))
    except (OSError, paramiko.SSHException):
        raise ApiError(404, "notFound", f"The resource '{path}/{query_path}' was not found") from None
    return {
        "kind": "compute#guestAttributes",
        "queryPath": query_path,
        "queryValue": {"items": [{"namespace": "hostkeys", "key": key_type, "value": blob}]},
        "selfLink": f"{path}?queryPath={query_path}",
    }
