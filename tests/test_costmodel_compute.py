"""Step-time model (host overhead vs occupancy-limited roofline), calibration in physical bounds, priors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.core.costmodel import (
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
)
from orchestrator.core.costmodel.calibration import fit_report, predict
from orchestrator.core.costmodel.compute import SMOOTH_MAX_P, step_fn
from orchestrator.core.paths import data_dir

TRUTH = Calibration(default=Efficiency(0.42, 0.7, 0.004, 30e-6, None), net=NetParams(net_efficiency=0.5))
MODELS = ("resnet_tiny", "resnet_cifar_15", "resnet_cifar_56")
BATCHES = (16, 64, 256, 1024)


def synthetic(gpus: tuple[str, ...], noise: float = 0.02, seed: int = 0) -> list[Measurement]:
    rng = np.random.default_rng(seed)
    return [
        Measurement(m, g, b, predict_step_time(m, g, b, TRUTH) * float(np.exp(rng.normal(0, noise))))
        for g in gpus
        for m in MODELS
        for b in BATCHES
    ]


def test_step_time_blends_host_overhead_and_gpu_work() -> None:
    fn = step_fn("resnet_cifar_32", "h100", TRUTH)
    for b in (1, 128, 4096):
        gpu = float(fn.gpu_s(b)[0])
        expected = (fn.host_s**SMOOTH_MAX_P + gpu**SMOOTH_MAX_P) ** (1 / SMOOTH_MAX_P)
        assert fn.at(b) == pytest.approx(expected, rel=1e-12)
        assert fn.at(b) >= max(fn.host_s, gpu)
    assert fn.host_s == pytest.approx(0.004 + 30e-6 * 115)  # ResNet-32: 115 profile layers
    # Overhead-bound at small batch (flat), work-bound at large batch (close to linear).
    assert fn.at(64) / fn.at(32) < 1.05
    assert fn.at(8192) / fn.at(4096) > 1.8


def test_step_time_increases_with_batch_and_faster_gpus_are_faster() -> None:
    t = step_fn("resnet_cifar_56", "p100", TRUTH).table(2048)
    assert np.all(np.diff(t) >= 0)
    assert predict_step_time("resnet_cifar_56", "v100", 512, TRUTH) < predict_step_time(
        "resnet_cifar_56", "k80", 512, TRUTH
    )


def test_efficiencies_above_the_datasheet_are_refused_and_never_fitted() -> None:
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        Efficiency(1.07, 0.5, 0.001)
    impossible = [Measurement("resnet_cifar_56", "k80", b, predict_step_time("resnet_cifar_56", "k80", b) / 20)
                  for b in (64, 256, 1024)]
    fitted = fit_calibration(impossible).for_gpu("k80")
    assert fitted.eff_compute <= 1.0 and fitted.eff_memory <= 1.0


def test_calibration_round_trips_through_json(tmp_path: Path) -> None:
    cal = Calibration(
        Efficiency(0.3, 0.5, 0.01), {"k80/tf1-graph": Efficiency(0.2, 0.4, 0.02, 1e-5, 12.0)}, NetParams(0.6),
        "x", "s", 0.1, {"k80/tf1-graph": 4}, emulated=True,
    )
    cal.save(tmp_path / "c.json")
    back = load_calibration(tmp_path / "c.json")
    assert back == cal and back.describe("k80").endswith("(4 measured points)")


def test_one_point_uses_priors_and_says_so() -> None:
    one = [Measurement("resnet_cifar_32", "h100", 128, 0.0134, runtime="pytorch-eager")]
    rep = fit_report(one)
    assert any("1 measured point(s) for 5 parameters" in w for w in rep.warnings)
    assert predict(one[0], rep.calibration) == pytest.approx(0.0134, rel=0.02)


def test_synthetic_truth_is_recovered_for_held_out_gpus() -> None:
    v = leave_one_gpu_out(synthetic(("k80", "p100", "v100")))
    assert {p.gpu for p in v.per_gpu} == {"k80", "p100", "v100"}
    assert v.in_sample_mape < 0.04 and v.mape < 0.10


def test_real_h100_curve_in_sample() -> None:
    # Real data (../shared/measurements via data/measurements): the model has the shape real GPUs show.
    rows = [m for m in load_measurements(data_dir() / "measurements")
            if m.is_compute and m.key == "pytorch-eager" and m.model == "resnet_cifar_32"]
    assert len(rows) == 7
    cal = fit_calibration(rows)
    errs = [abs(predict(m, cal) / float(m.step_time_s or 1) - 1) for m in rows]
    assert max(errs) < 0.10


def test_measurements_csv_formats_and_emulated_kept_apart(tmp_path: Path) -> None:
    lines = ["model,gpu,batch,step_time_s,ps_count,workers,steps_per_s,ps_machine_type"]
    for m in synthetic(("k80",), noise=0.0):
        lines.append(f"{m.model},{m.gpu},{m.batch},{m.step_time_s},,,,")
    for workers in (2, 6, 10):
        rate = cluster_steps_per_s("resnet_cifar_56", ["k80"] * workers, [64] * workers, 1, "n1-standard-4",
                                   "async", TRUTH)
        lines.append(f"resnet_cifar_56,K80,64,,1,{workers},{rate},n1-standard-4")
    path = tmp_path / "m.csv"
    path.write_text("\n".join(lines) + "\n")
    rows = load_measurements(path)
    assert sum(m.is_cluster for m in rows) == 3 and rows[-1].gpu == "k80"
    fitted = fit_calibration(rows)
    for m in rows[-3:]:
        n = m.workers or 0
        pred = cluster_steps_per_s(m.model, ["k80"] * n, [64] * n, 1, "n1-standard-4", "async", fitted)
        assert pred == pytest.approx(m.steps_per_s, rel=0.05)
    new = tmp_path / "n.csv"
    new.write_text("gpu,runtime,model,batch,precision,step_ms,emulated,source\n"
                   "h100,pytorch-eager,resnet_cifar_32,128,bf16,19.0,0,x\nk80,tf1-graph,resnet_tiny,32,fp32,300,1,y\n")
    a, b = load_measurements(new)
    assert a.key == "pytorch-eager+bf16" and a.step_time_s == pytest.approx(0.019) and b.emulated
    with pytest.raises(ValueError, match="emulated"):
        fit_calibration([a, b])
    bad = tmp_path / "bad.csv"
    bad.write_text("model,gpu,batch\nresnet_tiny,k80,32\n")
    with pytest.raises(ValueError, match="bad.csv:2"):
        load_measurements(bad)
