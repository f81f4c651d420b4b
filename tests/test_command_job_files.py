"""A `job: command` job gets the orchestrator's sidecar files beside the user's: the storage sync (gs://
storage seeds and mirrors through it) and the first-boot wait (gce). Before, only built-in and `run:` jobs got
jobs/, so a command job with gs:// storage could not seed its storage on a VM."""

from __future__ import annotations

from pathlib import Path

from e2e_helpers import cli

from orchestrator.control.execute import COMMAND_SIDECAR_FILES


def _spec(tmp_path: Path, command: str, files: str = "[]") -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text(f"""name: sidecar
provider: {{kind: local, time_scale: 600, revocations: none, emulation_k80_step_s: 0}}
storage: {tmp_path / "runs"}
training: {{job: command, command: "{command}", files: {files}, mode: sync, train_steps: 10}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: k80, count: 1, spot: false}}]
policy: {{on_revocation: replace, max_replacements: 0}}
pricing: {{book: 2019-02}}
""")
    return spec


def test_a_command_job_finds_the_sidecar_files_beside_its_own(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("x")
    checks = " && ".join(f"test -f jobs/{name}" for name in COMMAND_SIDECAR_FILES)
    spec = _spec(tmp_path, f"{checks} && test -f data.txt", f"[{tmp_path / 'data.txt'}]")
    env = {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/o.db"}
    out = cli("launch", str(spec), "--quiet", env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-1500:] + out.stderr[-1500:]


def test_a_file_named_jobs_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    spec = _spec(tmp_path, "true", f"[{tmp_path / 'jobs'}]")
    env = {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/o.db"}
    out = cli("launch", str(spec), env=env, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "training.files[0]" in out.stderr and "jobs/" in out.stderr
    assert len([ln for ln in out.stderr.splitlines() if ln.strip()]) == 1
