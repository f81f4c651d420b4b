"""Placement reads the persisted blocks: a zone stockout or a region quota still in force moves a new job's
instances (the pinned spec's unplaced slots, the planner's search) to where a create can succeed, and a
launch's dry run shows that placement. Replacement's use of blocks is in test_control_blocks.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.costmodel.launch_plan import plan_spec
from orchestrator.model.blocks import provider_key
from orchestrator.model.spec import load_spec, validate_spec
from orchestrator.planning.local_run import plan_job
from orchestrator.store import queries
from orchestrator.store.db import open_session

REPO = Path(__file__).resolve().parent.parent
Z1, Z2 = "us-central1-a", "us-central1-c"


@dataclass(frozen=True)
class Seen:
    scope: str
    location: str
    resource: str
    reason: str | None = "seen in a test"


def unplaced_l4_spec() -> dict[str, object]:
    return {
        "name": "placement",
        "provider": {"kind": "gce", "project": "my-project", "zones": [Z1, Z2]},
        "storage": "gs://bucket/x",
        "training": {"job": "resnet-cifar", "hparam_set": "resnet_cifar_32", "mode": "sync",
                     "train_steps": 1000, "batch_per_worker": 128},
        "cluster": {"workers": [{"gpu": "l4", "count": 2, "spot": True}]},
    }


def worker_zones(blocks: list[Seen]) -> list[tuple[str, tuple[str, ...]]]:
    plan = plan_spec(validate_spec(unplaced_l4_spec()), blocks=blocks)
    return [(s.zone, s.zones) for s in plan.slots if s.role.value == "worker"]


def test_a_stockout_in_force_moves_unplaced_slots_to_the_next_zone() -> None:
    assert worker_zones([]) == [(Z1, (Z1, Z2))] * 2
    assert worker_zones([Seen("zone", Z1, "l4")]) == [(Z2, (Z2, Z1))] * 2
    assert worker_zones([Seen("zone", Z1, "a100")]) == [(Z1, (Z1, Z2))] * 2  # another GPU's stockout
    # Every zone blocked: nowhere better, so the order stays and the executor waits the blocks out.
    assert worker_zones([Seen("region", "us-central1", "l4")]) == [(Z1, (Z1, Z2))] * 2


def test_the_planner_searches_around_blocked_zones() -> None:
    spec = load_spec(REPO / "examples" / "gce-plan-search.yaml")
    free = plan_job(spec)[0].chosen
    assert free is not None
    gpu, zone = free.workers[0].gpu, free.workers[0].zone
    assert zone is not None
    blocked = plan_job(spec, blocks=[Seen("zone", zone, gpu)])[0]
    assert blocked.chosen is not None
    assert all(not (w.gpu == gpu and w.zone == zone) for c in blocked.candidates for w in c.workers)
    assert any("placement avoided 1 block" in n for n in blocked.notes)


def test_a_dry_run_places_around_a_block_in_the_results_db(tmp_path: Path) -> None:
    doc = unplaced_l4_spec()
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp_path / "home"),
           "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path / 'results.db'}"}
    with open_session(env["ORCHESTRATOR_DB_URL"]) as session:
        queries.add_block(session, provider_key(validate_spec(doc)), "zone", Z1, "l4",
                          "ZONE_RESOURCE_POOL_EXHAUSTED", 600.0)
    cli = [sys.executable, "-m", "orchestrator.cli.main", "launch", "--dry-run", str(path)]
    out = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    bodies = json.loads(out.stdout[out.stdout.index("{"):])
    zones = {r["path"].split("/zones/")[1].split("/")[0] for r in bodies["instances.insert"]}
    assert zones == {Z2}, zones
