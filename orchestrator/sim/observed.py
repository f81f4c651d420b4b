"""The daemon's view of a simulated run: at a revocation, the ``JobView`` and ``Observation``
(``decide.state``) the controller would build, handed to the real ``decide.reconcile``.

Two uses: ``simulate(..., daemon=True)`` (and ``run_monte_carlo(..., daemon=True)``) let the reconcile
decide every revocation of the run (``daemon_decision``), so any change to the daemon shows up in
simulation; ``compare_with_daemon`` sets the reconcile's answer beside what a recorded run did. By
default the engine decides with the ``decide.deadline`` functions the reconcile itself calls (~10x faster
per revocation); the two agree (tests/test_sim_daemon_agree.py).

Known differences of the default engine (``docs/simulator.md``): a sync job losing a worker is restarted
by the daemon (unless elastic) but only paused (``regroup_s``) and slowed in the simulator (also with
``daemon=True``: only the replacement decisions come from the reconcile); with ``max_replacements`` used
up the daemon fails the job while the engine carries on with the workers left; the engine's
``rotate_zones`` has no daemon counterpart. A worker that also hosts the chief (``hosts_chief``) has none
either: such clusters are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.costmodel.slots import Slot
from orchestrator.decide import replacement as replacing
from orchestrator.decide.actions import Action, CreateInstance, RestartTraining, SetJobStatus
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.replacement import Replacement, Verdict
from orchestrator.decide.state import InstanceView, JobView, Observation
from orchestrator.model.instances import ObservedInstance, ObservedState, ProcState, ProcStatus, Role
from orchestrator.model.spec import OnRevocation, TrainingMode
from orchestrator.model.status import EndReason, InstanceStatus, JobStatus
from orchestrator.sim.cluster import RunResult, SimCluster, SimEvent, SimSlot


@dataclass(frozen=True)
class Decision:
    t: float
    slot: str
    daemon: str  # "replace spot in z1" | "replace on-demand in z1" | "not replaced" | "job fails"
    engine: str
    daemon_restarts: bool  # reconcile asked for a RestartTraining (roll back to the checkpoint)
    engine_rolls_back: bool

    @property
    def agree(self) -> bool:
        ends = self.daemon == "job fails"  # nothing restarts in a job that ends
        return self.daemon == self.engine and (ends or self.daemon_restarts == self.engine_rolls_back)


@dataclass
class SlotHistory:
    """What the controller has recorded about one slot: each generation's pricing and zone, and whether the
    current instance is up (``ready``) or the slot was given up (``gone``)."""

    slot: Slot
    spots: list[bool]  # pricing of each generation so far
    zones: list[str]
    ready: bool = False
    gone: bool = False
    instances: list[InstanceView] = field(default_factory=list)


def _core_slot(s: SimSlot) -> Slot:
    role, index = s.name.rsplit("-", 1)
    zones = tuple(z for z in (s.zone, *s.replacement_zones) if z is not None) or ("sim",)
    return Slot(Role(role), int(index), s.gpu, "sim", zones[0], s.spot, s.price_per_hour, s.batch or None,
                on_demand_price_per_hour=s.od_price, zones=zones)


def _view(name: str, st: SlotHistory, gen: int, status: InstanceStatus, ended: bool) -> InstanceView:
    return InstanceView(id=gen, name=f"{name}-{gen}", role=st.slot.role, index=st.slot.index, generation=gen,
                        status=status, spot=st.spots[gen], zone=st.zones[gen], port=None, requested_at=0.0,
                        updated_at=0.0, end_reason=EndReason.PREEMPTED if ended else None)


def _job_and_obs(cluster: SimCluster, slots: dict[str, SlotHistory], revoked: set[str]) -> tuple[JobView, Observation]:
    views: list[InstanceView] = []
    seen: dict[str, ObservedInstance] = {}
    # While a PS or the chief is missing, training was stopped (the restart when it was lost): the others
    # are up but idle.
    halted = any(replacing.is_critical(st.slot.role) and not st.ready for st in slots.values())
    up = InstanceStatus.READY if halted else InstanceStatus.TRAINING
    for name, st in slots.items():
        current = len(st.spots) - 1
        for gen in range(current + (0 if st.gone else 1)):
            if gen < current or st.gone:
                views.append(_view(name, st, gen, InstanceStatus.DELETED, ended=True))
                continue
            view = _view(name, st, gen, up if st.ready else InstanceStatus.PROVISIONING, False)
            views.append(view)
            state = ObservedState.STOPPING if name in revoked else (
                ObservedState.RUNNING if st.ready else ObservedState.PENDING)
            seen[view.name] = ObservedInstance(view.name, cluster.name, view.role, view.index, gen, view.zone, state,
                                               preempted=name in revoked, spot=view.spot)
    job = JobView(id=cluster.name, status=JobStatus.RUNNING, outcome=None,
                  mode=TrainingMode.ASYNC if cluster.mode == "async" else TrainingMode.SYNC,
                  slots=tuple(st.slot for st in slots.values()), instances=tuple(views),
                  on_revocation=OnRevocation(cluster.policy), max_replacements=cluster.max_replacements,
                  budget_usd=None, deadline_s=None, started_at=0.0, restarts=0, cost_usd=0.0)
    procs = {v.name: ProcStatus(ProcState.RUNNING) for v in views if v.status == InstanceStatus.TRAINING}
    return job, Observation(instances=seen, procs=procs)


def _daemon_says(acts: list[Action], slot: str) -> str:
    if any(isinstance(a, SetJobStatus) and a.status == JobStatus.TEARING_DOWN for a in acts):
        return "job fails"
    for a in acts:
        if isinstance(a, CreateInstance) and a.slot.name == slot:
            return f"replace {'spot' if a.spot else 'on-demand'} in {a.zones[0]}"
    return "not replaced"


def _parse_replace(detail: str) -> tuple[bool, str]:
    """'gen 1, spot, zone z1' -> (spot, zone); the engine's zone None is the daemon view's 'sim'."""
    _, kind, zone = (part.strip() for part in detail.split(","))
    zone = zone.removeprefix("zone ")
    return kind == "spot", "sim" if zone == "None" else zone


def _engine_did(events: list[SimEvent], st: SlotHistory) -> str:
    for e in events:
        if e.slot == st.slot.name and e.kind == "replace":
            spot, zone = _parse_replace(e.detail)
            return f"replace {'spot' if spot else 'on-demand'} in {zone}"
    return "job fails" if replacing.is_critical(st.slot.role) else "not replaced"


def histories(cluster: SimCluster) -> dict[str, SlotHistory]:
    """Every slot's history at the start of a run: one instance each, booting."""
    if any(s.hosts_chief for s in cluster.slots):
        raise ValueError("a worker hosting the chief has no daemon counterpart")
    return {s.name: SlotHistory(_core_slot(s), [s.spot], [_core_slot(s).zone]) for s in cluster.slots}


def daemon_decision(cluster: SimCluster, slots: dict[str, SlotHistory], revoked: str) -> tuple[Replacement, str]:
    """What the real reconcile does when it sees ``revoked`` preempted: replace (pricing, first zone it
    tries), shrink, or end the job (``EXHAUSTED``)."""
    job, obs = _job_and_obs(cluster, slots, {revoked})
    acts = reconcile(job, obs, 0.0)
    for a in acts:
        if isinstance(a, SetJobStatus) and a.status == JobStatus.TEARING_DOWN:
            shrunk = "shrink" in a.reason  # every worker gone under shrink: the simulator's own "workers lost"
            return Replacement(Verdict.SHRINK if shrunk else Verdict.EXHAUSTED), slots[revoked].zones[-1]
    for a in acts:
        if isinstance(a, CreateInstance) and a.slot.name == revoked:
            return Replacement(Verdict.REPLACE, a.spot), a.zones[0]
    return Replacement(Verdict.SHRINK), slots[revoked].zones[-1]


def compare_with_daemon(cluster: SimCluster, run: RunResult) -> list[Decision]:
    """For each revocation in ``run`` (simulated with ``record=True``), the daemon's decision and the
    engine's. Revocations at the same instant are one reconcile pass, as in the daemon."""
    slots = histories(cluster)
    out: list[Decision] = []
    events = list(run.events)
    k = 0
    while k < len(events):
        at = [e for e in events[k:] if e.t == events[k].t]
        revoked = {e.slot for e in at if e.kind == "revoked"}
        if revoked:
            job, obs = _job_and_obs(cluster, slots, revoked)
            acts = reconcile(job, obs, 0.0)
            restarts = any(isinstance(a, RestartTraining) for a in acts)
            rolls_back = any(e.kind == "rollback" for e in at)
            out += [Decision(events[k].t, name, _daemon_says(acts, name), _engine_did(at, slots[name]), restarts,
                             rolls_back) for name in sorted(revoked)]
        for e in at:
            _apply(slots, e)
        k += len(at)
    return out


def _apply(slots: dict[str, SlotHistory], e: SimEvent) -> None:
    st = slots.get(e.slot)
    if st is None:
        return
    if e.kind == "ready":
        st.ready = True
    elif e.kind == "lost":
        st.gone = True
    elif e.kind == "replace":
        spot, zone = _parse_replace(e.detail)
        st.spots.append(spot)
        st.zones.append(zone)
        st.ready = False
