"""A finished job's rows, written through the store API (statuses, events and ledger as the controller writes them)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from orchestrator.model.status import InstanceStatus as S
from orchestrator.model.status import JobStatus as J
from orchestrator.store import queries
from orchestrator.store.models import Instance, Job, Metric

SPEC = """name: obs
provider: {{kind: local, time_scale: 60, revocations: none}}
storage: {storage}
training: {{job: resnet-cifar, hparam_set: resnet_tiny, mode: async, train_steps: 200, batch_per_worker: 32}}
cluster:
  parameter_servers: {{count: 1}}
  workers:
    - {{gpu: k80, count: 1, spot: true}}
    - {{gpu: v100, count: 1, spot: false}}
policy: {{on_revocation: replace, budget_usd: 5}}
pricing: {{book: 2019-02}}
"""


def _instance(session: Session, job: Job, role: str, index: int, gen: int, gpu: str | None, spot: bool,
              price: float, at: float) -> Instance:
    inst = Instance(job_id=job.id, name=f"{job.id}-{role}-{index}-{gen}", role=role, slot_index=index,
                    generation=gen, gpu=gpu, machine_type="local", zone="local", spot=spot, price_per_hour=price,
                    status=S.REQUESTED.value, requested_at=at, updated_at=at)
    session.add(inst)
    session.flush()
    for st in (S.PROVISIONING, S.READY, S.TRAINING):
        at += 1.0
        queries.switch_status(session, inst, st, f"to {st.value}", now=at)
    return inst


def finished_job(session: Session, storage: Path, t0: float = 1_700_000_000.0) -> str:
    """A succeeded async job: ps, chief, a spot k80 worker revoked at t0+40 and replaced, a v100 worker."""
    job = Job(id="obs-abc123", name="obs", provider="local", mode="async", cluster_shape="1ps+chief+1xk80(spot)+1xv100",
              spec_yaml=SPEC.format(storage=storage), storage_uri=str(storage), price_book="2019-02",
              status=J.PENDING.value, train_steps=200, budget_usd=5.0, restarts=0, metrics_offset=0,
              cancel_requested=False, created_at=t0, updated_at=t0)
    session.add(job)
    session.flush()
    queries.switch_status(session, job, J.PROVISIONING, "launch", now=t0)
    ps = _instance(session, job, "ps", 0, 0, None, False, 0.05, t0)
    chief = _instance(session, job, "chief", 0, 0, None, False, 0.05, t0)
    k80 = _instance(session, job, "worker", 0, 0, "k80", True, 0.3, t0)
    v100 = _instance(session, job, "worker", 1, 0, "v100", False, 2.5, t0)
    queries.switch_status(session, job, J.RUNNING, "every task is training", now=t0 + 5)
    for step in range(10, 201, 10):
        at = t0 + 5 + step / 2
        session.add(Metric(job_id=job.id, kind="step", worker=-1, step=step, loss=2.0 - step / 200,
                           examples_per_s=300.0, at=at))
        session.add(Metric(job_id=job.id, kind="worker", worker=0, gpu="k80", batch=32, step=step,
                           examples_per_s=100.0, step_time_s=0.3, at=at))
        if step % 100 == 0:
            session.add(Metric(job_id=job.id, kind="checkpoint", worker=-1, step=step, step_time_s=0.5, at=at + 0.2))
    session.add(Metric(job_id=job.id, kind="eval", worker=-1, step=200, loss=0.5, accuracy=0.875, at=t0 + 106))
    k80.end_reason = "preempted"
    queries.note(session, job.id, "checkpoint", "checkpoint at step 72 after a preemption notice", now=t0 + 40.5)
    queries.switch_status(session, k80, S.REVOKED, "preemption notice", now=t0 + 41)
    queries.switch_status(session, job, J.RECOVERING, f"{k80.name} revoked", now=t0 + 41)
    k80b = _instance(session, job, "worker", 0, 1, "k80", True, 0.3, t0 + 41.2)
    queries.switch_status(session, k80, S.DELETING, "clean up revoked instance", now=t0 + 42)
    queries.switch_status(session, k80, S.DELETED, "deleted", now=t0 + 42.5)
    queries.switch_status(session, job, J.RUNNING, "recovered", now=t0 + 45)
    queries.switch_status(session, job, J.TEARING_DOWN, "training finished at step 200", now=t0 + 107)
    for inst in (ps, chief, v100, k80b):
        inst.end_reason = "job_finished"
        queries.switch_status(session, inst, S.DELETING, "job succeeded: tear down", now=t0 + 108)
        queries.switch_status(session, inst, S.DELETED, "deleted", now=t0 + 109)
    job.accuracy, job.final_step, job.final_loss = 0.875, 200, 0.5
    queries.switch_status(session, job, J.SUCCEEDED, "every instance deleted", now=t0 + 110)
    session.commit()
    return job.id
