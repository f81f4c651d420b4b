"""examples/local-torch-ft.yaml end to end (slow, about 70 s): torchft replica groups, every worker spot, worker 0
revoked. The daemon runs the job's Lighthouse (control/lighthouse.py); worker 0 checkpoints on its notice and leaves,
the survivors train on in the very processes they started in (their process ids are recorded at each quorum change
they see: torchft_members.jsonl), no step is lost, the replacement heals from a peer, the job succeeds with no
restart, ``report --format json`` lists the quorum change, and the Lighthouse is gone at the end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, cli, processes_under
from sqlalchemy import create_engine, text

from orchestrator.control import lighthouse

pytestmark = pytest.mark.slow
pytest.importorskip("torchft")


def test_the_survivors_keep_their_processes_through_the_revocation_of_worker_0(tmp_path: Path) -> None:
    env = {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/results.db"}
    spec = yaml.safe_load((REPO / "examples" / "local-torch-ft.yaml").read_text())
    assert all(w["spot"] for w in spec["cluster"]["workers"])  # no on-demand worker hosts anything
    spec["storage"] = str(tmp_path / "runs")
    path = tmp_path / "local-torch-ft.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = cli("launch", str(path), "--quiet", env=env, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
        summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        notes = conn.execute(text("SELECT to_status, reason FROM events WHERE entity = 'note' ORDER BY at, id")).all()
    assert summary["status"] == "succeeded" and summary["accuracy"] > 0.5, summary
    assert summary["revocations"] == 1 and summary["replacements"] == 1
    kinds = [k for k, _ in notes]
    assert "restart" not in kinds, notes  # no process of the survivors was restarted
    (storage,) = (tmp_path / "runs").iterdir()
    members = [json.loads(ln) for ln in (storage / "torchft_members.jsonl").read_text().splitlines()]
    for slot in (1, 2):
        mine = [m for m in members if m["slot"] == slot]
        worlds = [m["world"] for m in mine]
        assert 2 in worlds and worlds[worlds.index(2) - 1] == 3, members  # a late first group may make it 2, 3, 2
        assert len({m["pid"] for m in mine}) == 1, members  # one process from the start to the end
    records = [json.loads(ln) for ln in (storage / "metrics.jsonl").read_text().splitlines()]
    notice = next(r["step"] for r in records if r["kind"] == "checkpoint" and r["reason"] == "notice")
    # The revocation's change is the first shrink (a group that starts late on a loaded host grows the first quorum)
    shrinks = [r for r in records if r["kind"] == "quorum" and r["world_after"] < r["world_before"]]
    assert shrinks[0]["world_before"] == 3 and shrinks[0]["world_after"] == 2
    assert shrinks[0]["step"] == notice + 1  # the survivors' next step after the notice: none lost or repeated
    steps = [r["step"] for r in records if r["kind"] == "step"]
    assert steps == sorted(set(steps)) and steps[-1] == spec["training"]["train_steps"]
    assert any(r["kind"] == "heal" for r in records)  # the replacement healed from a live peer
    report = json.loads(cli("report", "--format", "json", env=env).stdout)
    changes = [c for c in report[0]["quorum_changes"] if c["world_after"] < c["world_before"]]
    assert changes and (changes[0]["world_before"], changes[0]["world_after"]) == (3, 2), report[0]["quorum_changes"]
    assert lighthouse.find(json.loads((storage / "lighthouse.json").read_text())["port"]) is None
    assert processes_under(tmp_path) == []
