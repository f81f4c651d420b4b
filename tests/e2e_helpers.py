"""Helpers for the end-to-end tests that run the real CLI, real processes and real TensorFlow."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **env, "COLUMNS": "200"}, timeout=timeout, cwd=REPO)


def example_doc(example: Path, tmp_path: Path) -> dict[str, Any]:
    """A local example spec's document with its storage under ``tmp_path`` and its traces' paths made absolute."""
    raw: dict[str, Any] = yaml.safe_load(example.read_text())
    raw["storage"] = str(tmp_path / "runs")
    local = raw["provider"]
    if "availability_trace" in local:
        local["availability_trace"] = str((example.parent / local["availability_trace"]).resolve())
    for key in ("zone_availability_traces", "gpu_availability_traces"):
        if key in local:
            local[key] = {k: str((example.parent / p).resolve()) for k, p in local[key].items()}
    return raw


def example_in(example: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A local example spec written under ``tmp_path`` (its storage there, its traces' paths made absolute) and the
    environment of a CLI run with its own home and results database there."""
    raw = example_doc(example, tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(raw))
    return spec, {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/results.db"}


def processes_under(root: Path) -> list[str]:
    """Live processes whose working directory or command line is inside ``root`` (what a job left behind)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (cwd.startswith(str(root)) or str(root) in cmd):
            found.append(f"{proc.name}: {cmd[:120]}")
    return found


def wait_until(predicate: Any, timeout: float, interval: float = 0.5) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def tiny_spec(name: str, storage: Path, *, schedule: list[tuple[str, int]], steps: int = 120,
              mode: str = "async", extra_workers: list[dict[str, Any]] | None = None,
              emulation_k80_step_s: float = 0.1) -> str:
    """``schedule``: (slot, step) revocations, on the job's progress clock (``at_step``): mid-training however
    loaded the machine is (TensorFlow's start-up alone takes 10-40 s here, more beside other tests)."""
    sched = "".join(f"\n    - {{instance: {slot}, at_step: {step}}}" for slot, step in schedule)
    workers = extra_workers or [{"gpu": "k80", "spot": True}, {"gpu": "v100", "spot": False}]
    wl = "".join(f"\n    - {{gpu: {w['gpu']}, count: 1, spot: {str(w['spot']).lower()}}}" for w in workers)
    ps = "\n  parameter_servers: {count: 1}" if mode == "async" else "\n  parameter_servers: {count: 0}"
    return f"""name: {name}
provider:
  kind: local
  time_scale: 60
  revocations: {"schedule" if schedule else "none"}
  emulation_k80_step_s: {emulation_k80_step_s}
  schedule: {"" if schedule else "[]"}{sched}
storage: {storage}
training:
  job: resnet-cifar
  hparam_set: resnet_tiny
  mode: {mode}
  train_steps: {steps}
  batch_per_worker: 32
  checkpoint_every: 40
  log_every: 10
cluster:{ps}
  workers:{wl}
policy: {{on_revocation: replace, max_replacements: 4, budget_usd: 5, deadline: 20m}}
pricing: {{book: 2019-02}}
"""


ELASTIC_TRACE = ("spot-availability", "16-node", "aws-08-27-2023_us-west-2c_v100_1.json")  # under data_dir()
ELASTIC_DEADLINE_S = 480  # the work is ~70 s here (300 steps); a loaded host may take 3x that and still meet it


def elastic_spec(name: str, storage: Path) -> str:
    """Two spot V100 workers of a PyTorch job on a replayed 16-node count trace, deadline ELASTIC_DEADLINE_S (from
    tick 2530, 5-minute ticks, 5 s here: 16 spot VMs for 25 s, then 1 for 10 s, none for 25 s, then 16 again):
    tests/test_local_deadline_elastic_e2e.py's job, and tests/test_ff_torch.py's fast-forwarded."""
    from orchestrator.model.paths import data_dir

    return f"""name: {name}
provider:
  kind: local
  time_scale: 60
  revocations: none
  availability_trace: {data_dir().joinpath(*ELASTIC_TRACE)}
  availability_start_tick: 2530
  emulation_k80_step_s: 0.25
storage: {storage}
training:
  framework: pytorch
  hparam_set: resnet_tiny
  problem: image_cifar10
  train_steps: 300
  global_batch: 16
  checkpoint_every: 25
  log_every: 10
cluster:
  workers:
    - {{gpu: v100, count: 2, spot: true}}
policy:
  on_revocation: deadline
  deadline: {ELASTIC_DEADLINE_S}s
pricing: {{book: 2019-02}}
"""


def gce_spec_head(name: str, url: str, storage: str, zones: str = "[us-central1-c]") -> str:
    """The start of a gce spec against the Compute API emulator at ``url`` (its provider block and storage)."""
    from orchestrator_testing.cloud import provider_yaml

    return (f"name: {name}\nprovider:\n  kind: gce\n  project: test-project\n  zones: {zones}\n"
            f"  {provider_yaml(url).replace(', ', chr(10) + '  ')}\nstorage: {storage}\n")


def launch_in_background(tmp_path: Path, spec_text: str) -> tuple[subprocess.Popen[str], Any]:
    """``orchestrator launch --quiet`` of ``spec_text`` in a child process with its own home and SQLite DB, and
    ``scalar(sql)``: one value from that DB (None while it does not exist yet)."""
    from sqlalchemy import create_engine, text

    db_url = f"sqlite:///{tmp_path}/results.db"
    env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": db_url,
           "COLUMNS": "200"}
    path = tmp_path / "job.yaml"
    path.write_text(spec_text)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "launch", str(path), "--quiet"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    engine = create_engine(db_url)

    def scalar(sql: str) -> object:
        try:
            with engine.connect() as conn:
                return conn.execute(text(sql)).scalar()
        except Exception:  # the DB may not exist for the first second
            return None

    return proc, scalar


def preempt_worker_at(cloud: Any, proc: subprocess.Popen[str], scalar: Any, *, slot: int, step: int,
                      before: Any = None) -> tuple[str, str]:
    """Once the launch's job reaches ``step``, preempt worker ``slot``'s VM in the Compute API emulator (``before()``
    first, if given), then wait for the launch to end (SIGTERM: it tears its instances down): (the VM, its output)."""
    from orchestrator_testing.processes import stop

    try:
        wait_until(lambda: (scalar("SELECT final_step FROM jobs") or 0) >= step, timeout=300)
        if before is not None:
            before()
        victim = str(scalar(f"SELECT name FROM instances WHERE slot_index = {int(slot)} AND role = 'worker' "
                            "AND status = 'training'"))
        cloud.compute.preempt(victim)
        out, _ = proc.communicate(timeout=600)
    finally:
        stop(proc, timeout_s=120)
    assert proc.returncode == 0, out[-4000:]
    return victim, out
