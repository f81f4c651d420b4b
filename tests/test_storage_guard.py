"""Issue 56 items 2 and 6: a job's storage never reaches the system's folders, the results DB or the home's own
files; a storage that cannot be opened or written ends the job with its reason (no backoff loop, no "restarted
8 times"); a read-only DB is one log line a pass.

Real parts: the real CLI (in this interpreter, tests/cli_inproc.py), a real SQLite file, real local instances and
processes, a real 64 KiB tmpfs filled by the job itself, a real PostgreSQL database switched read-only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, processes_under, wait_until
from sqlalchemy import create_engine, text
from test_control_poison import local_spec

from orchestrator.control.driver import run_pass
from orchestrator.control.launcher import create_job
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import validate_spec
from orchestrator.model.status import FINAL_JOB, JobStatus
from orchestrator.storage.local import storage_problem
from orchestrator.store import queries
from orchestrator.store.db import open_session, upgrade
from orchestrator.store.models import Job
from orchestrator_testing.processes import stop
from tests.cli_inproc import run_cli

VERBS = (("plan",), ("launch", "--dry-run"), ("launch", "--detach"))  # --detach: a launch's checks, up to the row


def _env(tmp_path: Path) -> dict[str, str]:
    return {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": "sqlite:///db.sqlite",
            "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "COLUMNS": "200"}


def _tree(*roots: Path) -> set[str]:
    return {str(p) for root in roots for p in (root.rglob("*") if root != Path("/") else root.iterdir())}


# (storage as the spec gives it, what the case is). Relative paths are taken from the spec's working directory.
REFUSED = [
    ("/etc", "a system folder (as root a launch wrote /etc/<job>/...)"),
    ("/", "the root folder"),
    ("/usr/lib", "inside a system tree"),
    ("./etc-link/runs", "a symlink to /etc"),
    ("./db.sqlite", "the SQLite file the launch would create"),
    ("./db.sqlite-wal", "the DB's write-ahead log"),
    ("./home", "the orchestrator's home itself"),
    ("./home/keys/runs", "inside the home's SSH keys"),
    ("./home/local", "the local provider's instances"),
    ("/tmp", "a shared folder itself"),
]


@pytest.mark.parametrize(("storage", "what"), REFUSED, ids=[s for s, _ in REFUSED])
def test_plan_dry_run_and_launch_refuse_the_storage_in_one_line_and_create_nothing(
        tmp_path: Path, storage: str, what: str) -> None:
    (tmp_path / "etc-link").symlink_to("/etc")
    spec = tmp_path / "job.yaml"
    spec.write_text(local_spec("guard", Path(storage), "sleep 1"))
    watched = [tmp_path, Path("/etc")] + ([Path("/")] if storage == "/" else [])
    before = _tree(*watched)
    for verb in VERBS:
        out = run_cli([*verb, str(spec)], _env(tmp_path), tmp_path)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 2, (verb, what, out.stdout[-800:], out.stderr[-800:])
        assert len(lines) == 1 and "error:" in lines[0] and "storage: " in lines[0], (verb, what, out.stderr)
        assert "Traceback" not in out.stdout + out.stderr
    assert _tree(*watched) == before  # no DB, no home, no job folder anywhere
    # A folder of one's own beside it is fine: in the home too (<home>/runs), under /tmp too.
    mine = {"./home": "./home/runs", "/tmp": f"/tmp/guard-{tmp_path.name}"}.get(storage, "./runs")
    spec.write_text(local_spec("guard", Path(mine), "sleep 1"))
    out = run_cli(["launch", "--dry-run", str(spec)], _env(tmp_path), tmp_path)
    assert out.returncode == 0, (mine, out.stderr)


def _drive(job_id: str, passes: int) -> list[Job]:
    """``passes`` reconcile passes (a pass that ends the job ends the loop); the job after each."""
    seen = []
    with open_session() as session:
        for _ in range(passes):
            run_pass(session, "test", [job_id])
            session.expire_all()
            job = session.get(Job, job_id)
            assert job is not None
            seen.append(job)
            if job.status in FINAL_JOB:
                break
            time.sleep(0.1)
    return seen


def _reasons(job_id: str) -> list[str]:
    with open_session() as session:
        return [e.reason or "" for e in queries.events(session, job_id) if e.entity == "job"]


def test_a_job_row_whose_storage_is_the_db_file_fails_in_its_first_pass(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A row recorded before the launch refused it (or by hand): the daemon refuses to write there, at once.
    db = tmp_path / "db.sqlite"
    monkeypatch.setenv("ORCHESTRATOR_DB_URL", f"sqlite:///{db}")
    with open_session() as session:
        job_id = create_job(session, validate_spec(yaml.safe_load(local_spec("dbfile", db, "sleep 30")))).id
    first, *rest = _drive(job_id, 40)
    assert first.status in ("tearing_down", "failed") and first.pass_failures == 0, (first.status, first.last_error)
    assert (rest or [first])[-1].status == JobStatus.FAILED.value
    assert any("results DB's file" in r and str(db) in r for r in _reasons(job_id)), _reasons(job_id)
    assert db.is_file()


def test_a_storage_that_cannot_be_created_fails_the_job_with_its_reason_in_one_pass(tmp_path: Path) -> None:
    user_dir()
    runs = tmp_path / "runs"
    with open_session() as session:
        job_id = create_job(session, validate_spec(yaml.safe_load(local_spec("blocked", runs, "sleep 30")))).id
    runs.write_text("a file where the storage folder goes\n")  # after the launch's check: a file in the way
    first, *rest = _drive(job_id, 40)
    assert first.status in ("tearing_down", "failed") and first.pass_failures == 0, (first.status, first.last_error)
    assert (rest or [first])[-1].status == JobStatus.FAILED.value
    reasons = _reasons(job_id)
    assert any("cannot create the job's folder" in r and "(ENOTDIR)" in r for r in reasons), reasons


def test_every_file_a_real_job_leaves_in_the_home_is_refused_as_storage(tmp_path: Path) -> None:
    # The home's own entries are listed in storage/local.py: a new one the product starts writing fails here.
    home = user_dir()
    with open_session() as session:
        job_id = create_job(session, validate_spec(yaml.safe_load(
            local_spec("home", home / "runs", "echo done; exit 0")))).id
    assert _drive(job_id, 400)[-1].status == JobStatus.SUCCEEDED.value
    entries = sorted(p.name for p in home.iterdir() if p.name != "runs")
    assert {"orchestrator.db", "local"} <= set(entries), entries
    for name in entries:
        assert storage_problem(str(home / name / "runs")) is not None, name
    assert storage_problem(str(home / "runs")) is None
    wait_until(lambda: processes_under(tmp_path) == [], timeout=10)


FILL = """import json, os, sys
storage = json.load(open("task.json"))["storage"]
try:
    with open(os.path.join(storage, "fill.bin"), "wb") as out:
        while True:
            out.write(b"\\0" * 4096)
            out.flush()
except OSError as exc:
    print(f"cannot write a checkpoint: {exc}", file=sys.stderr)
    sys.exit(1)
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB filesystem (tmpfs; needs root, as the CI runs)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a 64 KiB tmpfs ({done.stderr.strip()}); this test needs root (CAP_SYS_ADMIN)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_the_job_naming_enospc_not_after_its_restarts(tmp_path: Path, small_disk: Path) -> None:
    user_dir()
    (tmp_path / "fill.py").write_text(FILL)
    raw = yaml.safe_load(local_spec("full", small_disk / "runs", "x"))
    raw["training"].update(command=f"{sys.executable} fill.py", files=[str(tmp_path / "fill.py")])
    raw["policy"]["max_replacements"] = 3
    with open_session() as session:
        job_id = create_job(session, validate_spec(raw)).id
    final = _drive(job_id, 900)[-1]
    reasons = _reasons(job_id)
    assert final.status == JobStatus.FAILED.value, reasons
    assert any("No space left on device (ENOSPC)" in r and str(small_disk) in r for r in reasons), reasons
    assert final.restarts == 0, reasons  # the first exit, not the last of its restarts
    wait_until(lambda: processes_under(tmp_path) == [], timeout=10)


_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ [\w.]+: ")


def test_a_read_only_db_is_one_log_line_a_pass(tmp_path: Path, own_pg: str) -> None:
    # PostgreSQL's default_transaction_read_only: every new session of the database refuses writes (a replica,
    # a database an operator froze). SQLite as root cannot be made read-only by its file mode.
    env = {**os.environ, "ORCHESTRATOR_DB_URL": own_pg, "ORCHESTRATOR_HOME": str(tmp_path / "home")}
    upgrade(own_pg)
    with open_session(own_pg) as session:
        create_job(session, validate_spec(yaml.safe_load(local_spec("ro", tmp_path / "runs", "sleep 30"))))
    admin = create_engine(own_pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{own_pg.rsplit("/", 1)[1]}" SET default_transaction_read_only = on'))
    admin.dispose()
    log = tmp_path / "daemon.log"
    with log.open("w") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "daemon", "--interval", "0.2"],
                                  env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: log.read_text().count("pass failed") >= 6, timeout=120)
    finally:
        stop(daemon)
    lines = log.read_text().splitlines()
    assert "Traceback" not in log.read_text(), "\n".join(lines[:60])
    assert all(_LOG_LINE.match(line) for line in lines), [line for line in lines if not _LOG_LINE.match(line)][:5]
    failed = [line for line in lines if "pass failed" in line]
    assert all("read-only transaction" in line for line in failed), failed[:3]
    errors = [line for line in lines if " ERROR " in line or " WARNING " in line]
    assert errors == failed, errors[:6]  # one line a pass: the pass's failure, nothing else about it
