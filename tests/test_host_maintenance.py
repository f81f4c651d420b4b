"""GCE stops GPU VMs for host maintenance an hour after a notice (its metadata's maintenance-event; the sidecar,
jobs/storage_sync.py, writes it as the VM's notice): an on-demand VM with a notice is kept through the notice
window for the job's checkpoint, then replaced like any lost VM, on-demand, before GCE stops it."""

from __future__ import annotations

from orchestrator.costmodel.slots import Slot
from orchestrator.decide.actions import Action, CreateInstance, DeleteInstance, SetInstanceStatus
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import InstanceView, JobView, Observation
from orchestrator.model.instances import ObservedInstance, ObservedState, ProcState, ProcStatus, Role
from orchestrator.model.spec import OnRevocation, TrainingMode
from orchestrator.model.status import EndReason, InstanceStatus, JobStatus

T0 = 1_000_000.0
NAME = "j-worker-0-0"
NOTICE_S = 30.0


def _job(status: InstanceStatus, revoked_at: float | None = None) -> JobView:
    slot = Slot(Role.WORKER, 0, "a100", "gce", "z1", False, 3.7, on_demand_price_per_hour=3.7, zones=("z1",))
    vm = InstanceView(id=1, name=NAME, role=Role.WORKER, index=0, generation=0, status=status, spot=False,
                      zone="z1", port=None, requested_at=T0 - 3600, updated_at=revoked_at or T0 - 3000,
                      revoked_at=revoked_at, end_reason=None if revoked_at is None else EndReason.LOST.value)
    return JobView(id="j", status=JobStatus.RUNNING, outcome=None, mode=TrainingMode.SYNC, slots=(slot,),
                   instances=(vm,), on_revocation=OnRevocation.REPLACE, max_replacements=3, budget_usd=None,
                   deadline_s=None, started_at=T0 - 3600, restarts=0, cost_usd=0.0, notice_s=NOTICE_S)


def _obs() -> Observation:
    vm = ObservedInstance(NAME, "j", Role.WORKER, 0, 0, "z1", ObservedState.RUNNING, "/w", spot=False)
    return Observation(instances={NAME: vm}, procs={NAME: ProcStatus(ProcState.RUNNING, None)},
                       notices=frozenset({NAME}))


def _of(acts: list[Action], kind: type) -> list[Action]:
    return [a for a in acts if isinstance(a, kind)]


def test_a_maintenance_notice_on_an_on_demand_vm_keeps_it_for_the_checkpoint_then_replaces_it() -> None:
    acts = reconcile(_job(InstanceStatus.TRAINING), _obs(), T0)
    marks = [a for a in _of(acts, SetInstanceStatus) if isinstance(a, SetInstanceStatus) and a.name == NAME]
    assert marks and marks[0].status == InstanceStatus.REVOKED and "host maintenance" in marks[0].reason
    assert marks[0].end_reason == EndReason.LOST  # no preemption: not counted as one, replaced on its own pricing
    assert not _of(acts, DeleteInstance)  # the checkpoint on the notice comes first
    later = reconcile(_job(InstanceStatus.REVOKED, revoked_at=T0 - 2 * NOTICE_S - 1), _obs(), T0)
    assert _of(later, DeleteInstance)
    creates = [a for a in _of(later, CreateInstance) if isinstance(a, CreateInstance)]
    assert len(creates) == 1 and not creates[0].spot and creates[0].generation == 1
