"""Is the ssh provider set up? The inventory parses and is sane, and every host's key is a readable 0600 file."""

from __future__ import annotations

import os
from collections.abc import Callable

from orchestrator.model.errors import UserError
from orchestrator.model.spec import SshProvider as SshSpec
from orchestrator.providers.base import Provider
from orchestrator.providers.ssh.provider import load_inventory


def check_setup(spec: SshSpec, provider: Callable[[], Provider] | None) -> None:
    """Raise a one-line error (an InventoryError names each field) before anything is created."""
    inventory = load_inventory(spec.inventory)  # hosts, GPUs, key files (present, mode 0600), known_hosts
    for i, host in enumerate(inventory.hosts):
        if host.key is not None and not os.access(host.key, os.R_OK):
            raise UserError(f"inventory.hosts[{i}].key: {host.key} is not readable by this user",
                            hint="chown it to this user (mode 0600) or point key at one that is; nothing was created")
