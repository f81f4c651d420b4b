"""Replay a finished job from the results DB: its observed revocations, delays and step rates.

``replay_job`` returns the simulated outcome next to the measured one, so the simulator can be
checked against reality (``orchestrator simulate --replay JOB_ID``). Everything the simulation is
given comes from the job's own rows (times relative to the job's start, ``jobs.started_at``):

* revocations: each revoked instance's slot at ``revoked_at`` (the notice; its replacement is
  requested then); ``notice_s``: median ``deleted_at - revoked_at`` of revoked instances (billed);
* ``boot_delay_s``: median ``ready_at - requested_at`` (request to reachable with the job files);
* step rates: the chief's ``kind='step'`` rows, one every ``log_every`` steps. Each logging window
  (between two consecutive rows, minus the periodic checkpoints written in it) gives cluster steps/s
  for the set of workers that stepped in it (their ``kind='worker'`` rows); windows across a training
  restart are skipped. Sets never observed fall back to the sum (async) or minimum (sync) of the
  workers' own rates (1 / mean per-worker ``step_time_s``);
* ``checkpoint_cost_s``: mean seconds of the periodic checkpoints (``kind='checkpoint'`` rows);
* ``startup_s``: from the instances being up to the first training step (task start, TensorFlow
  import, connecting, graph build): the first step row's time, less the time its steps take at the
  measured rate, less the boot delay;
* ``rejoin_s``: from a replacement worker's instance being up to its first step (its server starting
  and the chief reconnecting): its first window with steps after a window without (the revoked
  instance drains first), taken at the window's midpoint, less its request time and the boot delay;
* ``teardown_s``: the last step row to ``jobs.ended_at`` (final checkpoint, evaluation, deletion).

Measured wall time is ``ended_at - started_at`` (as in ``job_summary``), measured cost the ledger.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.model import timings
from orchestrator.model.catalog import load_catalog
from orchestrator.model.errors import UserError
from orchestrator.model.spec import JobSpec, SpecError, validate_spec
from orchestrator.sim.engine import RunResult, replay
from orchestrator.sim.from_spec import SimSpecError, cluster_from_spec, local_boot_delay_s
from orchestrator.store import queries
from orchestrator.store.models import Event, Instance, Job, Metric

REVOKED_REASONS = frozenset({"preempted", "lost"})
RESTART_NOTES = frozenset({"restart", "resumed"})


@dataclass
class Measured:
    """What the job's metric rows say about its training speed and delays (see the module docstring)."""

    worker_rates: dict[str, float] = field(default_factory=dict)  # slot -> steps/s on its own
    set_rates: dict[frozenset[str], float] = field(default_factory=dict)  # live workers -> cluster steps/s
    checkpoint_cost_s: float | None = None
    startup_s: float = 0.0
    rejoin_s: float = 0.0
    teardown_s: float = 0.0
    first_step_at: float | None = None  # seconds after the start
    last_step_at: float | None = None


def _slot(worker: int) -> str:
    return f"worker-{worker}"


@dataclass
class _MetricRows:
    """A job's metric rows, sorted by time: what ``measure`` derives its figures from."""

    steps: list[tuple[int, float]] = field(default_factory=list)  # (step, at) of the cluster rows
    stepped: dict[tuple[int, float], set[int]] = field(default_factory=lambda: defaultdict(set))  # row -> workers
    times: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))  # worker -> step times
    checkpoints: list[tuple[int, float, float]] = field(default_factory=list)  # periodic: (step, at, seconds)


def measure(
    session: Session, job: Job, instances: Sequence[Instance], t0: float, boot_s: float
) -> Measured:
    """Step rates and delays of ``job`` from its metric and event rows (times relative to ``t0``)."""
    m = Measured()
    rows = _metric_rows(session, job)
    m.worker_rates = {_slot(w): 1.0 / statistics.fmean(v) for w, v in rows.times.items()}
    if rows.checkpoints:
        m.checkpoint_cost_s = statistics.fmean(c[2] for c in rows.checkpoints)
    steps = rows.steps
    if not steps:
        return m
    m.set_rates, window_s = _set_rates(rows, _restarts(session, job))

    # Startup: the first row's steps at the measured rate of its workers end at the row's time.
    s1, a1 = steps[0]
    first_set = frozenset(_slot(w) for w in rows.stepped.get((s1, a1), ()))
    rate = m.set_rates.get(first_set) or sum(m.worker_rates.get(w, 0.0) for w in first_set)
    m.first_step_at = a1 - t0
    m.last_step_at = steps[-1][1] - t0
    if rate > 0:
        m.startup_s = max(0.0, m.first_step_at - s1 / rate - boot_s)
    if job.ended_at is not None:
        m.teardown_s = max(0.0, job.ended_at - steps[-1][1])
    rejoins = _rejoins(rows, window_s, instances, boot_s)
    if rejoins:
        m.rejoin_s = max(0.0, statistics.median(rejoins))
    return m


def _metric_rows(session: Session, job: Job) -> _MetricRows:
    out = _MetricRows()
    rows = session.execute(
        select(Metric.kind, Metric.worker, Metric.step, Metric.step_time_s, Metric.at)
        .where(Metric.job_id == job.id, Metric.kind.in_(("step", "worker", "checkpoint")))
        .order_by(Metric.at, Metric.id)
    ).all()
    every = max(1, int(yaml.safe_load(job.spec_yaml).get("training", {}).get("checkpoint_every") or 1))

    def periodic(step: int) -> bool:  # the notice and final checkpoints are not in the simulation's model
        return 0 < step < job.train_steps and step % every == 0

    for kind, worker, step, step_time, at in rows:
        if kind == "step":
            out.steps.append((int(step), float(at)))
        elif kind == "worker" and worker is not None and worker >= 0 and step_time and step_time > 0:
            out.stepped[(int(step), float(at))].add(int(worker))
            out.times[int(worker)].append(float(step_time))
        elif kind == "checkpoint" and step_time is not None and periodic(int(step)):
            out.checkpoints.append((int(step), float(at), float(step_time)))
    return out


def _restarts(session: Session, job: Job) -> list[float]:
    """When the job's training restarted (whole-cluster restarts and resumes)."""
    return [
        float(at)
        for at in session.scalars(
            select(Event.at).where(Event.job_id == job.id, Event.entity == "note",
                                   Event.to_status.in_(sorted(RESTART_NOTES)))
        )
    ]


def _set_rates(
    rows: _MetricRows, restarts: Sequence[float]
) -> tuple[dict[frozenset[str], float], dict[tuple[int, float], float]]:
    """Cluster steps/s per set of stepping workers, from consecutive step rows; and each row's window."""
    done: dict[frozenset[str], float] = defaultdict(float)
    spent: dict[frozenset[str], float] = defaultdict(float)
    window_s: dict[tuple[int, float], float] = {}
    for (s0, a0), (s1, a1) in zip(rows.steps, rows.steps[1:], strict=False):
        if s1 <= s0 or any(a0 < r <= a1 for r in restarts):
            continue
        window_s[(s1, a1)] = a1 - a0
        who = frozenset(_slot(w) for w in rows.stepped.get((s1, a1), ()))
        if not who:
            continue
        done[who] += s1 - s0
        spent[who] += a1 - a0 - sum(c[2] for c in rows.checkpoints if a0 < c[1] <= a1)
    return {k: done[k] / spent[k] for k in done if spent[k] > 0}, window_s


def _rejoins(
    rows: _MetricRows, window_s: dict[tuple[int, float], float], instances: Sequence[Instance], boot_s: float
) -> list[float]:
    """Rejoin: a replacement worker's first window with steps after one without (the old one drained)."""
    out = []
    for inst in instances:
        if inst.role != "worker" or inst.generation == 0 or inst.end_reason == "create_failed":
            continue
        gap = False
        for s, a in rows.steps:
            if a <= inst.requested_at:
                continue
            if inst.slot_index not in rows.stepped.get((s, a), ()):
                gap = True
            elif gap:
                joined = a - window_s.get((s, a), 0.0) / 2
                out.append(joined - inst.requested_at - boot_s)
                break
    return out


def _result_dict(r: RunResult) -> dict[str, Any]:
    return {
        "wall_time_s": r.wall_time_s,
        "cost_usd": r.cost_usd,
        "cost_by_role_usd": dict(r.cost_by_role),
        "revocations": r.revocations,
        "replacements": r.replacements,
        "steps_done": r.steps_done,
        "steps_lost": r.steps_lost,
        "finished": r.finished,
        "failure": r.failure,
    }


def replay_job(session: Session, job_id: str) -> dict[str, Any]:
    """Simulate job ``job_id`` (id or name) with what the DB recorded; returns measured vs simulated."""
    job, spec, instances = _recorded_job(session, job_id)
    t0 = job.started_at if job.started_at is not None else min(i.requested_at for i in instances)
    schedule, notice_s = _revocations(instances, t0)
    boot_delay = _boot_delay(spec, instances)
    got = measure(session, job, instances, t0, boot_delay)
    try:
        cluster = cluster_from_spec(spec, price_book=job.price_book or None)
    except SimSpecError as exc:
        raise UserError(str(exc)) from None
    known = {s.name for s in cluster.slots}
    schedule = [(slot, at) for slot, at in schedule if slot in known]
    step_rates = {k: v for k, v in got.worker_rates.items() if k in known}
    set_rates = {k: v for k, v in got.set_rates.items() if k <= known}
    sim = replay(
        cluster,
        schedule,
        boot_delay_s=boot_delay,
        step_rates=step_rates or None,
        set_rates=set_rates or None,
        checkpoint_cost_s=got.checkpoint_cost_s,
        startup_s=got.startup_s,
        rejoin_s=got.rejoin_s,
        notice_s=notice_s,
        teardown_s=got.teardown_s,
    )
    return {
        "job_id": job.id,
        "spec": spec.name,
        "schedule": [{"slot": s, "at_s": at} for s, at in schedule],
        "boot_delay_s": boot_delay,
        "delays": {
            "startup_s": got.startup_s,
            "rejoin_s": got.rejoin_s,
            "notice_s": notice_s,
            "teardown_s": got.teardown_s,
            "checkpoint_cost_s": sim_checkpoint_cost(cluster.checkpoint_cost_s, got.checkpoint_cost_s),
        },
        "step_rates": step_rates,
        "set_rates": dict(sorted((",".join(sorted(k)), v) for k, v in set_rates.items())),
        "measured": _measured(session, job, instances, t0, len(schedule), got),
        "simulated": _result_dict(sim),
        "events": [{"t": e.t, "kind": e.kind, "slot": e.slot, "detail": e.detail} for e in sim.events],
    }


def _recorded_job(session: Session, job_id: str) -> tuple[Job, JobSpec, list[Instance]]:
    """The job, its recorded spec and its instances; a ``UserError`` says why there is nothing to replay."""
    job = queries.get_job(session, job_id)
    if job is None:
        raise UserError(f"no job '{job_id}' in the results DB", hint="see `orchestrator status`")
    try:
        spec = validate_spec(yaml.safe_load(job.spec_yaml), source=f"job {job.id}")
    except SpecError as exc:
        raise UserError(f"job {job.id}'s recorded spec no longer validates: {exc}") from None
    instances = queries.job_instances(session, job.id)
    if not instances:
        raise UserError(f"job {job.id} has no recorded instances; nothing to replay")
    return job, spec, instances


def _revocations(instances: Sequence[Instance], t0: float) -> tuple[list[tuple[str, float]], float]:
    """Each revoked instance's slot at its revocation (seconds after ``t0``), and the median notice."""
    schedule: list[tuple[str, float]] = []
    notices: list[float] = []
    for inst in instances:
        revoked = inst.revoked_at is not None or (inst.end_reason or "") in REVOKED_REASONS
        if revoked:
            at = inst.revoked_at if inst.revoked_at is not None else inst.deleted_at
            if at is not None:
                schedule.append((inst.slot, at - t0))
                if inst.deleted_at is not None:
                    notices.append(inst.deleted_at - at)
    schedule.sort(key=lambda x: x[1])
    return schedule, max(0.0, statistics.median(notices)) if notices else 0.0


def _boot_delay(spec: JobSpec, instances: Sequence[Instance]) -> float:
    """The median measured boot; without one, the provider's (local: scaled) boot delay."""
    boots = [i.ready_at - i.requested_at for i in instances if i.ready_at is not None]
    if boots:
        return statistics.median(boots)
    if (local := spec.provider.as_local()) is not None:
        return local_boot_delay_s(local, load_catalog().facts)
    return timings.BOOT_S


def _measured(
    session: Session, job: Job, instances: Sequence[Instance], t0: float, revocations: int, got: Measured
) -> dict[str, Any]:
    cost = queries.job_cost(session, job.id)
    return {
        "wall_time_s": (job.ended_at - t0) if job.ended_at is not None else None,
        "cost_usd": cost.get("total", 0.0),
        "cost_by_role_usd": {
            "ps": cost.get("ps", 0.0),
            "chief": cost.get("chief", 0.0),
            "workers": cost.get("worker", cost.get("workers", 0.0)),
        },
        "revocations": revocations,
        "replacements": sum(1 for i in instances if i.generation > 0),
        "steps_done": job.final_step,
        "first_step_at_s": got.first_step_at,
        "last_step_at_s": got.last_step_at,
        "status": job.outcome or job.status,
    }


def sim_checkpoint_cost(default: float, measured: float | None) -> float:
    return default if measured is None else measured
