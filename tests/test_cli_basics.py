"""The CLI as a user meets it: help, catalog, dry runs, broken specs (exit 2), db upgrade + SQL views."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tenacity.nap

from orchestrator.store.db import head_revision
from tests.cli_inproc import run_cli

REPO = Path(__file__).resolve().parent.parent
VERBS = ["launch", "plan", "status", "logs", "cancel", "report", "simulate", "daemon", "db", "catalog", "model", "gc"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=120)


def run_here(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``run`` in this interpreter, as a fresh process would start (tests/cli_inproc.py): no start-up to pay."""
    return run_cli(args, {**os.environ, "COLUMNS": "200", **(env or {})}, REPO)


def test_help_lists_every_verb() -> None:
    out = run("--help")
    assert out.returncode == 0
    for verb in VERBS:
        assert verb in out.stdout, verb


def test_catalog_prints_prices_and_sources() -> None:
    out = run("catalog", "--price-book", "2019-02")
    assert out.returncode == 0, out.stderr
    assert "nvidia-tesla-k80" in out.stdout and "0.256" in out.stdout and "ICAC" in out.stdout
    out = run("catalog", "--gpu", "v200")
    assert out.returncode == 2 and "known: k80" in out.stderr


EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))
CONSOLE_SCRIPT_EXAMPLES = {"local-pipeline.yaml", "gce-l4x4-spot.yaml", "reproduce-icac19.yaml"}  # one of each answer


@pytest.mark.parametrize("example", EXAMPLES)
def test_dry_run_every_example(example: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The console script for one example of each kind; the rest in this interpreter (a GCE dry run's fresh
    # interpreter spends 6-7 s importing google.cloud.compute_v1 before its few milliseconds of work).
    launch = run if example in CONSOLE_SCRIPT_EXAMPLES else run_here
    if launch is run_here:
        # Without network the quota read of the example's project fails and is retried 5 times, 5-10 s of
        # pauses in all; what it prints ("... retrying in 0.78s") and the outcome are the same without them.
        monkeypatch.setattr(tenacity.nap, "time", SimpleNamespace(sleep=lambda _s: None))
    # The dry run reads the secrets a launch would (local-own-script.yaml names DEMO_TOKEN), as its comment says.
    out = launch("launch", "--dry-run", f"examples/{example}", env={"ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/x.db",
                                                                    "DEMO_TOKEN": "s3cr3t"})
    refused = {"reproduce-icac19.yaml": "past the deadline"}  # 20.6 h of emulated K80s: plan refuses it too
    if example in refused:
        assert out.returncode == 2 and refused[example] in out.stderr, out.stderr
        assert not (tmp_path / "x.db").exists()
        return
    assert out.returncode == 0, out.stderr
    if example.startswith("gce-"):  # the Compute API requests it would send, as JSON (tests/test_examples_dry_run.py)
        assert json.loads(out.stdout)["requests_sent"] == 0
    else:
        assert "would create" in out.stdout and "/h" in out.stdout
    assert not (tmp_path / "x.db").exists()  # a dry run creates nothing, not even a DB row


def test_broken_spec_exits_2_with_field_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad_Name\ncluster:\n  workers:\n    - {gpu: v200, count: 0}\npolicy: {on_revocation: pray}\n")
    out = run("launch", str(bad))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "cluster.workers[0].gpu: 'v200' is not a GPU type" in out.stderr or "cluster.workers[0].count" in out.stderr
    assert "name: 'Bad_Name' is not a valid job name" in out.stderr
    assert "policy.on_revocation" in out.stderr and "nothing was created" in out.stderr


def test_db_upgrade_creates_schema_and_views(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    out = run("db", "upgrade", env={"ORCHESTRATOR_DB_URL": f"sqlite:////{path}"})
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(path) as conn:
        assert conn.execute("select * from job_summary").fetchall() == []
        assert conn.execute("select * from instance_costs").fetchall() == []
    out = run("db", "current", env={"ORCHESTRATOR_DB_URL": f"sqlite:////{path}"})
    assert f"current:  {head_revision()}" in out.stdout  # the newest migration (alembic/versions)
    assert head_revision() >= "0004"


def test_status_on_empty_db(tmp_path: Path) -> None:
    out = run("--db", f"sqlite:///{tmp_path}/y.db", "status")
    assert out.returncode == 0, out.stderr
    assert "jobs" in out.stdout


def test_launch_refuses_a_cluster_over_budget_before_creating_anything(tmp_path: Path) -> None:
    spec = tmp_path / "big.yaml"
    spec.write_text("name: over-budget\nprovider: {kind: gce, project: my-project-1, zones: [us-central1-a]}\n"
                    "storage: gs://my-bucket/p\ntraining: {hparam_set: resnet_cifar_56, train_steps: 640000}\n"
                    "cluster:\n  workers: [{gpu: v100, count: 8, spot: false, zone: us-central1-a}]\n"
                    "policy: {budget_usd: 1}\n")
    out = run("launch", str(spec), env={"ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/x.db"})
    assert out.returncode == 2 and "policy.budget_usd" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "x.db").exists()
