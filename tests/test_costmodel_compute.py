"""Compute model, calibration (synthetic data with known efficiencies) and leave-one-GPU-out validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.costmodel import (
    Calibration,
    Efficiency,
    Measurement,
    NetParams,
    cluster_steps_per_s,
    fit_calibration,
    leave_one_gpu_out,
    load_calibration,
    load_measurements,
    predict_step_time,
    relative_speed,
)
from orchestrator.costmodel.compute import layer_times, step_fn

TRUTH = Calibration(default=Efficiency(0.42, 0.7, 0.004), net=NetParams(net_efficiency=0.5))
MODELS = ("resnet_tiny", "resnet_cifar_15", "resnet_cifar_56")
BATCHES = (16, 64, 128, 256, 512)


def synthetic(gpus: tuple[str, ...], noise: float = 0.02, seed: int = 0) -> list[Measurement]:
    rng = np.random.default_rng(seed)
    return [
        Measurement(m, g, b, predict_step_time(m, g, b, TRUTH) * float(np.exp(rng.normal(0, noise))))
        for g in gpus
        for m in MODELS
        for b in BATCHES
    ]


def test_step_time_is_the_per_layer_roofline() -> None:
    for gpu, batch in [("k80", 1), ("v100", 37), ("h100", 512)]:
        comp, mem = layer_times("resnet_cifar_32", gpu, batch)
        expected = 0.005 + float(np.maximum(comp, mem).sum())
        assert predict_step_time("resnet_cifar_32", gpu, batch) == pytest.approx(expected, rel=1e-9)


def test_step_time_increases_with_batch_and_faster_gpus_are_faster() -> None:
    fn = step_fn("vgg16", "t4")
    table = fn.table(300)
    assert np.all(np.diff(table) > 0)
    assert (
        relative_speed("resnet_cifar_32", "v100", 128) > relative_speed("resnet_cifar_32", "p100", 128) > 1.0
    )
    assert relative_speed("resnet_cifar_32", "k80", 128) == pytest.approx(1.0)


def test_calibration_round_trips_through_json(tmp_path: Path) -> None:
    calib = Calibration(
        Efficiency(0.3, 0.5, 0.01), {"k80": Efficiency(0.2, 0.4, 0.02)}, NetParams(0.6), "x", "s", 0.1
    )
    path = tmp_path / "c.json"
    calib.save(path)
    assert load_calibration(path) == calib
    assert Calibration.from_dict(calib.to_dict()) == calib
    assert calib.for_gpu("K80").eff_compute == 0.2 and calib.for_gpu("v100") == calib.default


def test_one_measured_gpu_predicts_the_others_from_their_specs() -> None:
    fitted = fit_calibration(synthetic(("k80",)))
    assert fitted.default.eff_compute == pytest.approx(0.42, rel=0.05)
    assert fitted.default.eff_memory == pytest.approx(0.7, rel=0.05)
    assert fitted.default.overhead_s == pytest.approx(0.004, rel=0.1)
    for gpu in ("p100", "v100", "t4"):
        truth = synthetic((gpu,), noise=0.0)
        errors = [
            abs(predict_step_time(m.model, gpu, m.batch, fitted) / float(m.step_time_s) - 1) for m in truth
        ]
        assert float(np.mean(errors)) < 0.03, gpu


def test_per_gpu_efficiencies_are_fitted_where_data_exist() -> None:
    rows = synthetic(("k80", "v100"), noise=0.0)
    slow_v100 = [
        Measurement(m.model, m.gpu, m.batch, float(m.step_time_s) * (1.5 if m.gpu == "v100" else 1.0))
        for m in rows
    ]
    fitted = fit_calibration(slow_v100)
    assert set(fitted.per_gpu) == {"k80", "v100"}
    for m in slow_v100:
        assert predict_step_time(m.model, m.gpu, m.batch, fitted) == pytest.approx(
            float(m.step_time_s), rel=0.05
        )


def test_leave_one_gpu_out_mape_on_synthetic_data() -> None:
    v = leave_one_gpu_out(synthetic(("k80", "p100", "v100")))
    assert {p.gpu for p in v.per_gpu} == {"k80", "p100", "v100"}
    assert v.mape < 0.04 and v.in_sample_mape < 0.04


def test_measurements_csv_and_network_fit(tmp_path: Path) -> None:
    lines = ["model,gpu,batch,step_time_s,ps_count,workers,steps_per_s,ps_machine_type"]
    for m in synthetic(("k80",), noise=0.0):
        lines.append(f"{m.model},{m.gpu},{m.batch},{m.step_time_s},,,,")
    for workers in (2, 6, 10):
        rate = cluster_steps_per_s(
            "resnet_cifar_56", ["k80"] * workers, [64] * workers, 1, "n1-standard-4", "async", TRUTH
        )
        lines.append(f"resnet_cifar_56,K80,64,,1,{workers},{rate},n1-standard-4")
    path = tmp_path / "m.csv"
    path.write_text("\n".join(lines) + "\n")
    rows = load_measurements(path)
    assert sum(m.is_cluster for m in rows) == 3 and rows[-1].gpu == "k80"
    fitted = fit_calibration(rows)
    assert fitted.net.net_efficiency == pytest.approx(0.5, rel=0.1)
    bad = tmp_path / "bad.csv"
    bad.write_text("model,gpu,batch\nresnet_tiny,k80,32\n")
    with pytest.raises(ValueError, match="bad.csv:2"):
        load_measurements(bad)
