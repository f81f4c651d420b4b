"""A spec is planned once (costmodel/launch_plan.py) and the plan is stored at launch (table intents, migration 0003):
every pass drives toward the stored plan; a job recorded before 0003 is planned once on its next pass."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from test_control_poison import local_spec

from orchestrator.control.driver import run_pass, spec_to_yaml
from orchestrator.control.launcher import cancel_job, create_job
from orchestrator.costmodel.launch_plan import PLAN_VERSION, LaunchPlan, PlanFormatError, plan_spec
from orchestrator.costmodel.slots import expand
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import JobSpec, load_spec, validate_spec
from orchestrator.model.status import JobStatus
from orchestrator.store import db, queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Instance, Intent, Job

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _spec(tmp_path: Path, command: str = "sleep 600") -> JobSpec:
    return validate_spec(yaml.safe_load(local_spec("intent", tmp_path / "runs", command)))


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_a_plan_is_the_expansion_and_survives_its_json(example: str) -> None:
    spec = load_spec(EXAMPLES / example)
    if spec.cluster is None:
        pytest.skip("the planner chooses this cluster")
    plan = plan_spec(spec)
    assert list(plan.slots) == expand(spec)
    assert LaunchPlan.from_json(plan.to_json()) == plan
    assert plan.cluster_usd_per_hour == pytest.approx(sum(s.price_per_hour for s in expand(spec)))


def test_a_plan_of_another_version_is_refused_clearly(tmp_path: Path) -> None:
    text = plan_spec(_spec(tmp_path)).to_json().replace(f'"version": {PLAN_VERSION}', '"version": 999')
    with pytest.raises(PlanFormatError, match="version 999"):
        LaunchPlan.from_json(text)


def test_the_launch_stores_its_plan_and_the_passes_drive_toward_it(tmp_path: Path) -> None:
    """The stored price (not today's catalog) is what the created instance is billed at."""
    user_dir()
    spec = _spec(tmp_path)
    plan = plan_spec(spec)
    stored = dataclasses.replace(plan, slots=tuple(dataclasses.replace(s, price_per_hour=0.4321)
                                                   for s in plan.slots))
    with open_session() as session:
        job_id = create_job(session, spec, stored).id
        assert queries.stored_intent(session, job_id) == stored
        run_pass(session, "test", [job_id])
        session.expire_all()
        prices = {i.price_per_hour for i in session.scalars(select(Instance).where(Instance.job_id == job_id))}
        assert prices == {0.4321}
    assert cancel_job(job_id, wait_s=30).status == JobStatus.CANCELLED.value


def _legacy_job(session: Session, spec: JobSpec) -> str:
    """A job row as a controller before migration 0003 recorded it: no stored plan."""
    now = time.time()
    job = Job(id="legacy-abc123", name=spec.name, provider="local", mode=spec.mode.value, cluster_shape="1xk80",
              spec_yaml=spec_to_yaml(spec), storage_uri=str(spec.storage), price_book=spec.pricing.book,
              status=JobStatus.PENDING.value, train_steps=10, created_at=now, updated_at=now, restarts=0,
              metrics_offset=0, cancel_requested=False)
    session.add(job)
    session.commit()
    return job.id


def test_migration_0003_up_and_down_and_a_job_from_before_it_is_planned_once(db_url: str, tmp_path: Path) -> None:
    db.upgrade(db_url, "0002")
    spec = _spec(tmp_path)
    with Session(db.get_engine(db_url)) as session:  # the 0002 schema: no intents table yet
        session.execute(Job.__table__.insert().values(  # type: ignore[attr-defined]
            id="legacy-abc123", name=spec.name, provider="local", mode=spec.mode.value, cluster_shape="1xk80",
            spec_yaml=spec_to_yaml(spec), storage_uri=str(spec.storage), price_book=spec.pricing.book,
            status=JobStatus.PENDING.value, train_steps=10, created_at=1.0, updated_at=1.0, restarts=0,
            metrics_offset=0, cancel_requested=False))
        session.commit()
    db.upgrade(db_url)
    assert db.current_revision(db_url) == db.head_revision()  # 0003 and whatever came after it
    with Session(db.get_engine(db_url)) as session:
        job = session.get(Job, "legacy-abc123")
        assert job is not None and queries.stored_intent(session, job.id) is None
        first = queries.job_plan(session, job, spec)  # planned once, with the recorded price book, and stored
        assert first == plan_spec(spec, book=job.price_book)
        assert queries.job_plan(session, job, spec) == first
        assert session.scalars(select(Intent.revision).where(Intent.job_id == job.id)).all() == [1]
    db.downgrade(db_url, "0002")
    assert db.current_revision(db_url) == "0002"
    with Session(db.get_engine(db_url)) as session:  # the job survives the downgrade; its plan goes
        assert session.scalar(select(Job.id)) == "legacy-abc123"
    db.upgrade(db_url)


def test_a_new_revision_is_the_plan_in_force(tmp_path: Path) -> None:
    user_dir()
    spec = _spec(tmp_path)
    with open_session() as session:
        job_id = _legacy_job(session, spec)
        plan = plan_spec(spec)
        assert queries.save_intent(session, job_id, plan) == 1
        cheaper = dataclasses.replace(plan, slots=tuple(dataclasses.replace(s, price_per_hour=0.01)
                                                        for s in plan.slots))
        assert queries.save_intent(session, job_id, cheaper) == 2
        assert queries.stored_intent(session, job_id) == cheaper
