"""An ssh inventory in the plan. The cost model prices each instance from the price book and counts one GPU a
host (it has no inventory), while the ledger bills each host its ``price_per_hour`` and a PyTorch node trains on
every GPU of its host (``control.torch_task``). So the plan's figures are repriced at the hosts the provider would
pick (``inventory_priced``: the budget check and `plan` use them), and `plan` and `launch` print notes where the
inventory differs from the price book and where a host has GPUs the plan does not count."""

from __future__ import annotations

import math
from dataclasses import replace

from orchestrator.costmodel import Candidate
from orchestrator.costmodel.launch_plan import LaunchPlan
from orchestrator.costmodel.planner.scoring import repriced
from orchestrator.costmodel.slots import Slot
from orchestrator.model.instances import Role
from orchestrator.model.spec import JobSpec
from orchestrator.model.torch_spec import payload_framework
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


def inventory_rates(placed: list[tuple[Slot, InventoryHost]]) -> tuple[float, float]:
    """USD per hour of the placed slots: at the price book's prices (as the plan has them) and at their hosts'
    ``price_per_hour`` (as the ledger bills them)."""
    return sum(s.price_per_hour for s, _ in placed), sum(h.price_per_hour for _, h in placed)


def inventory_priced(judged: Candidate, plan: LaunchPlan, inventory: Inventory, budget_usd: float | None
                     ) -> Candidate:
    """The planner's figures for ``judged`` with each placed host at its ``price_per_hour``, its budget judged
    again (the cost model's cost is the cluster's hourly price x the predicted time, so it scales with the
    hourly price)."""
    placed = placement(plan, inventory)
    book, billed = inventory_rates(placed)
    if abs(book - billed) <= 1e-9:
        return judged
    host_of = {id(s): h for s, h in placed}
    slots = [s for s in plan.slots if s.role == Role.WORKER]
    workers = judged.workers
    if len(slots) == len(workers):  # the plan expands the candidate's workers in order
        workers = tuple(replace(w, price_per_hour=host_of[id(s)].price_per_hour) if id(s) in host_of else w
                        for w, s in zip(workers, slots, strict=True))
    hourly = max(0.0, judged.hourly_usd - book + billed)
    if judged.hourly_usd > 0 and math.isfinite(judged.cost_usd):
        cost = judged.cost_usd * hourly / judged.hourly_usd
    else:
        cost = hourly * judged.time_s / 3600 if math.isfinite(judged.time_s) else judged.cost_usd
    return repriced(judged, workers, hourly, cost, budget_usd)


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
    book, billed = inventory_rates(placed)
    if abs(book - billed) > 1e-6:
        cost = ""
        if hours:
            span = f"{hours * 60:.1f} min" if hours < 1 else f"{hours:.2f} h"
            cost = f" (${billed * hours:.4f} against ${book * hours:.4f} for the planned {span})"
        notes.append(f"ssh inventory: the plan and its budget check price each host at its price_per_hour, as the "
                     f"ledger bills it: ${billed:.4f}/h for these {len(placed)} hosts, where the price book "
                     f"({plan.price_book}) says ${book:.4f}/h{cost}")
    return tuple(notes)
