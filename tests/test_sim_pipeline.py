"""The simulator knows pipelines: a lost stage stops the whole pipeline (its survivors idle and billed) until the
replacement is back, or the survivors re-partition where costmodel.stage_loss predicts it cheaper; a data
parallel world's survivors train on."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.model.spec.load import load_spec
from orchestrator.sim.engine import FAIL_WORKERS_LOST, NoRevocations, ScheduleLifetimes, SimCluster, SimSlot, simulate
from orchestrator.sim.from_spec import cluster_from_spec
from orchestrator.sim.strategies import compare_strategies

PRICE = 3.6  # USD/h: 0.001 USD a second
REPO = Path(__file__).resolve().parents[1]


def _slots() -> tuple[SimSlot, ...]:
    return tuple(SimSlot(f"worker-{i}", "worker", gpu="t4", spot=True, price_per_hour=PRICE, batch=8)
                 for i in range(3))


def _rate(survivors: float):  # type: ignore[no-untyped-def]
    """Three stages at 1 step/s; any two at ``survivors`` (0: the model fits no two), one alone never fits."""
    return lambda live: {3: 1.0, 2: survivors}.get(len(live), 0.0)


def _cluster(strategy: str, survivors: float = 0.6, **kw: object) -> SimCluster:
    base: dict[str, object] = {"train_steps": 1000, "mode": "sync", "checkpoint_every": 1000, "checkpoint_cost_s": 0.0,
                               "boot_delay_s": 10.0, "spot_extra_boot_s": 0.0, "strategy": strategy,
                               "rate_fn": _rate(survivors), "stage_loss": "wait"}
    base.update(kw)
    return SimCluster(_slots(), **base)  # type: ignore[arg-type]


def _run(c: SimCluster, at: float = 100.0):  # type: ignore[no-untyped-def]
    return simulate(c, ScheduleLifetimes(c, [("worker-1", at)], first_generation_only=True), record=True)


def test_a_lost_stage_stops_the_pipeline_and_a_lost_data_parallel_worker_does_not() -> None:
    # 10 s boot, 1000 steps at 1 step/s: 1010 s without revocations. worker-1 is revoked at 100 s, its
    # replacement is up at 110 s.
    assert simulate(_cluster("pipeline"), NoRevocations()).wall_time_s == pytest.approx(1010.0)
    pipe, data = _run(_cluster("pipeline")), _run(_cluster("data"))
    assert pipe.finished and data.finished and pipe.replacements == data.replacements == 1
    # the pipeline makes no step for the 10 s the stage is away; data parallel's survivors train at 0.6
    assert pipe.wall_time_s == pytest.approx(1020.0)
    assert data.wall_time_s == pytest.approx(1010.0 + 10.0 * (1 - 0.6))
    # every instance is billed the whole time: the pipeline's idle survivors cost the 10 s as well
    assert pipe.cost_usd == pytest.approx(0.001 * (2 * 1020.0 + 100.0 + (1020.0 - 100.0)))
    assert pipe.cost_usd > data.cost_usd


def test_a_pipeline_waits_out_the_restore_too() -> None:
    # the replacement is up at 110 s, then every stage restores for 5 s: no step from 100 to 115 s
    pipe = _run(_cluster("pipeline", regroup_s=5.0))
    assert pipe.wall_time_s == pytest.approx(1010.0 + 10.0 + 5.0)  # as the planner counts it (Revocations)
    assert [e.kind for e in pipe.events if e.kind in ("regroup", "repartition")] == ["regroup", "regroup"]


def test_a_pipeline_repartitions_over_the_survivors_when_that_is_cheaper() -> None:
    # Two stages at 0.6 step/s cost more a step than three at 1 (2/0.6 > 3), but a slow replacement (500 s boot)
    # idles three VMs: revoked at 600 s (100 steps done), the survivors re-partition.
    slow = {"boot_delay_s": 10.0, "spot_extra_boot_s": 490.0}
    wait = _run(_cluster("pipeline", **slow), at=600.0)
    auto = _run(_cluster("pipeline", stage_loss="auto", **slow), at=600.0)
    assert wait.replacements == 1 and auto.replacements == 0
    assert any(e.kind == "repartition" for e in auto.events)
    assert wait.wall_time_s == pytest.approx(1100.0 + 900.0)
    assert auto.wall_time_s == pytest.approx(600.0 + 900.0 / 0.6)
    assert auto.cost_usd < wait.cost_usd
    # the survivors cannot hold the model: it waits for the replacement
    no_fit = _run(_cluster("pipeline", 0.0, stage_loss="auto", **slow), at=600.0)
    assert no_fit.replacements == 1 and not any(e.kind == "repartition" for e in no_fit.events)
    # a quick replacement (10 s) is worth waiting for
    quick = _run(_cluster("pipeline", stage_loss="auto"))
    assert quick.replacements == 1 and quick.wall_time_s == pytest.approx(1020.0)


def test_a_pipeline_that_shrinks_below_what_holds_the_model_fails() -> None:
    shrunk = _run(_cluster("pipeline", 0.0, policy="shrink"))
    assert not shrunk.finished and shrunk.failure == FAIL_WORKERS_LOST
    ok = _run(_cluster("pipeline", 0.5, policy="shrink"))  # two stages hold it: re-partitioned, slower
    assert ok.finished and ok.wall_time_s == pytest.approx(100.0 + 910.0 / 0.5)  # 90 steps done at 100 s


def test_a_pipeline_is_synchronous() -> None:
    with pytest.raises(ValueError, match="synchronous"):
        _cluster("pipeline", mode="async")
    with pytest.raises(ValueError, match="strategy"):
        _cluster("tensor")


def test_the_gpt_example_simulates_as_the_pipeline_plan_chooses() -> None:
    spec = load_spec("examples/plan/gpt-1.5b-pipeline.yaml")
    c = cluster_from_spec(spec)
    assert c.strategy == "pipeline"
    workers = tuple(i for i, s in enumerate(c.slots) if s.role == "worker")
    assert c.rate_fn is not None and 1.0 / c.rate_fn(workers) == pytest.approx(5.63, rel=0.01)  # plan: 5.63 s
    free = simulate(replace(c, enforce_limits=False), NoRevocations())
    assert free.finished


def test_monte_carlo_compares_strategies_on_the_gpt_example() -> None:
    outcomes = compare_strategies(load_spec("examples/plan/gpt-1.5b-pipeline.yaml"), runs=200)
    by = {(o.strategy, o.stage_loss): o for o in outcomes}
    assert not by[("data", "wait")].fits and by[("data", "wait")].result is None
    pipe, auto = by[("pipeline", "wait")], by[("pipeline", "auto")]
    assert pipe.result is not None and auto.result is not None and pipe.planned is not None
    # the planner's analytic expectation agrees with the simulated mean (same revocation model's hazards)
    assert pipe.result.summary()["cost_usd"]["mean"] == pytest.approx(pipe.planned.expected_usd, rel=0.05)
    # re-partitioning never costs more on the mean here (it is chosen only where predicted cheaper)
    assert auto.result.summary()["cost_usd"]["mean"] <= pipe.result.summary()["cost_usd"]["mean"] * 1.001
    assert set(by[("hybrid", "wait")].to_dict()) >= {"hours", "usd", "plan_expected_hours", "plan_expected_usd"}


def test_simulate_strategies_prints_each_strategy_as_json() -> None:
    out = subprocess.run([sys.executable, "-m", "orchestrator", "simulate", "--strategies", "--runs", "50", "--json",
                          str(REPO / "examples" / "gce-resnet-data-parallel.yaml")],
                         capture_output=True, text=True, check=False, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    rows = {(s["strategy"], s["stage_loss"]): s for s in doc["strategies"]}
    assert set(rows) == {("data", "wait"), ("pipeline", "wait"), ("pipeline", "auto")}
    data, pipe = rows[("data", "wait")], rows[("pipeline", "wait")]
    # ResNet-32 on T4 + L4 + A100: data parallel is faster and cheaper under revocations too
    assert data["hours"]["mean"] < pipe["hours"]["mean"] and data["usd"]["mean"] < pipe["usd"]["mean"]
