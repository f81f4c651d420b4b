"""High availability: on PostgreSQL, daemons share the jobs through per-job leases claimed with
SELECT ... FOR UPDATE SKIP LOCKED, and a driver that lost its lease can change nothing. On SQLite, a
second daemon is refused with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, wait_until
from sqlalchemy import text
from sqlalchemy.orm import Session
from test_control_poison import local_spec

from orchestrator.control.launcher import create_job
from orchestrator.control.lease import LeaseLost, claim, guarded
from orchestrator.model.spec import validate_spec
from orchestrator.store import queries
from orchestrator.store.db import get_engine, session_factory
from orchestrator.store.models import Job
from orchestrator_testing.processes import stop


def test_claims_skip_locked_rows_and_a_driver_that_lost_its_lease_changes_nothing(own_pg: str,
                                                                                   tmp_path: Path) -> None:
    make = session_factory(own_pg)
    with make() as setup:
        job_id = create_job(setup, validate_spec(yaml.safe_load(local_spec("ha", tmp_path / "runs", "true")))).id
    a, b = make(), make()
    (mine,) = claim(a, "daemon-a", None, time.time())
    token_a = mine.lease_token
    assert token_a and claim(b, "daemon-b", None, time.time()) == []  # a holds the lease

    with get_engine(own_pg).connect() as other:  # a's lease expires while a third party locks the row
        other.execute(text("UPDATE jobs SET lease_until = 0"))
        other.commit()
        other.execute(text("SELECT id FROM jobs FOR UPDATE"))
        started = time.monotonic()
        assert claim(b, "daemon-b", None, time.time()) == []  # skipped, not waited for
        waited = time.monotonic() - started
        other.rollback()
    (taken,) = claim(b, "daemon-b", None, time.time())
    assert taken.lease_owner == "daemon-b" and taken.lease_token not in (None, token_a)

    stale = a.get(Job, job_id)
    assert stale is not None
    with guarded(a, job_id, token_a), pytest.raises(LeaseLost):
        stale.status_reason = "written by a driver that lost its lease"
        queries.note(a, job_id, "stale", "must not be written")
        a.commit()
    a.rollback()
    with Session(get_engine(own_pg)) as check:
        row = check.get(Job, job_id)
        assert row is not None and row.status_reason != "written by a driver that lost its lease"
        assert not [e for e in queries.events(check, job_id) if e.to_status == "stale"]
        assert [e for e in queries.events(check, job_id) if e.to_status == "driver" and "daemon-b" in (e.reason or "")]
    with guarded(b, job_id, taken.lease_token):  # the holder writes as usual
        taken.status_reason = "written by the holder"
        b.commit()
    a.close()
    b.close()
    print(f"\nclaim over a row locked by another transaction returned in {waited * 1000:.1f} ms (skipped)")


def test_a_second_daemon_on_sqlite_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp_path / "home"),
           "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/results.db"}
    argv = [sys.executable, "-m", "orchestrator.cli.main", "daemon", "--interval", "1"]
    first = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (tmp_path / "results.db.daemon-lock").exists(), timeout=60)
        second = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert second.returncode != 0
        message = second.stdout + second.stderr
        assert "SQLite takes one daemon" in message and "PostgreSQL" in message and "Traceback" not in message
        assert first.poll() is None  # the first one is untouched
    finally:
        stop(first)
