"""Issue 21 item 4: migrations under a PostgreSQL advisory lock; the orchestrator home is 0700 whatever the DB.

Three processes (three daemons starting together) upgrade one fresh database at the same instant: without
the lock each creates ``alembic_version`` and the tables, and all but one die on a UniqueViolation.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.model.paths import user_dir
from orchestrator.store.db import current_revision, head_revision

REPO = Path(__file__).resolve().parent.parent  # the checkout (tests/jobs has a conftest of its own)

# Each process imports everything first, then waits for the same instant: the upgrades overlap.
_UPGRADER = """
import sys, time
from orchestrator.store.db import upgrade
go = float(sys.argv[2])
time.sleep(max(0.0, go - time.time()))
upgrade(sys.argv[1])
"""


def test_three_processes_migrating_one_fresh_postgresql_at_once(own_pg: str) -> None:
    _race(own_pg)


def test_three_processes_migrating_one_fresh_sqlite_file_at_once(tmp_path: Path) -> None:
    # Two CLIs started at once on a new results DB: the SQLite driver runs DDL outside a transaction, so
    # without the file lock both create the tables and one fails with "table ... already exists".
    _race(f"sqlite:///{tmp_path}/fresh.db")


def _race(url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    go = time.time() + 6.0  # after the imports (seconds on a loaded 2-core machine)
    procs = [subprocess.Popen([sys.executable, "-c", _UPGRADER, url, str(go)], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        results.append((proc.returncode, next((line[:200] for line in reversed(err.splitlines())
                                               if "Error" in line), "")))
    assert time.time() > go, "the processes started late: the race was not run"
    assert all(code == 0 for code, _ in results), results
    assert current_revision(url) == head_revision()


def test_home_is_owner_only_whatever_the_db_url(tmp_path: Path, sqlite_url: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_DB_URL", sqlite_url)  # the DB lives elsewhere
    old = tmp_path / "made-before"
    old.mkdir()
    old.chmod(0o755)  # as a 022 umask made it
    for home in (old, tmp_path / "fresh" / "home"):
        monkeypatch.setenv("ORCHESTRATOR_HOME", str(home))
        assert user_dir() == home
        assert stat.S_IMODE(home.stat().st_mode) == 0o700, home
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a /tmp-like folder given as the home is left as it is
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(shared))
    user_dir()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
