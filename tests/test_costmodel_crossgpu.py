"""The cross-GPU predictor's pieces that the public-table bench fits: per-GPU deviations, the conv /
matmul ratio, and interval widths read from data/crossgpu_intervals.csv (held-out error, not a prior)."""

from __future__ import annotations

import csv
from dataclasses import replace

import pytest

from orchestrator.costmodel.crossgpu import (
    FITTED_KIND,
    INTERVAL_KINDS,
    ClassWork,
    Efficiencies,
    Point,
    arch_gpu,
    class_work,
    layer_seconds,
    load_efficiencies,
    load_widths,
    predict,
    transfer_weight,
)
from orchestrator.costmodel.profiles import get_profile
from orchestrator.model.paths import data_dir


def _work() -> ClassWork:
    return class_work(get_profile("resnet_cifar_32"))


def test_interval_widths_come_from_the_bench_file_for_every_kind() -> None:
    with (data_dir() / "crossgpu_intervals.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["kind"] for r in rows} == {*INTERVAL_KINDS, FITTED_KIND}
    assert all(("bench/cross_gpu.py" if r["kind"] in INTERVAL_KINDS else "bench/cross_gpu_torchvision.py")
               in r["source"] and int(r["n"]) > 0 for r in rows)
    eff = load_efficiencies()
    widths = load_widths()
    for kind in INTERVAL_KINDS:
        nearest = min((k for k in widths if k.startswith(kind + "/")), key=lambda k: int(k.split("/")[1]))
        assert eff.interval[kind] == pytest.approx(widths[nearest])  # the plan's width is the bench's
    assert eff.interval["same-gpu"] != 0.05  # no longer the old prior


def test_a_farther_batch_is_never_a_narrower_interval() -> None:
    eff = Efficiencies(widths={"other-gpu/0": 0.2, "other-gpu/1": 0.15, "other-gpu/2": 0.3})
    assert eff.width("other-gpu", 0.0) == 0.2
    assert eff.width("other-gpu", 1.2) == 0.2  # the wider nearer band holds
    assert eff.width("other-gpu", 5.0) == 0.3
    assert Efficiencies(widths={"none/0": 0.4}).width("other-gpu", 2.0) == pytest.approx(0.15 + 2 * 0.05)


def test_a_question_between_two_fitted_machines_takes_their_held_out_width() -> None:
    # model predict --torch --measurements: both machines fitted on other models' rows (host_fit) answer
    # within bench/cross_gpu_torchvision.py's width; a farther batch widens it as it widens "other-gpu"
    profile = get_profile("resnet_cifar_32")
    point, eff = Point("v100", 128, "amp", 50.0), load_efficiencies()
    fitted = {("v100", "amp"), ("a100", "amp")}
    plain = predict(profile, "a100", 128, "amp", [point])
    near = predict(profile, "a100", 128, "amp", [point], fitted=fitted)
    far = predict(profile, "a100", 2048, "amp", [point], fitted=fitted)
    assert plain.kind == "other-gpu" and near.kind == far.kind == FITTED_KIND
    assert near.relative == pytest.approx(eff.width(FITTED_KIND, 0.0)) and near.relative < plain.relative
    assert far.relative - near.relative == pytest.approx(eff.width("other-gpu", 4.0) - eff.width("other-gpu", 0.0))
    assert near.step_ms == plain.step_ms and "both machines fitted" in near.basis
    # one end without a fit of its own (the target borrows its architecture's, or the host alone): other-gpu
    assert predict(profile, "a100", 128, "amp", [point], fitted={("v100", "amp")}).kind == "other-gpu"
    assert predict(profile, "a100", 128, "amp", [point], fitted=fitted, eff=Efficiencies()).kind == "other-gpu"


def test_a_prediction_from_a_far_batch_is_at_least_as_wide() -> None:
    profile = get_profile("resnet_cifar_32")
    point = Point("v100", 128, "fp32", 50.0)
    near = predict(profile, "a100", 128, "fp32", [point])
    far = predict(profile, "a100", 2048, "fp32", [point])
    assert near.kind == far.kind == "other-gpu-precision" or near.kind == far.kind == "other-gpu"
    assert far.relative >= near.relative > 0


def test_a_gpu_deviation_and_the_conv_ratio_scale_its_time() -> None:
    work = _work()
    a100 = arch_gpu("a100")
    base = Efficiencies()
    c0, m0, w0 = layer_seconds(work, a100, "amp", base)
    fast = replace(base, gpu={"a100/fp16/tensor": 2.0, "a100/fp16/memory": 2.0})
    c1, m1, w1 = layer_seconds(work, a100, "amp", fast)
    assert m1 == pytest.approx(m0 / 2) and w1 == pytest.approx(w0 / 2)
    assert (c1 <= c0).all() and (c1 < c0).any()  # the tensor part halves, vector ops run on the FP32 units
    assert work.conv_flops.sum() > 0 and (work.conv_flops <= work.tensor_flops).all()
    conv_fast = replace(base, conv={f"{a100.arch}/fp16": 4.0})
    c2, _, _ = layer_seconds(work, a100, "amp", conv_fast)
    assert c2.sum() < c0.sum()
    other = replace(base, gpu={"a100-80gb/fp16/tensor": 2.0})  # another GPU's deviation leaves this one
    assert layer_seconds(work, a100, "amp", other)[0] == pytest.approx(c0)


def test_a_measured_departure_carries_over_as_far_as_the_two_steps_are_alike() -> None:
    # a step all GPU measured 2x the model says: a target step all host keeps none of it, one made alike all
    assert transfer_weight(0.0, 1.0) == 0.0 and transfer_weight(1.0, 0.0) == 0.0
    assert transfer_weight(0.3, 0.3) == pytest.approx(1.0) and transfer_weight(0.0, 0.0) == 1.0
    assert transfer_weight(0.7, 1.0) == 1.0  # the least-norm split would keep 1.2x: never more than all of it
    assert 0.0 < transfer_weight(0.2, 0.8) < transfer_weight(0.2, 0.5) < 1.0
    profile = get_profile("resnet_cifar_32")
    point = Point("v100", 128, "amp", 50.0)

    def seconds(gpu: str, precision: str, batch: int) -> float:
        return {"v100": 0.025, "a100": 0.010}[gpu]  # the model: v100 25 ms, a100 10 ms (measured: 2x the model)

    whole = predict(profile, "a100", 128, "amp", [point], model_s=seconds)
    assert whole.step_ms == pytest.approx(20.0)  # the whole ratio
    alike = predict(profile, "a100", 128, "amp", [point], model_s=seconds, host_share=lambda g, p, b: 0.4)
    assert alike.step_ms == pytest.approx(20.0)
    # the v100 step all GPU, the a100 step all host: the v100's departure is the GPU's, the a100's step the model's
    shares = {"v100": 0.0, "a100": 1.0}
    apart = predict(profile, "a100", 128, "amp", [point], model_s=seconds, host_share=lambda g, p, b: shares[g])
    assert apart.step_ms == pytest.approx(10.0)
    assert apart.relative == whole.relative  # the interval is the held-out width of the same kind of question
    assert "0% of its departure from the model kept" in apart.basis and "departure" not in whole.basis
    # another precision, or the same GPU at another batch: the whole ratio (what held-out data has tested)
    same = predict(profile, "v100", 256, "amp", [point], model_s=seconds, host_share=lambda g, p, b: shares[g])
    assert same.step_ms == pytest.approx(50.0)
