"""A pipeline job lost a stage: wait for its replacement, or re-partition the model over the survivors and go on
without it (pure; ``decide.reconcile`` asks). The choice is ``costmodel.stage_loss``'s, the simulator's own
(``sim.engine``), from the inputs the controller put in the job view (``JobView.stage_loss``: the planned
pipelines over the members and over each set of survivors, the delays) plus the slots' prices and the deadline.

A re-partition is recorded (``RecordStageLoss``); later passes leave that slot empty (``JobView.repartitioned``),
and once the lost instance is gone (its notice window over: every stage has checkpointed on the notice), the
survivors still training on the old partition restart on the new one (``control/torch_task.py`` builds their
tasks over the live stages only).
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.costmodel.slots import Slot
from orchestrator.costmodel.stage_loss import REPARTITION, WAIT, StageLossDecision, decide_stage_loss
from orchestrator.decide.state import InstanceView, JobView
from orchestrator.model.instances import Role
from orchestrator.model.status import LIVE_INSTANCE, InstanceStatus

_GONE = frozenset({InstanceStatus.DELETING, InstanceStatus.DELETED, InstanceStatus.FAILED, InstanceStatus.LOST})


def decide(job: JobView, slot: Slot, replacement_spot: bool, status: Mapping[str, InstanceStatus],
           now: float) -> StageLossDecision | None:
    """Wait or re-partition for ``slot``'s lost stage; None where the question does not arise (not a pipeline,
    ``policy.stage_loss: wait``, not a member stage, or the stage hosting the rendezvous, which every world needs)."""
    sl = job.stage_loss
    if sl is None or slot.role != Role.WORKER or slot.name == job.rdzv_slot:
        return None
    survivor_step = dict(sl.survivor_step_s)
    if slot.name not in survivor_step:
        return None
    members = [s for s in job.slots if s.name in survivor_step]
    others = sum(s.price(_spot_now(job, s, status)) for s in members if s.name != slot.name) / 3600.0
    replacement = slot.price(replacement_spot) / 3600.0
    deadline_left = (job.deadline_s - (now - job.started_at)
                     if job.deadline_s is not None and job.started_at is not None else None)
    delay = sl.replacement_s + (sl.spot_extra_s if replacement_spot else 0.0)
    d = decide_stage_loss(sl.remaining_steps, sl.full_step_s, survivor_step[slot.name], delay, sl.restore_s,
                          others + replacement, others, sl.objective, deadline_left, sl.leave_s)
    if sl.mode == REPARTITION and d.repartition.possible and d.action != REPARTITION:
        return StageLossDecision(REPARTITION, d.wait, d.repartition, "policy.stage_loss is repartition")
    return d


def describe(slot: Slot, d: StageLossDecision, survivors: list[str]) -> str:
    """The event's text: the choice, then both options' predicted time and cost."""
    w, r = d.wait, d.repartition
    rep = (f"re-partition over {', '.join(survivors)}: {r.time_s:.0f} s, ${r.usd:.4f}" if r.possible
           else f"re-partition over {', '.join(survivors)}: no partition fits their memory")
    what = "re-partition over the survivors" if d.action == REPARTITION else "wait for the replacement"
    why = d.reason.split(":", 1)[0].removeprefix(f"{d.action} is ")  # cheaper, faster, within the deadline, ...
    return f"{slot.name} lost: {what} ({why}). Predicted: wait {w.time_s:.0f} s, ${w.usd:.4f}; {rep}"[:500]


def survivors(job: JobView, lost: str) -> list[str]:
    if job.stage_loss is None:
        return []
    return [name for name, _ in job.stage_loss.survivor_step_s if name != lost]


def restart_reason(job: JobView, status: Mapping[str, InstanceStatus]) -> str | None:
    """The survivors restart on the new partition once the lost instance is gone (not while it still runs through
    its notice window, when every stage checkpoints), if one of them still trains on the partition from before."""
    for name, decided_at in job.repartitioned:
        insts = [i for i in job.instances if i.slot == name]
        if any(status[i.name] not in _GONE for i in insts):
            continue
        stale = [i for i in job.instances if i.role == Role.WORKER and i.slot != name
                 and status[i.name] == InstanceStatus.TRAINING and i.updated_at < decided_at]
        if stale:
            return f"the pipeline re-forms without {name}: re-partitioned over the survivors"
    return None


def _spot_now(job: JobView, slot: Slot, status: Mapping[str, InstanceStatus]) -> bool:
    """Whether the slot's live instance is spot (a fallback replacement may run on-demand)."""
    live: list[InstanceView] = [i for i in job.instances if i.slot == slot.name and status[i.name] in LIVE_INSTANCE]
    return max(live, key=lambda i: i.generation).spot if live else slot.spot


__all__ = ["REPARTITION", "WAIT", "decide", "describe", "restart_reason", "survivors"]
