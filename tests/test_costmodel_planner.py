"""Planner: Pareto front, constraints, memory caps, pinned clusters, the scorer hook, and the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.costmodel import Candidate, PlanResult, Score, max_batch, plan
from orchestrator.costmodel.planner import pareto_front
from orchestrator.costmodel.planner.scoring import PlanContext
from orchestrator.model.spec import validate_spec

REPO = Path(__file__).resolve().parent.parent


def search_spec(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "plan-test",
        "storage": "gs://plan-test-bucket/runs",  # a gce job's VMs cannot reach a folder of this machine
        "provider": {
            "kind": "gce",
            "project": "test-project",
            "zones": ["us-central1-c", "us-west1-b", "us-east1-c"],
        },
        "training": {
            "job": "resnet-cifar",
            "hparam_set": "resnet_cifar_32",
            "mode": "async",
            "train_steps": 64000,
            "batch_per_worker": 128,
        },
        "search": {"gpus": ["t4", "l4", "v100"], "min_workers": 1, "max_workers": 8, "max_ps": 3},
        "pricing": {"book": "2026-11"},  # K80 and P100 are retired from GCE: today's GPUs
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return doc


@pytest.fixture(scope="module")
def searched() -> PlanResult:
    return plan(validate_spec(search_spec(search={"mixed": True, "max_workers": 4})))


def test_front_is_pareto_and_chosen_is_cheapest(searched: PlanResult) -> None:
    front = searched.front
    assert len(front) >= 2
    for a in front:
        assert not any(b.dominates(a) for b in front if b is not a)
    feasible = [c for c in searched.candidates if c.feasible]
    for c in feasible:  # every feasible candidate is dominated by, or equal to, a front member
        assert any(f.dominates(c) or (f.time_s, f.cost_usd) == (c.time_s, c.cost_usd) for f in front)
    assert searched.chosen is not None and searched.feasible
    assert searched.chosen.cost_usd == min(c.cost_usd for c in feasible)
    assert [c.time_s for c in front] == sorted(c.time_s for c in front)


def test_candidates_cover_the_space(searched: PlanResult) -> None:
    labels = {c.label for c in searched.candidates}
    assert any("1x t4 + 1x l4 + 1x v100" in label for label in labels)  # mixed triples
    assert {c.ps_count for c in searched.candidates} == {1, 2, 3}
    assert {c.spot for c in searched.candidates} == {True, False}
    # V100 is not offered in us-east1-c: no candidate puts one there.
    assert not any(c.zone == "us-east1-c" and "v100" in c.gpus for c in searched.candidates)


def test_chosen_converts_to_a_runnable_spec(searched: PlanResult) -> None:
    spec = validate_spec(search_spec(search={"mixed": True, "max_workers": 4}))
    assert searched.chosen is not None
    doc = spec.with_cluster(searched.chosen.to_cluster()).model_dump(mode="json", exclude_none=True)
    again = validate_spec(doc)
    assert again.worker_count == len(searched.chosen.workers)
    pinned = plan(again)
    assert pinned.chosen is not None and len(pinned.candidates) == 1
    assert pinned.chosen.steps_per_s == pytest.approx(searched.chosen.steps_per_s)
    assert pinned.chosen.cost_usd == pytest.approx(searched.chosen.cost_usd)


def test_time_objective_and_constraints() -> None:
    fastest = plan(validate_spec(search_spec(search={"objective": "time", "max_workers": 4})))
    assert fastest.chosen is not None
    assert fastest.chosen.time_s == min(c.time_s for c in fastest.candidates if c.feasible)
    tight = plan(validate_spec(search_spec(policy={"budget_usd": 0.01}, search={"max_workers": 2})))
    assert tight.chosen is None and not tight.feasible and tight.best_infeasible is not None
    assert any("budget" in r for r in tight.best_infeasible.reasons)
    late = plan(validate_spec(search_spec(policy={"deadline": "1m"}, search={"max_workers": 2})))
    assert late.chosen is None and all(any("deadline" in r for r in c.reasons) for c in late.candidates)


def test_planner_respects_memory_caps() -> None:
    doc = search_spec(
        training={
            "job": "command",
            "command": "true",
            "hparam_set": "vgg16",
            "mode": "sync",
            "train_steps": 1000,
            "global_batch": 300,
        },
        search={"gpus": ["t4", "v100"], "min_workers": 1, "max_workers": 4, "mixed": True},
    )
    doc["training"].pop("batch_per_worker", None)
    result = plan(validate_spec(doc))
    caps = {g: max_batch("vgg16", g) for g in ("t4", "v100")}
    assert caps["t4"] < 300
    for c in result.candidates:
        if c.feasible:
            assert sum(c.batches) == 300
            assert all(w.batch <= caps[w.gpu] for w in c.workers)
        elif len(c.workers) == 1 and c.gpus == ["t4"]:
            assert any("memory" in r for r in c.reasons)
    assert result.chosen is not None and result.chosen.ps_count == 0


def test_revocation_overhead_and_risk() -> None:
    result = plan(
        validate_spec(search_spec(search={"gpus": ["t4"], "min_workers": 4, "max_workers": 4, "max_ps": 1}))
    )
    spot = [c for c in result.candidates if c.spot]
    on_demand = [c for c in result.candidates if not c.spot]
    assert spot and on_demand
    assert all(c.revocation_overhead_s > 0 and c.expected_revocations > 0 for c in spot)
    assert all(c.revocation_overhead_s == 0 and c.revocation_risk == 0 for c in on_demand)
    assert min(c.cost_usd for c in spot) < min(c.cost_usd for c in on_demand)


def test_scorer_hook_replaces_the_analytic_model() -> None:
    calls: list[Candidate] = []

    class Flat:
        def score(self, candidate: Candidate, context: PlanContext) -> Score:
            calls.append(candidate)
            assert context.train_steps == 64000
            t = candidate.base_time_s * 2
            return Score(t, candidate.hourly_usd * t / 3600, 0.0, t / 2)

    result = plan(validate_spec(search_spec(search={"gpus": ["t4"], "max_workers": 2})), scorer=Flat())
    assert len(calls) == len(result.candidates)
    assert all(c.time_s == pytest.approx(2 * c.base_time_s) for c in result.candidates)


def test_pareto_front_helper_drops_ties_and_infinities(searched: PlanResult) -> None:
    cands = list(searched.candidates[:20])
    front = pareto_front(cands + cands)
    assert len({(c.time_s, c.cost_usd) for c in front}) == len(front)
    assert all(math.isfinite(c.cost_usd) for c in front)


def test_every_example_plans(tmp_path: Path) -> None:
    from orchestrator.profiler.cache import prepare_spec_model

    for path in sorted((REPO / "examples").glob("*.yaml")):
        prepare_spec_model(path)  # training.model: {torch: ...} is profiled first, as `plan` does
        result = plan(validate_spec(yaml.safe_load(path.read_text())))
        assert result.chosen is not None or result.best_infeasible is not None, path.name
        json.dumps(result.to_dict())


def test_cli_model_and_plan_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.cli import render
    from orchestrator.cli.model_cmd import app
    from orchestrator.cli.plan_cmd import plan_command

    monkeypatch.setattr(render.console, "width", 250)

    runner = CliRunner()
    out = runner.invoke(
        app, ["predict", "--model", "resnet_cifar_32", "--gpu", "v100", "--batch", "128", "--json"]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["step_time_s"] > 0
    out = runner.invoke(app, ["profile", "--model", "resnet_tiny", "--gpu", "k80"])
    assert out.exit_code == 0 and "s2b0_proj" in out.output
    assert "vgg16" in runner.invoke(app, ["profile"]).output
    rows = ["model,gpu,batch,step_time_s"] + [
        f"{m},{g},{b},{(0.01 + 0.0004 * b) * (1 if g == 'v100' else 2.5)}"
        for g in ("k80", "v100")
        for m in ("resnet_tiny", "resnet_cifar_32")
        for b in (32, 128, 256)
    ]
    csv = tmp_path / "m.csv"
    csv.write_text("\n".join(rows) + "\n")
    cal = tmp_path / "cal.json"
    out = runner.invoke(app, ["calibrate", "--measurements", str(csv), "--out", str(cal), "--name", "t"])
    assert out.exit_code == 0, out.output
    assert json.loads(cal.read_text())["name"] == "t" and "leave-one-GPU-out" in out.output
    one = tmp_path / "one.csv"
    one.write_text("gpu,runtime,model,batch,step_ms,source\nh100,pytorch-eager,resnet_cifar_32,128,13.4,test\n")
    out = runner.invoke(app, ["calibrate", str(one)])
    assert out.exit_code == 0 and "warning: pytorch-eager: 1 measured point(s) for 5 parameters" in out.output
    out = runner.invoke(app, ["validate", "--measurements", str(csv), "--json"])
    assert out.exit_code == 0 and "per_gpu" in json.loads(out.output)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(search_spec(search={"gpus": ["t4", "v100"], "max_workers": 3})))
    plan_command(spec, True, 3, str(cal))
    doc = json.loads(capsys.readouterr().out)
    assert doc["calibration"] == "t" and doc["chosen"]["cluster"]["workers"] and len(doc["runner_ups"]) == 3
    plan_command(spec, False, 3, None)
    text = capsys.readouterr().out
    assert "chosen" in text and "measured points" in text  # which calibration, how many points behind it


def test_a_pytorch_job_is_planned_under_its_own_runtime_and_a_tf_job_under_tf1() -> None:
    """The built-in PyTorch job's steps come from eager PyTorch's fits (its workers report
    pytorch-eager+torchjob, and the daemon folds them under that label), not the TF job's; a GPU without
    points of that payload falls back to eager PyTorch's key."""
    from orchestrator.costmodel.batches import job_runtime
    from orchestrator.costmodel.compute import DEFAULT_CALIBRATION, TORCHJOB_RUNTIME
    from orchestrator.costmodel.stepmodel import step_fn

    pinned = {"workers": [{"gpu": "h100", "count": 1, "machine_type": "a3-highgpu-1g", "spot": True}]}
    torch_doc = search_spec(training={"framework": "pytorch", "mode": "sync", "train_steps": 1000,
                                      "batch_per_worker": 128}, cluster=pinned)
    torch_doc.pop("search")
    tf_doc = search_spec(training={"mode": "sync", "train_steps": 1000}, cluster=pinned)
    tf_doc.pop("search")
    torch_spec, tf_spec = validate_spec(torch_doc), validate_spec(tf_doc)
    assert (job_runtime(torch_spec.training), job_runtime(tf_spec.training)) == (TORCHJOB_RUNTIME, "tf1-graph")
    run_doc = {**search_spec(), "training": {"run": "python train.py", "train_steps": 100}}
    assert job_runtime(validate_spec(run_doc).training) == "pytorch-eager"

    key, _ = DEFAULT_CALIBRATION.lookup("h100", TORCHJOB_RUNTIME, "resnet_cifar_32")
    assert key == "h100/pytorch-eager+torchjob"  # the payload's own H100 rows (data/measurements)
    for spec, runtime in ((torch_spec, TORCHJOB_RUNTIME), (tf_spec, "tf1-graph")):
        result = plan(spec)
        assert result.chosen is not None
        want = step_fn("resnet_cifar_32", "h100", runtime=runtime).at(128.0)
        assert result.chosen.workers[0].step_time_s == pytest.approx(want, rel=1e-6)
        assert f"calibration ({runtime}, fp32)" in " ".join(result.notes)


def test_a_scripts_precision_is_what_its_steps_are_planned_at() -> None:
    """`training.precision` of a `run:` script: the calibration's bf16 machine fit of the H100, not its fp32
    one; the built-in jobs plan in fp32."""
    from orchestrator.costmodel.batches import job_precision
    from orchestrator.costmodel.compute import DEFAULT_CALIBRATION, model_profile
    from orchestrator.costmodel.profiles.user import register_profile
    from orchestrator.costmodel.stepmodel import step_fn

    name = "torch:tests.planner:model"
    register_profile(replace(model_profile("resnet_cifar_56"), name=name), persist=False)
    pinned = {"workers": [{"gpu": "h100", "count": 1, "machine_type": "a3-highgpu-1g", "spot": True}]}
    steps = {}
    for precision in ("fp32", "bf16"):
        doc = {**search_spec(), "cluster": pinned,
               "training": {"run": "python train.py", "train_steps": 1000, "batch_per_worker": 128,
                            "precision": precision, "model": {"torch": "tests.planner:model"}}}
        doc.pop("search")
        spec = validate_spec(doc)
        assert job_precision(spec.training) == precision
        result = plan(spec)
        assert result.chosen is not None
        steps[precision] = result.chosen.workers[0].step_time_s
        want = step_fn(name, "h100", DEFAULT_CALIBRATION, runtime="pytorch-eager", precision=precision).at(128.0)
        assert steps[precision] == pytest.approx(want, rel=1e-6)
        assert f"machine fit h100/{precision} (pytorch-eager)" in " ".join(result.notes)
    assert steps["bf16"] != steps["fp32"]  # the H100's bf16 rows carry autocast's host time: not faster here
    # 16-bit autocast keeps its activations in 16 bits: a larger batch fits the same GPU
    from orchestrator.costmodel.batches import memory_params
    from orchestrator.costmodel.memory import max_batch

    caps = {p: max_batch(name, "t4", params=memory_params(validate_spec({
        **search_spec(), "training": {"run": "python train.py", "precision": p}}))) for p in ("fp32", "bf16")}
    assert caps["bf16"] > 1.5 * caps["fp32"] > 0
    assert job_precision(validate_spec(search_spec()).training) == "fp32"
