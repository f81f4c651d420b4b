"""`kill -TERM` of a foreground launch is handled like Ctrl-C: the job is cancelled, no instance is left
running, and the launch exits non-zero, saying whether it tore down itself or handed over to a daemon. The
same holds for a bench that launches jobs (orchestrator_testing/teardown.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import REPO, processes_under, wait_until
from sqlalchemy import create_engine, text
from test_control_poison import local_spec

from orchestrator_testing.processes import stop


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ORCHESTRATOR_HOME": str(tmp_path / "home"),
            "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/results.db"}


def _training(db_url: str) -> bool:
    try:
        with create_engine(db_url).connect() as conn:
            return conn.execute(text("SELECT COUNT(*) FROM instances WHERE status = 'training'")).scalar() == 2
    except Exception:  # noqa: BLE001 - the DB may not exist yet
        return False


def _launch(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    spec = tmp_path / "job.yaml"
    spec.write_text(local_spec("term", tmp_path / "runs", "sleep 600").replace("count: 1", "count: 2"))
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "launch", str(spec), "--quiet"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _rows(db_url: str) -> tuple[str, list[str]]:
    with create_engine(db_url).connect() as conn:
        status = conn.execute(text("SELECT status FROM jobs")).scalar_one()
        instances = [r[0] for r in conn.execute(text("SELECT status FROM instances"))]
    return status, instances


def test_sigterm_tears_down_the_foreground_launch_and_exits_non_zero(tmp_path: Path) -> None:
    env = _env(tmp_path)
    proc = _launch(tmp_path, env)
    wait_until(lambda: _training(env["ORCHESTRATOR_DB_URL"]), timeout=120)
    assert len(processes_under(tmp_path)) >= 2  # the instances and their tasks
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    assert "SIGTERM: cancelling: tearing down every instance here" in out and "Traceback" not in out
    status, instances = _rows(env["ORCHESTRATOR_DB_URL"])
    assert status == "cancelled" and set(instances) == {"deleted"}, (status, instances)
    wait_until(lambda: processes_under(tmp_path) == [], timeout=20)


def test_sigterm_hands_over_to_a_running_daemon(tmp_path: Path) -> None:
    env = _env(tmp_path)
    proc = _launch(tmp_path, env)
    wait_until(lambda: _training(env["ORCHESTRATOR_DB_URL"]), timeout=120)
    daemon = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "daemon", "--interval", "0.3"],
                              env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (tmp_path / "results.db.daemon-lock").exists(), timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, out
        assert "handed over" in out and "Traceback" not in out
        wait_until(lambda: _rows(env["ORCHESTRATOR_DB_URL"])[0] == "cancelled", timeout=120)
        assert set(_rows(env["ORCHESTRATOR_DB_URL"])[1]) == {"deleted"}
    finally:
        stop(daemon)
        stop(proc)  # a launch that failed an assertion above
    wait_until(lambda: processes_under(tmp_path) == [], timeout=20)


def _instance_up(db_url: str) -> bool:
    try:
        with create_engine(db_url).connect() as conn:
            return bool(conn.execute(text("SELECT COUNT(*) FROM instances WHERE status IN ('ready', 'training')"))
                        .scalar())
    except Exception:  # noqa: BLE001 - the DB appears with the bench's launch
        return False


@pytest.mark.slow
def test_sigterm_of_a_bench_that_launches_leaves_nothing_running(tmp_path: Path) -> None:
    # bench/recovery.py drives a real TensorFlow job through a foreground launch it started; `kill -TERM`
    # of the bench (not of the launch) must still end with every instance deleted.
    work = tmp_path / "bench"
    db_url = f"sqlite:///{work}/r.db"
    bench = subprocess.Popen([sys.executable, "bench/recovery.py", "--revocations", "2", "--work", str(work)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: _instance_up(db_url), timeout=180)
        assert processes_under(work), "the launch and its instances run"
        bench.send_signal(signal.SIGTERM)
        out, _ = bench.communicate(timeout=180)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 143, out
    assert "SIGTERM: bench stopped; no instance left running" in out and "Traceback" not in out, out
    status, instances = _rows(db_url)
    assert status == "cancelled" and set(instances) == {"deleted"}, (status, instances)
    assert not list((work / "home" / "local" / "instances").glob("*/instance.json"))
    wait_until(lambda: processes_under(work) == [], timeout=20)


def test_sigterm_stops_the_daemon_with_its_last_line_logged(tmp_path: Path) -> None:
    """A daemon stopped by `kill` (systemd, `timeout`) says so and exits cleanly; its jobs wait for the next one."""
    env = _env(tmp_path)
    daemon = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "daemon", "--interval", "0.3"],
                              env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: (tmp_path / "results.db.daemon-lock").exists(), timeout=60)
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=60)
        assert daemon.returncode == 0, out
        assert "daemon stopped; jobs continue when it starts again" in out and "Traceback" not in out
    finally:
        stop(daemon)
