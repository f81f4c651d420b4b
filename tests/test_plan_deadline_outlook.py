"""`plan` of an ``on_revocation: deadline`` spec (issue 23, item 4): each policy's mean cost and chance of meeting the
deadline on the spec's measured availability trace, and the same with the work at the prediction interval's slow
end, since the daemon plans with the job's measured pace (control/deadline.measured_step_s) once it has one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from orchestrator.model.spec import validate_spec
from orchestrator.planning.outlook import deadline_outlook
from tests.cli_inproc import run_cli

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "local-deadline.yaml"


def _plan(tmp_path: Path, *args: str) -> str:
    # an idle host: a local spec's plan predicts under the load it measures now (a busy host moved its figures)
    out = run_cli(["plan", str(EXAMPLE), "--host-load", "0", *args], {**os.environ, "COLUMNS": "200",
                                                 "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/x.db"}, REPO)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_plan_prints_each_policy_with_the_predicted_work_and_at_the_intervals_slow_end(tmp_path: Path) -> None:
    doc = json.loads(_plan(tmp_path, "--format", "json"))
    outlook, width = doc["deadline_policies"], doc["prediction_interval"]["relative"]
    assert outlook["slow_by"] == width > 0
    rows = {p["policy"]: p for p in outlook["policies"]}
    assert set(rows) == {"on-demand", "greedy", "uniform-progress", "deadline"}
    assert rows["on-demand"]["mean_cost_usd_slow"] > rows["on-demand"]["mean_cost_usd"]
    assert all(0.0 <= p["p_deadline_met_slow"] <= p["p_deadline_met"] <= 1.0 for p in rows.values())
    text = _plan(tmp_path)
    assert f"P(met), work +{width:.0%}" in text and "the prediction interval's slow end" in text


def test_a_deadline_inside_the_interval_is_said(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["provider"]["availability_trace"] = str((EXAMPLE.parent / raw["provider"]["availability_trace"]).resolve())
    found = deadline_outlook(validate_spec(raw), 0.25)
    assert found is not None
    # on-demand all along makes it with the predicted work, not with 25% more (one real second is a minute here)
    raw["policy"]["deadline"] = f"{round((found.job.work_min + found.job.overhead_min) * 1.1)}s"
    late = deadline_outlook(validate_spec(raw), 0.25)
    assert late is not None
    assert {o.policy: o.p_deadline_met for o in late.rows}["on-demand"] == 1.0
    assert {o.policy: o.p_deadline_met for o in late.slow_rows}["on-demand"] == 0.0
    spec = tmp_path / "tight.yaml"
    spec.write_text(yaml.safe_dump(raw))
    # an idle host, as deadline_outlook above: a local spec's plan otherwise predicts under the load it measures
    # now, and a busy test host (CI's parallel workers) made the cluster miss this tight deadline
    out = run_cli(["plan", str(spec), "--host-load", "0"], {**os.environ, "COLUMNS": "200",
                                                             "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/x.db"}, REPO)
    assert out.returncode == 0, out.stderr
    assert "the deadline is within the prediction interval" in out.stdout


def test_plan_shows_the_elastic_row_for_a_job_the_daemon_shrinks_and_tops_up() -> None:
    """A PyTorch job of three spot workers replaying one 16-node trace: the daemon runs it elastic
    (``decide.deadline_elastic``), so ``plan`` shows that policy's row, from the other rows' start ticks."""
    from orchestrator.decide.deadline_elastic import elastic_spot_workers as elastic_workers

    example = REPO / "examples" / "local-torch-deadline-elastic.yaml"
    raw = yaml.safe_load(example.read_text())
    raw["provider"]["availability_trace"] = str((example.parent / raw["provider"]["availability_trace"]).resolve())
    spec = validate_spec(raw)
    assert elastic_workers(spec) == 3
    found = deadline_outlook(spec)
    assert found is not None
    rows = {o.policy: o for o in found.rows}
    assert rows["elastic"].runs == rows["deadline"].runs
    assert rows["elastic"].mean_cost_usd < rows["on-demand"].mean_cost_usd
    one = yaml.safe_load(EXAMPLE.read_text())
    one["provider"]["availability_trace"] = raw["provider"]["availability_trace"]
    assert elastic_workers(validate_spec(one)) == 0  # one worker (and TensorFlow): all-or-nothing


def test_a_gce_job_in_one_zone_is_planned_elastic_on_the_traces_that_counted_spot_vms() -> None:
    """On gce the daemon counts the spot VMs with the capacity advisor where every spot worker is of one shape in one
    zone: ``plan`` then replays the bundled 16-node traces for every row, the elastic one included; with two zones
    (the daemon moves between them, all or nothing) or two GPU types it does not."""
    from orchestrator.decide.deadline_elastic import elastic_spot_workers as elastic_workers

    raw = yaml.safe_load((REPO / "examples" / "gce-resnet-data-parallel.yaml").read_text())
    raw["cluster"]["workers"] = [{"gpu": "t4", "count": 4, "spot": True}]
    raw["policy"] = {"on_revocation": "deadline", "deadline": "30h"}
    spec = validate_spec(raw)
    assert elastic_workers(spec) == 4
    found = deadline_outlook(spec)
    assert found is not None and found.traces == ["aws-08-27-2023_us-west-2c_v100_1.json"]
    rows = {o.policy: o for o in found.rows}
    assert rows["elastic"].runs == rows["deadline"].runs and rows["elastic"].p_deadline_met == 1.0
    two_zones = {**raw, "provider": {**raw["provider"], "zones": ["us-central1-a", "us-central1-b"]}}
    assert elastic_workers(validate_spec(two_zones)) == 0
    assert elastic_workers(validate_spec(yaml.safe_load((REPO / "examples" / "gce-resnet-data-parallel.yaml")
                                                        .read_text()) | {"policy": raw["policy"]})) == 0
