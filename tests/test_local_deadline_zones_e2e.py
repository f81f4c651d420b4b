"""The deadline policy holding two zones end to end on one machine (issue 23): ``examples/local-deadline-zones.yaml``
replays a measured trace in each zone; the daemon runs spot in one zone, and when that zone's trace drops it moves
the job to the other zone's spot, with no on-demand VM and no wait, and the job meets its deadline."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import cli, example_in, processes_under
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "local-deadline-zones.yaml"


def test_a_spot_vm_lost_in_one_zone_moves_to_the_other_zones_spot(tmp_path: Path) -> None:
    spec, env = example_in(EXAMPLE, tmp_path)
    out = cli("launch", str(spec), "--quiet", env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        vms = conn.execute(text("SELECT zone, spot, end_reason FROM instances ORDER BY generation")).all()
        notes = conn.execute(text("SELECT to_status, reason FROM events WHERE entity = 'note' ORDER BY at, id")).all()
    timeline = "\n".join(map(str, notes))
    assert summary["status"] == "succeeded", summary
    # spot in zone-a (both zones up, none seen yet: the first), preempted where zone-a's trace drops, then spot in
    # zone-b: never on-demand
    assert [(v.zone, bool(v.spot)) for v in vms] == [("zone-a", True), ("zone-b", True)], timeline
    assert vms[0].end_reason == "preempted"
    assert ("zone-spot-down", "zone-a: spot capacity none") in notes, timeline
    moved = [r for what, r in notes if what == "requested" and "in zone-b" in r]
    assert moved and "moved from zone-a" in moved[0], timeline
    assert not any(what == "spot-down" for what, _ in notes), timeline  # spot could be had all along: in zone-b
    report = cli("report", env=env).stdout  # the timeline says where spot ran
    assert "spot in zone-a 0-" in report and "spot in zone-b " in report, report
    assert processes_under(tmp_path) == []
