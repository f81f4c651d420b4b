"""Migrations and the status/ledger rules, on a real SQLite file and a real PostgreSQL server."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from alembic import command
from orchestrator.model.status import INSTANCE_TRANSITIONS, InstanceStatus, JobStatus, TransitionError
from orchestrator.store import db, queries
from orchestrator.store.models import Event, Instance, Job, LedgerEntry


def test_migrations_round_trip_and_match_models(db_url: str) -> None:
    db.upgrade(db_url)
    assert db.current_revision(db_url) == db.head_revision()
    command.check(db.alembic_config(db_url))  # models == migrations
    db.downgrade(db_url, "base")
    assert db.current_revision(db_url) is None
    db.upgrade(db_url)
    with db.get_engine(db_url).connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM job_summary")).scalar() == 0
        assert conn.execute(text("SELECT COUNT(*) FROM instance_costs")).scalar() == 0


def _job(session: Session, now: float = 1000.0) -> Job:
    job = Job(id="demo-abc123", name="demo", provider="local", mode="async", cluster_shape="1ps+chief+1xk80",
              spec_yaml="name: demo\ntraining: {hparam_set: resnet_tiny}\n", storage_uri="/tmp/x", price_book="2019-02",
              status=JobStatus.PENDING.value, train_steps=100, created_at=now, updated_at=now, restarts=0,
              metrics_offset=0, cancel_requested=False)
    session.add(job)
    session.flush()
    return job


def _instance(session: Session, job: Job, role: str, index: int, price: float, now: float, gen: int = 0) -> Instance:
    inst = Instance(job_id=job.id, name=f"{job.id}-{role}-{index}-{gen}", role=role, slot_index=index, generation=gen,
                    gpu="k80" if role == "worker" else None, machine_type="local", zone="local", spot=role == "worker",
                    price_per_hour=price, status=InstanceStatus.REQUESTED.value, requested_at=now, updated_at=now)
    session.add(inst)
    session.flush()
    return inst


def test_switch_status_writes_events_and_rejects_bad_transitions(db_url: str) -> None:
    with db.open_session(db_url) as session:
        job = _job(session)
        assert queries.switch_status(session, job, JobStatus.PROVISIONING, "launch", now=1001)
        assert not queries.switch_status(session, job, JobStatus.PROVISIONING, "again", now=1002)  # idempotent
        with pytest.raises(TransitionError, match="provisioning -> succeeded"):
            queries.switch_status(session, job, JobStatus.SUCCEEDED, "skip teardown")
        inst = _instance(session, job, "worker", 0, 0.256, 1001)
        for status in (InstanceStatus.PROVISIONING, InstanceStatus.READY, InstanceStatus.TRAINING,
                       InstanceStatus.REVOKED, InstanceStatus.DELETING, InstanceStatus.DELETED):
            queries.switch_status(session, inst, status, "test", now=1100)
        with pytest.raises(TransitionError):
            queries.switch_status(session, inst, InstanceStatus.TRAINING)
        evs = session.query(Event).filter_by(job_id=job.id).all()
        assert [e.to_status for e in evs if e.entity == "instance"] == [
            "provisioning", "ready", "training", "revoked", "deleting", "deleted"]
        assert job.started_at == 1001 and inst.revoked_at == 1100


def test_every_status_can_reach_deleted() -> None:
    # No instance may get stuck somewhere it cannot be deleted from (that would leak a paid VM).
    for start in InstanceStatus:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in INSTANCE_TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert InstanceStatus.DELETED in seen, start


def test_ledger_is_exact_and_summed_per_job(db_url: str) -> None:
    with db.open_session(db_url) as session:
        job = _job(session)
        queries.switch_status(session, job, JobStatus.PROVISIONING, "launch", now=1000)
        spans = [("ps", 0, 0.143, 1000.0, 4600.0), ("chief", 0, 0.143, 1000.0, 4600.0),
                 ("worker", 0, 0.256, 1000.0, 2800.0), ("worker", 1, 0.551, 1010.0, 4600.5)]
        for role, idx, price, start, end in spans:
            inst = _instance(session, job, role, idx, price, start)
            queries.switch_status(session, inst, InstanceStatus.DELETING, "done", now=end - 1)
            queries.switch_status(session, inst, InstanceStatus.DELETED, "done", now=end)
        queries.switch_status(session, job, JobStatus.TEARING_DOWN, "finished", now=4600)
        queries.switch_status(session, job, JobStatus.SUCCEEDED, "finished", now=4601)
    with db.open_session(db_url) as session:
        entries = session.query(LedgerEntry).all()
        expected = {role + str(idx): (end - start) * price / 3600 for role, idx, price, start, end in spans}
        for e in entries:
            inst = session.get(Instance, e.instance_id)
            assert inst is not None and inst.deleted_at is not None
            assert e.usd == pytest.approx((inst.deleted_at - inst.requested_at) * inst.price_per_hour / 3600, abs=1e-12)
            assert e.usd == pytest.approx(expected[inst.role + str(inst.slot_index)])
        cost = queries.job_cost(session, "demo-abc123")
        assert cost["total"] == pytest.approx(sum(expected.values()))
        assert cost["worker"] == pytest.approx(expected["worker0"] + expected["worker1"])
        (summary,) = queries.job_summaries(session)
        assert summary["cost_usd"] == pytest.approx(sum(expected.values()))
        assert summary["wall_time_s"] == pytest.approx(3601)
        assert summary["status"] == "succeeded"


def test_open_ledger_counts_up_to_now(db_url: str) -> None:
    import time

    with db.open_session(db_url) as session:
        job = _job(session)
        _instance(session, job, "worker", 0, 3600.0, time.time() - 10)  # $1 per second
        cost = queries.job_cost(session, job.id)["total"]
        assert 9 <= cost <= 15
