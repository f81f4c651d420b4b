"""Security of the control plane's own files and processes: a payload gets an explicitly built environment
(never the controller's credentials or DB URL), and the SQLite DB and the home are readable by their
owner only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from e2e_helpers import wait_until
from sqlalchemy import text

from orchestrator.model.instances import ProcState
from orchestrator.model.paths import user_dir
from orchestrator.store.db import default_url, get_engine, session_factory
from orchestrator.transport.base import Endpoint
from orchestrator.transport.local import LocalTransport


def test_a_local_payload_gets_only_what_it_needs_from_the_controllers_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/secret/controller-key.json")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "controller-secret")
    monkeypatch.setenv("ORCHESTRATOR_DB_URL", "postgresql://orch:password@db/orch")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    t = LocalTransport()
    ep = Endpoint(workdir=str(tmp_path / "disk"))
    (tmp_path / "disk").mkdir()
    t.start(ep, "probe", ["/bin/sh", "-c", "env"], {"JOB_SETTING": "from the spec"})
    wait_until(lambda: t.status(ep, ["probe"])["probe"].state == ProcState.EXITED, timeout=20, interval=0.1)
    env = dict(line.split("=", 1) for line in t.read_log(ep, "probe").decode().splitlines() if "=" in line)
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert "ORCHESTRATOR_DB_URL" not in env
    assert env["JOB_SETTING"] == "from the spec" and env["OMP_NUM_THREADS"] == "2" and "PATH" in env


def test_the_sqlite_db_and_the_home_are_owner_only() -> None:
    home = user_dir()
    home.chmod(0o755)
    url = default_url()
    with session_factory(url)() as session:
        session.execute(text("SELECT COUNT(*) FROM jobs"))
    get_engine(url).dispose()
    with session_factory(url)() as session:  # a new connection re-checks
        session.execute(text("SELECT 1"))
    db = Path(url.removeprefix("sqlite:///"))
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
