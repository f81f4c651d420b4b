"""Issue 55: a probe of the user's model on one GPU corrects the prediction of the GPUs not probed
(``measured.through_probed``, ``stepmodel.probed_step_fn``): model(B) x measured(A) / model(A), the geometric mean
over the probed GPUs, with the cross-GPU model's held-out width of another GPU. In-process, no training."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from orchestrator.costmodel import plan
from orchestrator.costmodel.compute import DEFAULT_CALIBRATION, model_profile
from orchestrator.costmodel.crossgpu import load_efficiencies
from orchestrator.costmodel.interval import plan_interval
from orchestrator.costmodel.measured import MeasuredStep, point_key, probed_ratio, with_points
from orchestrator.costmodel.profiles.user import register_profile
from orchestrator.costmodel.stepmodel import probed_step_fn, question_kind, step_fn
from orchestrator.model.spec import validate_spec
from orchestrator.planning.step_sources import step_sources

MODEL = "torch:tests.probe_transfer:model"
RT = "pytorch-eager"
# the user's model on the "real" machines: 1.7x slower than the cost model says everywhere (its data loader),
# each GPU a little off that (what no cross-GPU ratio knows)
SLOWER = 1.7
OFF = {"v100": 1.05, "a100": 0.96, "t4": 0.97, "l4": 1.02}


@pytest.fixture(autouse=True)
def _user_model() -> None:
    register_profile(replace(model_profile("resnet_cifar_56"), name=MODEL), persist=False)


def _truth(gpu: str, batch: int) -> float:
    return SLOWER * OFF[gpu] * step_fn(MODEL, gpu, DEFAULT_CALIBRATION, runtime=RT).at(float(batch))


def _probed(*gpus: str, batch: int = 64, emulated: bool = False) -> Any:
    points = {point_key(g, RT, MODEL, batch): MeasuredStep(_truth(g, batch), 0.97 * _truth(g, batch),
                                                           1.03 * _truth(g, batch), 6, "test") for g in gpus}
    return with_points(DEFAULT_CALIBRATION, points, "probed", "test", emulated=emulated)


def _err(gpu: str, batch: int, calib: Any) -> float:
    return abs(step_fn(MODEL, gpu, calib, runtime=RT).at(float(batch)) / _truth(gpu, batch) - 1)


def test_an_unprobed_gpus_step_moves_toward_truth_after_another_gpu_is_probed() -> None:
    before = _err("t4", 128, DEFAULT_CALIBRATION)
    one = _probed("v100")
    after = _err("t4", 128, one)
    assert before == pytest.approx(1 - 1 / (SLOWER * OFF["t4"]), rel=1e-6)  # 39% off: the profile's guess
    assert after == pytest.approx(OFF["v100"] / OFF["t4"] - 1, rel=1e-6) and after < before / 4  # 8% off
    fn, through = probed_step_fn(MODEL, "t4", one, runtime=RT)
    assert through == ("v100",)
    plain = step_fn(MODEL, "t4", DEFAULT_CALIBRATION, runtime=RT)
    assert fn.at(512.0) / fn.at(64.0) == pytest.approx(plain.at(512.0) / plain.at(64.0))  # the curve's shape kept
    # two probed GPUs: the geometric mean of their departures, nearer the truth again
    two = _probed("v100", "a100")
    assert _err("t4", 128, two) == pytest.approx((OFF["v100"] * OFF["a100"]) ** 0.5 / OFF["t4"] - 1, abs=1e-6)
    assert _err("t4", 128, two) < after
    assert probed_step_fn(MODEL, "t4", two, runtime=RT)[1] == ("a100", "v100")


def test_a_probed_gpu_keeps_its_own_figure_and_an_emulated_probe_moves_no_other_gpu() -> None:
    one = _probed("v100")
    assert step_fn(MODEL, "v100", one, runtime=RT).at(64.0) == pytest.approx(_truth("v100", 64))
    assert probed_step_fn(MODEL, "v100", one, runtime=RT)[1] == ()
    assert question_kind(MODEL, "v100", RT, one) == "same-gpu" and question_kind(MODEL, "t4", RT, one) == "other-gpu"
    assert question_kind(MODEL, "t4", RT, DEFAULT_CALIBRATION) == "none"
    emulated = _probed("v100", emulated=True)  # local GPUs: host CPU and a sleep, no ratio of two GPUs
    assert step_fn(MODEL, "t4", emulated, runtime=RT).at(128.0) == step_fn(MODEL, "t4", runtime=RT).at(128.0)
    # another precision's probe is not this precision's point
    assert step_fn(MODEL, "t4", one, runtime=RT, precision="bf16").at(128.0) == \
        step_fn(MODEL, "t4", DEFAULT_CALIBRATION, runtime=RT, precision="bf16").at(128.0)


def test_the_ratio_is_the_geometric_mean_over_gpus_each_gpu_one_vote() -> None:
    points = {point_key("a", RT, "m", 32): MeasuredStep(2.0, 2.0, 2.0, 1), point_key("a", RT, "m", 64):
              MeasuredStep(8.0, 8.0, 8.0, 1), point_key("b", RT, "m", 32): MeasuredStep(1.0, 1.0, 1.0, 1),
              point_key("c", RT + "+bf16", "m", 32): MeasuredStep(9.0, 9.0, 9.0, 1)}
    calib = replace(DEFAULT_CALIBRATION, measured={k: v.to_dict() for k, v in points.items()})
    found = probed_ratio(calib, RT, "m", lambda gpu, batch: 1.0, skip="")
    assert found is not None and set(found[1]) == {"a", "b"}
    assert found[0] == pytest.approx((4.0 * 1.0) ** 0.5)  # a: sqrt(2 x 8) = 4, b: 1
    without_b = probed_ratio(calib, RT, "m", lambda gpu, batch: 1.0, skip="b")
    assert without_b is not None and without_b[0] == pytest.approx(4.0) and set(without_b[1]) == {"a"}
    unpredicted_a = probed_ratio(calib, RT, "m", lambda gpu, batch: None if gpu == "a" else 2.0)
    assert unpredicted_a is not None and unpredicted_a[0] == pytest.approx(0.5)  # a does not vote
    assert probed_ratio(calib, RT, "other", lambda gpu, batch: 1.0) is None


def test_plan_marks_the_probed_group_measured_and_the_other_predicted_through_it() -> None:
    doc = {"name": "probe-transfer", "storage": "gs://probe-transfer/runs",
           "provider": {"kind": "gce", "project": "test-project", "zones": ["us-central1-c", "us-west1-b"]},
           "training": {"run": "python train.py", "train_steps": 1000, "batch_per_worker": 64, "mode": "sync",
                        "model": {"torch": "tests.probe_transfer:model"}},
           "cluster": {"parameter_servers": {"count": 0}, "workers": [
               {"gpu": "v100", "count": 1, "spot": True}, {"gpu": "t4", "count": 1, "spot": True}]},
           "pricing": {"book": "2026-11"}}
    spec = validate_spec(doc)
    calib = _probed("v100")
    before, after = plan(spec, calibration=DEFAULT_CALIBRATION), plan(spec, calibration=calib)
    assert before.chosen is not None and after.chosen is not None
    t4 = {w.gpu: w.step_time_s for w in after.chosen.workers}["t4"]
    assert abs(t4 / _truth("t4", 64) - 1) < abs({w.gpu: w.step_time_s for w in before.chosen.workers}["t4"]
                                                / _truth("t4", 64) - 1)
    interval = plan_interval(after, calib, RT)
    assert interval is not None and interval["kind"] == "other-gpu"
    sources = {s.gpu: s.to_dict() for s in step_sources(spec, after, calib, interval["relative"])}
    assert sources["v100"]["step_source"] == "measured" and "predicted_through" not in sources["v100"]
    assert sources["t4"]["step_source"] == "predicted" and sources["t4"]["predicted_through"] == ["v100"]
    width = load_efficiencies().width("other-gpu", 0.0)  # same batch as the probe: no doublings
    assert sources["t4"]["step_high_s"] == pytest.approx(sources["t4"]["step_s"] * (1 + width))
