"""Where an ssh inventory says otherwise than the plan: the plan prices each host at the price book's rate and
counts one GPU a host (the cost model has no inventory), while the ledger bills each host its ``price_per_hour``
and a PyTorch node trains on every GPU of its host (``control.torch_task``). `plan` and `launch` print these
notes beside the plan, so its figures are not taken for the inventory's."""

from __future__ import annotations

from orchestrator.core.instances import Role
from orchestrator.core.plan import LaunchPlan
from orchestrator.core.slots import Slot
from orchestrator.core.spec import JobSpec
from orchestrator.core.torch_spec import payload_framework
from orchestrator.providers.ssh.provider import Inventory, InventoryHost, pick_order


def placement(plan: LaunchPlan, inventory: Inventory) -> list[tuple[Slot, InventoryHost]]:
    """The host each slot would take, in the order ``SshInventoryProvider.create`` takes them (``pick_order``);
    every host taken to be free and reachable."""
    taken: set[str] = set()
    out = []
    for slot in plan.slots:
        fit = pick_order([h for h in inventory.hosts if h.name not in taken], slot.gpu, slot.gpu_count)
        if fit:
            taken.add(fit[0].name)
            out.append((slot, fit[0]))
    return out


def inventory_notes(spec: JobSpec, plan: LaunchPlan, inventory: Inventory, hours: float | None) -> tuple[str, ...]:
    """One line for the GPUs the plan does not count (PyTorch), one for the prices it does not use; none where
    the inventory agrees with the plan. ``hours``: the plan's predicted time."""
    placed = placement(plan, inventory)
    notes = []
    more = [(s, h) for s, h in placed if s.role == Role.WORKER and h.gpus > max(1, s.gpu_count)]
    if more and payload_framework(spec) == "pytorch":
        hosts = ", ".join(f"{h.name} ({h.gpus}x {h.gpu})" for _, h in more)
        notes.append(f"ssh inventory: the workers would get {hosts}; a PyTorch node trains on every GPU of its "
                     "host (one rank each, its batch split between them) where the plan counts one a host, so "
                     "expect the job faster than planned")
    planned = sum(s.price_per_hour for s, _ in placed)
    billed = sum(h.price_per_hour for _, h in placed)
    if abs(planned - billed) > 1e-6:
        cost = ""
        if hours:
            span = f"{hours * 60:.1f} min" if hours < 1 else f"{hours:.2f} h"
            cost = f" (${billed * hours:.4f} against ${planned * hours:.4f} for the planned {span})"
        notes.append(f"ssh inventory: the ledger bills each host its price_per_hour, ${billed:.4f}/h for these "
                     f"{len(placed)} hosts, where the plan prices them at the price book's ${planned:.4f}/h{cost}")
    return tuple(notes)
