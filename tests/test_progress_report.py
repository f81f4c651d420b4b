"""Progress lines, `logs`, `status --watch` and `report` (narrow, json, csv, --plot) on a finished job's real rows."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.listing import unwrap
from orchestrator.cli.progress import LineFollower, progress, progress_line
from orchestrator.store.db import open_session
from orchestrator.store.models import Job
from tests.cli_inproc import run_cli as run_cli_here
from tests.obs_helpers import finished_job

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def job_db(tmp_path: Path) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path / 'obs.db'}"
    with open_session(url) as session:
        job_id = finished_job(session, tmp_path / "runs")
    return url, job_id


def run_cli(url: str, *args: str, columns: int = 80, console_script: bool = False
            ) -> subprocess.CompletedProcess[str]:
    """In this interpreter as a fresh process would start (tests/cli_inproc.py), or through the console script."""
    env = {**os.environ, "ORCHESTRATOR_DB_URL": url, "COLUMNS": str(columns)}
    if not console_script:
        return run_cli_here(args, env, REPO)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


def _seen(out: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    """What a run printed, less the report title's clock minute (two runs under load can straddle one)."""
    return out.returncode, re.sub(r"report \(\d{4}-\d\d-\d\d \d\d:\d\d\)", "report (now)", out.stdout), out.stderr


def test_follower_names_instances_and_shows_metrics(job_db: tuple[str, str]) -> None:
    url, job_id = job_db
    with open_session(url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        lines = LineFollower(job_id, every_s=5.0).poll(session, job, now=1_700_000_200.0)
        again = LineFollower(job_id, every_s=5.0)
        again.poll(session, job)
        assert again.poll(session, job) == []  # nothing new, final progress line already shown
        p = progress(session, job)
    text = "\n".join(lines)
    assert "worker-0 (obs-abc123-worker-0-0): training -> revoked: preemption notice" in text
    assert "worker-0 (obs-abc123-worker-0-1): requested -> provisioning" in text
    assert "train: step 100/200, loss 1.5000, 300.0 examples/s" in text
    assert "eval: step 200, loss 0.5000, accuracy 87.5%" in text
    assert "checkpoint: step 100" in text
    assert lines[-1].startswith("") and "progress obs-abc123 succeeded: step 200/200 (100%)" in lines[-1]
    assert "spend $" in lines[-1] and "of $5.00" in lines[-1] and "instances deleted 5" in lines[-1]
    assert p.accuracy == 0.875 and p.step == 200


def test_progress_line_has_eta_and_budget() -> None:
    from orchestrator.cli.progress import Progress

    p = Progress(job_id="j", status="running", step=100, total=400, examples_per_s=250.0, steps_per_s=10.0,
                 loss=1.25, accuracy=None, cost_usd=0.5, budget_usd=5.0, elapsed_s=10.0,
                 instances={"training": 4, "provisioning": 1})
    line = progress_line(p, now=0.0)
    assert "step 100/400 (25%)" in line and "250.0 examples/s" in line and "ETA 30.0s" in line
    assert "spend $0.5000 of $5.00" in line and "instances training 4, provisioning 1" in line


def test_logs_cli_prints_steps_losses_and_instances(job_db: tuple[str, str]) -> None:
    url, job_id = job_db
    out = run_cli(url, "logs", job_id, "-n", "500", console_script=True)
    assert out.returncode == 0, out.stderr
    assert _seen(run_cli(url, "logs", job_id, "-n", "500")) == _seen(out)  # in this interpreter: the same
    assert max(len(line) for line in out.stdout.splitlines()) <= 80  # piped at 80 columns: wrapped, ...
    text = "\n".join(unwrap(out.stdout))  # ... and each record back on one line
    assert "train: step 200/200, loss 1.0000" in text
    assert "worker-1 (obs-abc123-worker-1-0): training -> deleting" in text
    short = unwrap(run_cli(url, "logs", job_id, "-n", "3").stdout)  # every event, the newest 3 metrics
    metric_lines = [line[9:] for line in short if line[9:].startswith(("train: ", "eval: ", "checkpoint: "))]
    assert [m.split(",")[0] for m in metric_lines] == ["train: step 200/200", "checkpoint: step 200 (0.5s)",
                                                      "eval: step 200"]
    assert any("-> revoked" in line for line in short) and short[-1].endswith("succeeded: every instance deleted")
    # -f on a finished job prints what there is and the final progress line, then returns
    follow = run_cli(url, "logs", job_id, "-f", "-n", "2")
    assert follow.returncode == 0 and "progress obs-abc123 succeeded" in unwrap(follow.stdout)[-1]
    watch = run_cli(url, "status", job_id, "--watch")  # not a terminal: lines, not the live view
    assert watch.returncode == 0 and "progress obs-abc123 succeeded" in watch.stdout


def test_report_fits_80_columns_and_keeps_json_csv(job_db: tuple[str, str]) -> None:
    url, job_id = job_db
    out = run_cli(url, "report", console_script=True)
    assert out.returncode == 0, out.stderr
    assert _seen(run_cli(url, "report")) == _seen(out)
    assert max(len(line) for line in out.stdout.splitlines()) <= 80
    assert job_id in out.stdout  # the job id is not folded across lines
    assert "$" in out.stdout and "1/1/0" in out.stdout
    # the batch each worker ran beside the one it was planned, and the global batch
    rows = json.loads(run_cli(url, "report", "--format", "json").stdout)
    planned = {w: b["planned"] for w, b in rows[0]["worker_batches"].items()}
    reported = {w: b["reported"] for w, b in rows[0]["worker_batches"].items()}
    assert reported.get("0") == 32, rows[0]["worker_batches"]
    line = " ".join(out.stdout.split())
    assert f"batch planned → reported: w0 {planned.get('0') or '—'} → 32" in line, out.stdout
    wide = run_cli(url, "report", columns=200)
    assert "restarts" in wide.stdout and "workers" in wide.stdout
    rows = json.loads(run_cli(url, "report", "--format", "json").stdout)
    assert rows[0]["job_id"] == job_id and rows[0]["revocations"] == 1 and rows[0]["replacements"] == 1
    csv_out = run_cli(url, "report", "--format", "csv").stdout.splitlines()
    assert csv_out[0].startswith("job_id,name,") and csv_out[1].startswith(job_id)


def test_report_plot_png_and_svg(job_db: tuple[str, str], tmp_path: Path) -> None:
    url, job_id = job_db
    png, svg = tmp_path / "r.png", tmp_path / "r.svg"
    assert run_cli(url, "report", job_id, "--plot", str(png), console_script=True).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert run_cli(url, "report", job_id, "--plot", str(svg)).returncode == 0
    body = svg.read_text()
    assert body.lstrip().startswith("<?xml") and "<svg" in body
    width, height = struct.unpack(">II", png.read_bytes()[16:24])  # the IHDR chunk
    assert (width, height) == (1210, 935)


def test_report_plot_usage_errors(job_db: tuple[str, str], tmp_path: Path) -> None:
    url, job_id = job_db
    bad = run_cli(url, "report", job_id, "--plot", str(tmp_path / "r.gif"), console_script=True)
    assert bad.returncode == 2 and "--plot" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "r.gif").exists()
    many = run_cli(url, "report", "--plot", str(tmp_path / "r.png"))
    assert many.returncode == 2 and "one job" in many.stderr


def test_plot_data_marks_revocation_replacement_and_costs(job_db: tuple[str, str]) -> None:
    from orchestrator.cli.plots import cost_curves, gather

    url, job_id = job_db
    with open_session(url) as session:
        data = gather(session, job_id)
    revoked = [b for b in data.bars if b.revoked is not None]
    assert [(b.slot, b.revoked, b.notice) for b in revoked] == [("worker-0", 41.0, True)]
    assert [b.name for b in data.bars if b.replacement] == ["obs-abc123-worker-0-1"]
    assert data.slots == ["ps-0", "chief-0", "worker-0", "worker-1"]
    assert [s for _, s in data.checkpoints] == [100, 200] and data.notice_checkpoints == [40.5]
    _, spent, on_demand = cost_curves(data)
    assert spent[0] == 0 and 0 < spent[-1] < on_demand[-1]  # the spot k80 is cheaper than its on-demand price


def test_live_view_keeps_every_instance(job_db: tuple[str, str]) -> None:
    from rich.console import Console

    from orchestrator.cli.progress import live_view
    from orchestrator.store import queries

    url, job_id = job_db
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115 - closed with console
    with open_session(url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        console.print(live_view(session, job, queries.events(session, job_id)))
    shown = console.export_text()
    for name in ("ps-0-0", "chief-0-0", "worker-0-0", "worker-0-1", "worker-1-0"):  # revoked, replaced, finished
        assert f"obs-abc123-{name}" in shown
    assert "revocations 1" in shown and "spend $" in shown


def test_launch_lines_leave_steps_to_the_progress_line(job_db: tuple[str, str]) -> None:
    url, job_id = job_db
    with open_session(url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        lines = LineFollower(job_id, steps=False, every_s=5.0).poll(session, job)
    assert not any(" train: step " in line for line in lines)
    assert any(" eval: step 200" in line for line in lines) and "progress obs-abc123" in lines[-1]
