"""What the removed real-payload test of two GPU types (tests/test_local_deadline_gpus_e2e.py, c1def24) checked
beyond the decision, fast-forwarded (tests/fastforward.py): each worker step report is labelled with the GPU type it
ran on, the daemon's Prometheus metrics carry those labels, and ``report`` / ``report --plot`` render the finished
job (its K80 span, then its V100 span)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from e2e_helpers import cli
from fastforward import example_spec, fast_forward
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, text

from orchestrator.control import metrics


def test_a_job_on_two_gpu_types_labels_its_metrics_and_plots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = fast_forward(example_spec("local-deadline-gpus", tmp_path), tmp_path, monkeypatch)
    assert run.job["status"] == "succeeded", run.timeline()
    url = f"sqlite:///{tmp_path}/results.db"
    with create_engine(url).connect() as conn:
        reports = conn.execute(text("SELECT at, gpu FROM metrics WHERE kind = 'worker' ORDER BY at")).all()
        moved_at = conn.execute(text("SELECT training_at FROM instances WHERE gpu = 'v100'")).scalar_one()
    # each worker step report is labelled with the GPU it ran on: K80 before the move, V100 after
    assert [g for _, g in reports] == ["k80" if at < moved_at else "v100" for at, _ in reports], reports
    assert {g for _, g in reports} == {"k80", "v100"}, reports
    port = metrics.serve(0, registry=CollectorRegistry(), url=url)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body = resp.read().decode()
    assert 'orchestrator_revocations_total{gpu="k80",provider="local",zone="local"} 1.0' in body, body[-2000:]
    env = {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": url}
    report = cli("report", env=env, timeout=120).stdout
    assert "spot on k80 0-" in report and "spot on v100 " in report and "met" in report, report
    png = tmp_path / "timeline.png"
    plot = cli("report", run.job["id"], "--plot", str(png), env=env, timeout=120)
    assert plot.returncode == 0 and png.stat().st_size > 0, plot.stderr[-2000:]
