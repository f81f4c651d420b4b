"""The ssh provider's backend: machines listed in an inventory, reached over SSH."""

from __future__ import annotations

from orchestrator.clock import WALL, Clock
from orchestrator.model.spec import SshProvider as SshSpec
from orchestrator.providers.base import TF_PORT, Backend
from orchestrator.providers.passed_env import passed_env
from orchestrator.providers.ssh.provider import SshInventoryProvider


def cache_key(spec: SshSpec, framework: str = "") -> str:
    # ``framework`` does not matter here: the inventory's machines bring their own libraries.
    return f"ssh:{spec.inventory.expanduser().resolve()}"


def build(key: str, spec: SshSpec, framework: str = "", clock: Clock = WALL) -> Backend:
    provider = SshInventoryProvider(spec.inventory, clock=clock)
    return Backend(key, provider, provider.transport, fixed_task_port=TF_PORT, endpoint=provider.endpoint,
                   python="python3", task_env=passed_env(), stable_addresses=False, clock=clock)
