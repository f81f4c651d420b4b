"""Provider set-up is checked before a job row is written: a gce launch without credentials, with a malformed
project id, or whose credentials lack a permission is refused with exit 2 and one line naming the fix, and
the results DB (a real SQLite file) has no job row afterwards. Against the Compute API emulator."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from orchestrator.store.db import upgrade
from orchestrator_testing.gce_emulator import GceEmulator

SPEC = """name: setup-check
provider: {{kind: gce, project: {project}, zones: [us-central1-c]{extra}}}
training: {{job: command, command: "sleep 1", mode: sync, train_steps: 10}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: t4, count: 1, spot: true, zone: us-central1-c}}]
"""


@pytest.fixture(scope="module")
def emu() -> Iterator[GceEmulator]:
    emulator = GceEmulator({"boot_delay_s": 0.05, "op_delay_s": 0.01})
    emulator.start()
    yield emulator
    emulator.stop()


def _db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    upgrade(url)
    return url


def _jobs(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT COUNT(*) FROM jobs")).scalar_one())
    finally:
        engine.dispose()


def _launch(tmp_path: Path, spec: str, *args: str,
            verb: tuple[str, ...] = ("launch",)) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.yaml"
    path.write_text(spec)
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    env.update({"COLUMNS": "200", "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path / 'results.db'}",
                "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "HOME": str(tmp_path),
                # Not on GCE: the metadata server (a source of credentials) is an address that refuses.
                "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9"})
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *verb, *args, str(path)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


@pytest.mark.parametrize("endpoint", ["", ', api_endpoint: "https://compute.googleapis.com"'])
@pytest.mark.parametrize("args", [(), ("--dry-run",)])
def test_a_gce_launch_without_credentials_is_refused_and_writes_no_job(tmp_path: Path, args: tuple[str, ...],
                                                                      endpoint: str) -> None:
    url = _db(tmp_path)
    # GCE itself, by default or by a named Google API endpoint: the user's credentials are needed.
    spec = SPEC.format(project="setup-project", extra=endpoint) + "storage: gs://setup-bucket/runs\n"
    out = _launch(tmp_path, spec, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "no Google credentials found" in lines[0] and "gcloud auth application-default login" in lines[0]
    assert "GOOGLE_APPLICATION_CREDENTIALS" in lines[0] and "nothing was created" in lines[0]
    assert _jobs(url) == 0


def test_an_image_bake_without_credentials_is_refused_before_anything(tmp_path: Path) -> None:
    url = _db(tmp_path)
    out = _launch(tmp_path, SPEC.format(project="setup-project", extra=""), "--gpu", "l4", "--spec",
                  verb=("image", "bake"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stdout + out.stderr
    assert "no Google credentials found" in out.stderr and _jobs(url) == 0


def test_a_malformed_project_id_is_refused_before_anything(tmp_path: Path) -> None:
    url = _db(tmp_path)
    out = _launch(tmp_path, SPEC.format(project="My_Project-", extra=""))
    assert out.returncode == 2 and "provider.project: 'My_Project-' is not a GCE project id" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and _jobs(url) == 0


def test_credentials_without_permission_are_refused_by_the_api_probe(tmp_path: Path, emu: GceEmulator) -> None:
    url = _db(tmp_path)
    emu.inject_fault(endpoint="projects.get", status=403, count=1)
    out = _launch(tmp_path, SPEC.format(project="setup-project", extra=f', api_endpoint: "{emu.url}"'))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "HTTP 403" in out.stderr and "roles/compute.instanceAdmin.v1" in out.stderr
    assert _jobs(url) == 0 and emu.snapshot()["instances_created"] == 0
    assert "instances.insert" not in emu.snapshot()["calls"]
