"""The planner weighs strategies under revocations: a lost stage stops a pipeline, data parallel survivors train on,
so revocation risk can flip the choice; ``plan --json`` gives each strategy's expected time and cost."""

from __future__ import annotations

import math

import pytest

from orchestrator.costmodel import plan
from orchestrator.costmodel.planner.strategies import DATA, PIPELINE, Revocations, Strategy, choose
from orchestrator.model.spec.load import load_spec

HOUR = 3600.0


def _weighed(risk: Revocations, base_s: float) -> list[Strategy]:
    """Pipeline 5% faster than data parallel on 4 equal GPUs, each strategy with its expected run under ``risk``."""
    out = []
    for name, step in ((DATA, 1.05), (PIPELINE, 1.0)):
        run = base_s * step
        t = risk.expected_s(name, run, [0.25] * 4)
        out.append(Strategy(name, step, 10.0, run / HOUR, True, "", None, t, t / HOUR))
    return out


def test_revocation_risk_flips_the_choice_from_pipeline_to_data_parallel() -> None:
    # A 100 s replacement, a 10 s restore, a 30 s notice. On-demand (no hazard): the faster pipeline.
    calm = Revocations((0.0,) * 4, 100.0, 10.0, 30.0)
    assert choose("auto", _weighed(calm, 10 * HOUR)).name == PIPELINE
    # Spot at one revocation an hour per VM (the trace's worst first hours): every lost stage stops the pipeline
    # for 110 s, a lost data-parallel worker costs 30 + 2 x 10 s of pauses and a quarter of the 60 s boot.
    risky = Revocations((1 / HOUR,) * 4, 100.0, 10.0, 30.0)
    assert risky.loss_s(PIPELINE, 0.25) == pytest.approx(110.0)
    assert risky.loss_s(DATA, 0.25) == pytest.approx(30.0 + 20.0 + 60.0 * 0.25)
    weighed = _weighed(risky, 10 * HOUR)
    assert choose("auto", weighed).name == DATA
    # asked for explicitly, a pipeline still runs
    assert choose("pipeline", weighed).name == PIPELINE


def test_revocations_that_outpace_training_never_finish() -> None:
    assert math.isinf(Revocations((1 / 60.0,), 100.0, 10.0, 30.0).expected_s(PIPELINE, HOUR, [1.0]))


def test_plan_gives_each_strategy_its_expected_run_under_revocations() -> None:
    result = plan(load_spec("examples/plan/gpt-1.5b-pipeline.yaml")).to_dict()
    assert result["chosen"]["strategy"] == "pipeline"
    by = {s["name"]: s for s in result["strategies"]}
    assert not by["data"]["fits"] and by["data"]["expected_usd"] is None
    pipe = by["pipeline"]
    assert {"name", "step_s", "memory_gb_per_gpu", "usd", "fits", "expected_hours", "expected_usd"} <= set(pipe)
    # spot workers: the expected run is longer and dearer than the failure-free one
    assert pipe["expected_usd"] > pipe["usd"] and pipe["expected_hours"] * HOUR > 2000 * pipe["step_s"]
