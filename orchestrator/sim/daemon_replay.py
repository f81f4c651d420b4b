"""The deadline policy's replay engine that drives the real daemon decision: ``decide.reconcile`` replayed pass by pass
over availability traces (the deadline policy's daemon tests: the simulator's replays in ``sim.availability``,
``sim.multizone`` and ``sim.elastic`` decide by the same functions, and these replays check that the daemon's
reconcile makes the simulator's choices). The actions ``reconcile`` returns are applied as the controller would, at
once. A create starts training at once, a drained VM checkpoints
half a second later, and the note events the daemon would record are kept as the DB keeps them, to be read back
as ``control.deadline`` does (each market's changes under its zone or market key)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.costmodel.slots import Slot
from orchestrator.decide import deadline_zones
from orchestrator.decide.actions import (
    CreateInstance,
    DeleteInstance,
    DrainInstance,
    RecordElasticChoice,
    RecordSpotAvailability,
    RecordSpotCount,
    SetInstanceStatus,
)
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import DeadlineInputs, InstanceView, JobView, Observation
from orchestrator.model.instances import ObservedInstance, ObservedState, ProcState, ProcStatus
from orchestrator.model.spec import OnRevocation, TrainingMode
from orchestrator.model.status import InstanceStatus, JobStatus


class ReplayedDaemon:
    """The DB and the controller of one job, as far as ``reconcile`` reads and acts on them, on a virtual clock."""

    def __init__(self) -> None:
        self.insts: dict[str, InstanceView] = {}
        self.spot_seen: list[tuple[float, bool]] = []
        self.spot_counts: list[tuple[float, int]] = []
        self.elastic_choice: tuple[float, int, int] | None = None
        self.market_seen: dict[str, list[tuple[float, bool]]] = {}  # by zone, or by GPU type's market key
        self.drains: list[tuple[str, float]] = []
        self.checkpoint_at: float | None = None

    def apply(self, act: object, now: float) -> bool:
        """One action; True when it drained a VM (the next pass follows within the tick)."""
        if isinstance(act, DrainInstance):
            self.drains.append((act.name, now))
            self.checkpoint_at = now + 0.5
            return True
        if isinstance(act, RecordElasticChoice):
            self.elastic_choice = (now, act.spot, act.on_demand)
        elif isinstance(act, RecordSpotCount):
            self.spot_counts.append((now, act.count))
        elif isinstance(act, RecordSpotAvailability):
            changes = self.spot_seen if act.zone is None else self.market_seen.setdefault(act.zone, [])
            changes.append((now, act.available))
            if act.zone is not None:  # the note's reason names the market, as control.deadline reads it back
                assert deadline_zones.zone_of_reason(act.reason) == act.zone
        elif isinstance(act, SetInstanceStatus):
            v = self.insts[act.name]
            self.insts[act.name] = InstanceView(**{**v.__dict__, "status": act.status, "updated_at": now,
                                                   "end_reason": act.end_reason or v.end_reason,
                                                   "revoked_at": now if act.status == InstanceStatus.REVOKED
                                                   else v.revoked_at})
        elif isinstance(act, DeleteInstance):
            self.insts[act.name] = InstanceView(**{**self.insts[act.name].__dict__, "status": InstanceStatus.DELETED})
        elif isinstance(act, CreateInstance):
            name = f"j-{act.slot.name}-{act.generation}"
            self.insts[name] = InstanceView(id=len(self.insts), name=name, role=act.slot.role, index=act.slot.index,
                                            generation=act.generation, status=InstanceStatus.TRAINING,
                                            spot=act.spot, zone=act.zones[0], port=None, requested_at=now,
                                            updated_at=now, gpu=act.slot.gpu)
        return False

    def pass_over(self, slot: Slot | tuple[Slot, ...], deadline_s: float, started_at: float, inputs: DeadlineInputs,
                  preempted: Callable[[InstanceView], bool], now: float, zones: tuple[str, ...] = (),
                  **probe: Any) -> bool:
        """One pass of ``reconcile`` over a job of one slot (or of several: an elastic PyTorch world whose rendezvous
        is on the first): its spot VMs for which ``preempted`` holds are lost now; ``probe``: the provider's answers
        (``Observation`` fields). True when it drained a VM."""
        slots = slot if isinstance(slot, tuple) else (slot,)
        live = self.training()
        gone = {v.name for v in live if v.spot and preempted(v)}
        seen = {v.name: ObservedInstance(v.name, "j", v.role, v.index, v.generation, v.zone,
                                         ObservedState.TERMINATED if v.name in gone else ObservedState.RUNNING,
                                         preempted=v.name in gone) for v in live}
        view = JobView(id="j", status=JobStatus.RUNNING, outcome=None, mode=TrainingMode.SYNC, slots=slots,
                       instances=tuple(self.insts.values()), on_revocation=OnRevocation.DEADLINE,
                       max_replacements=5, budget_usd=None, deadline_s=deadline_s, started_at=started_at,
                       restarts=0, cost_usd=0.0, deadline_inputs=inputs, zones=zones, elastic=len(slots) > 1,
                       rdzv_slot=slots[0].name if len(slots) > 1 else None)
        obs = Observation(instances=seen, procs={n: ProcStatus(ProcState.RUNNING) for n in seen}, **probe)
        drained = False
        for act in reconcile(view, obs, now):
            drained |= self.apply(act, now)
        return drained

    def seen(self) -> dict[str, Any]:
        """What the daemon recorded, as ``DeadlineInputs`` fields (``control.deadline`` reads them back)."""
        return {"spot_seen": tuple(self.spot_seen), "spot_counts": tuple(self.spot_counts),
                "elastic_choice": self.elastic_choice,
                "drains": tuple(self.drains), "checkpoint_at": self.checkpoint_at,
                "zone_spot_seen": tuple((z, tuple(c)) for z, c in sorted(self.market_seen.items()))}

    def training(self) -> list[InstanceView]:
        return [v for v in self.insts.values() if v.status == InstanceStatus.TRAINING]
