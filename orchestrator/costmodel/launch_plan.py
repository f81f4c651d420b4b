"""A spec planned once: the slots (machine, zones, price, batch), the price book and the shape.

``plan_spec`` is the one place a pinned spec is expanded; the dry run, the quota check and the launch take
the value it returns, and the launch stores it (store.models.Intent), so the controller's passes read the
desired state recorded at launch instead of expanding the spec against today's catalog each pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.costmodel.compute import Calibration
from orchestrator.costmodel.slots import Slot, cluster_shape, expand, price_book_for
from orchestrator.costmodel.split import SplitError
from orchestrator.costmodel.stepmodel import StepModel
from orchestrator.model.blocks import BlockLike, blocked, prefer_unblocked
from orchestrator.model.catalog import Catalog, load_catalog
from orchestrator.model.errors import UserError
from orchestrator.model.instances import Role
from orchestrator.model.spec import JobSpec

PLAN_VERSION = 1  # the stored JSON's layout; bump it (and teach from_json the old one) on a change


class PlanFormatError(ValueError):
    """A stored plan this code cannot read (unknown version, missing field)."""


@dataclass(frozen=True)
class LaunchPlan:
    slots: tuple[Slot, ...]
    price_book: str  # the price book's name, overrides applied to the slot prices
    shape: str  # '1ps+chief+2xk80(spot)'
    version: int = PLAN_VERSION

    @property
    def cluster_usd_per_hour(self) -> float:
        return sum(s.price_per_hour for s in self.slots)

    @property
    def worker_batches(self) -> tuple[int, ...]:
        return tuple(s.batch or 0 for s in self.slots if s.role == Role.WORKER)

    @property
    def zones(self) -> tuple[str, ...]:
        """Every zone a slot may use, in first-use order."""
        return tuple(dict.fromkeys(z for s in self.slots for z in (s.zones or (s.zone,))))

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "price_book": self.price_book, "shape": self.shape,
                "slots": [_slot_dict(s) for s in self.slots]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> LaunchPlan:
        try:
            raw = json.loads(text)
            version = int(raw["version"])
            if version != PLAN_VERSION:
                raise PlanFormatError(f"stored plan version {version}; this controller reads {PLAN_VERSION}")
            return LaunchPlan(slots=tuple(_slot(s) for s in raw["slots"]), price_book=str(raw["price_book"]),
                              shape=str(raw["shape"]), version=version)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PlanFormatError):
                raise
            raise PlanFormatError(f"stored plan unreadable: {exc!r}") from exc


def plan_spec(spec: JobSpec, catalog: Catalog | None = None, book: str | None = None,
              blocks: Sequence[BlockLike] = (), calibration: Calibration | None = None,
              steps: StepModel | None = None) -> LaunchPlan:
    """The one expansion of a pinned spec (``book``: a recorded price book name instead of the spec's).
    ``blocks`` (stockouts and quotas in force) move each slot's blocked zones last, so placement starts
    where a create can succeed; ``calibration``: the one the job is planned with (a global batch's split);
    ``steps``: the job's step model (the local provider's emulated GPUs split by their own speeds)."""
    cat = catalog or load_catalog()
    try:
        expanded = expand(spec, cat, book, calibration, steps)
    except SplitError as exc:
        raise UserError(f"data parallel cannot place {spec.training.profile_name} on this cluster: {exc}",
                        hint="`orchestrator plan` weighs a pipeline of the model's layers across the GPUs: with "
                        "the built-in PyTorch job, set training.parallelism: auto (or pipeline); else pick GPUs "
                        "that hold the whole model") from None
    slots = tuple(_place(s, blocks) for s in expanded)
    return LaunchPlan(slots=slots, price_book=price_book_for(spec, cat, book).name, shape=cluster_shape(spec))


def _place(slot: Slot, blocks: Sequence[BlockLike]) -> Slot:
    zones = slot.zones or (slot.zone,)
    bad = [z for z in zones if blocked(blocks, z, slot.gpu) is not None]
    if not bad or len(bad) == len(zones):
        return slot  # nothing to avoid, or nowhere better: the executor waits the blocks out
    ordered = prefer_unblocked(zones, bad)
    return replace(slot, zone=ordered[0], zones=ordered)


def _slot_dict(s: Slot) -> dict[str, Any]:
    return {"role": s.role.value, "index": s.index, "gpu": s.gpu, "machine_type": s.machine_type, "zone": s.zone,
            "spot": s.spot, "price_per_hour": s.price_per_hour, "batch": s.batch, "group": s.group,
            "on_demand_price_per_hour": s.on_demand_price_per_hour, "zones": list(s.zones),
            "gpu_count": s.gpu_count, "flex_start": s.flex_start, "hosts_chief": s.hosts_chief}


def _slot(raw: dict[str, Any]) -> Slot:
    batch = raw["batch"]
    return Slot(role=Role(raw["role"]), index=int(raw["index"]), gpu=raw["gpu"], machine_type=str(raw["machine_type"]),
                zone=str(raw["zone"]), spot=bool(raw["spot"]), price_per_hour=float(raw["price_per_hour"]),
                batch=None if batch is None else int(batch), group=int(raw["group"]),
                on_demand_price_per_hour=float(raw["on_demand_price_per_hour"]),
                zones=tuple(str(z) for z in raw["zones"]), gpu_count=int(raw["gpu_count"]),
                flex_start=bool(raw["flex_start"]),
                hosts_chief=bool(raw.get("hosts_chief", False)))  # absent from plans stored before it existed
