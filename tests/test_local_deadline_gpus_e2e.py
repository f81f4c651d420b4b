"""The deadline policy holding two GPU types end to end on one machine (issue 23): ``examples/local-deadline-gpus.yaml``
replays a measured trace for each type; the job's K80 spot VM is revoked where its trace drops, and the daemon
moves the worker to the V100's spot (``policy.also_gpus``) instead of waiting or paying on-demand. The V100 VM is
created, billed and measured as a V100, and the job meets its deadline."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import cli, example_in, processes_under
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "local-deadline-gpus.yaml"


def test_a_spot_vm_lost_on_one_gpu_type_moves_to_the_other_types_spot(tmp_path: Path) -> None:
    spec, env = example_in(EXAMPLE, tmp_path)
    out = cli("launch", str(spec), "--quiet", env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        vms = conn.execute(text("SELECT gpu, spot, price_per_hour, end_reason FROM instances ORDER BY generation")
                           ).all()
        notes = conn.execute(text("SELECT to_status, reason FROM events WHERE entity = 'note' ORDER BY at, id")).all()
        reports = conn.execute(text("SELECT at, gpu FROM metrics WHERE kind = 'worker' ORDER BY at")).all()
        moved_at = conn.execute(text("SELECT training_at FROM instances WHERE gpu = 'v100'")).scalar_one()
    timeline = "\n".join(map(str, notes))
    assert summary["status"] == "succeeded", summary
    # K80 spot, revoked where its trace drops, then V100 spot at the V100's price (2019-02 book): never on-demand
    assert [(v.gpu, bool(v.spot), v.price_per_hour) for v in vms] == [("k80", True, 0.256), ("v100", True, 0.861)]
    assert vms[0].end_reason == "preempted"
    assert ("zone-spot-up", "gpu v100: spot capacity there") in notes, timeline
    assert any(what == "requested" and "on v100" in r for what, r in notes), timeline
    # each worker step report is labelled with the GPU it ran on (a loaded host may see no K80 report before the drop)
    assert [g for at, g in reports] == ["k80" if at < moved_at else "v100" for at, _ in reports], reports
    assert any(g == "v100" for _, g in reports), reports
    report = cli("report", env=env).stdout
    assert "spot on k80 0-" in report and "spot on v100 " in report and "met" in report, report
    plot = cli("report", summary["job_id"], "--plot", str(tmp_path / "timeline.png"), env=env)
    assert plot.returncode == 0 and (tmp_path / "timeline.png").stat().st_size > 0, plot.stderr[-2000:]
    assert processes_under(tmp_path) == []
