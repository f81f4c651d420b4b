"""Step-time model (host overhead per kernel vs occupancy-limited roofline), calibration in physical
bounds, priors, GPU parameters shared across runtimes, PS round trips inside measured TF steps."""

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
)
from orchestrator.costmodel.calibration import comm_s, fit_report, predict
from orchestrator.costmodel.compute import REFERENCE_ELEMENTS, SMOOTH_MAX_P, layer_arrays, model_profile, prior_for
from orchestrator.costmodel.memory import MemoryParams, memory_bytes, needed_activation_bytes
from orchestrator.costmodel.stepmodel import step_fn
from orchestrator.model.catalog import load_catalog
from orchestrator.model.paths import data_dir

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
    # ResNet-32 launches 266 kernels a step: 33 convs x 3, 33 batch norms x 2, 31 ReLUs x 2, 15 adds x 2,
    # pooling 2, dense 3, softmax + cross-entropy 4.
    assert layer_arrays("resnet_cifar_32").kernel_count() == 266
    assert fn.host_s == pytest.approx(0.004 + 30e-6 * 266)
    # Overhead-bound at small batch (flat), work-bound at large batch (close to linear).
    assert fn.at(64) / fn.at(32) < 1.05
    assert fn.at(8192) / fn.at(4096) > 1.8


def test_host_overhead_is_per_kernel_and_fusing_runtimes_launch_fewer() -> None:
    # Twelve more basic blocks (ResNet-32 -> 56): each launches 2 convs x 3 + 2 BN x 2 + 2 ReLU x 2 + add x 2.
    k32, k56 = layer_arrays("resnet_cifar_32"), layer_arrays("resnet_cifar_56")
    assert k56.kernel_count() - k32.kernel_count() == 12 * 16
    # torch.compile / XLA fold ReLUs and adds into their neighbours: 10 kernels a block.
    assert k56.kernel_count("torch-compile") - k32.kernel_count("torch-compile") == 12 * 10
    eff = Efficiency(0.4, 0.6, 0.002, 20e-6)
    eager = step_fn("resnet_cifar_32", "h100", Calibration(per_gpu={"*/pytorch-eager": eff}), runtime="pytorch-eager")
    fused = step_fn("resnet_cifar_32", "h100", Calibration(per_gpu={"*/torch-compile": eff}), runtime="torch-compile")
    assert fused.host_s < eager.host_s and fused.gpu_s(1024)[0] < eager.gpu_s(1024)[0]  # fewer passes over memory


def test_occupancy_is_per_layer_small_stages_need_bigger_batches() -> None:
    fn = step_fn("resnet_cifar_32", "h100", TRUTH)
    arrays = layer_arrays("resnet_cifar_32")
    stage1 = arrays.elements == REFERENCE_ELEMENTS  # 32x32x16 layers
    stage3 = arrays.elements == REFERENCE_ELEMENTS / 4  # 8x8x64 layers
    assert stage1.any() and stage3.any()
    assert np.allclose(fn.h[stage3], 4 * fn.h[stage1][0]) and np.allclose(fn.h[stage1], fn.h[stage1][0])
    # A layer at batch b runs at b / (b + h) of its roofline rate: per-example time falls with the batch.
    per_example = fn.gpu_s(np.array([32.0, 4096.0])) / np.array([32.0, 4096.0])
    assert per_example[0] > per_example[1]


def test_any_cifar_resnet_depth_has_a_profile() -> None:
    p44 = model_profile("resnet_cifar_44")
    assert sum(layer.kind == "conv" for layer in p44.layers) == 43 + 2  # 6n+1 3x3 convs + 2 projections
    assert layer_arrays("resnet_cifar_44").layers == len(p44.layers)
    with pytest.raises(LookupError):
        model_profile("resnet_cifar_45")


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
    fitted, prior = rep.calibration.for_gpu("h100", "pytorch-eager"), prior_for("pytorch-eager")
    assert 0 < fitted.eff_compute <= 1 and 0 < fitted.eff_memory <= 1 and fitted.overhead_s >= 0
    # One host-bound point moves the host overhead; the GPU's efficiencies stay near their priors.
    assert fitted.eff_compute == pytest.approx(prior.eff_compute, rel=0.25)


def test_gpu_parameters_are_shared_across_runtimes_of_one_gpu() -> None:
    rows = [m for m in load_measurements(data_dir() / "measurements")
            if m.is_compute and m.gpu == "h100" and m.model == "resnet_cifar_32"]
    cal = fit_calibration(rows)
    eager, bf16, compiled = (cal.for_gpu("h100", k) for k in ("pytorch-eager", "pytorch-eager+bf16", "torch-compile"))
    assert eager.eff_compute == bf16.eff_compute == compiled.eff_compute
    assert eager.half_batch == bf16.half_batch == compiled.half_batch
    assert eager.overhead_per_kernel_s != compiled.overhead_per_kernel_s  # the runtime's own host cost


def test_steps_measured_in_a_ps_cluster_include_the_round_trip() -> None:
    base = Measurement("resnet_cifar_32", "k80", 128, 0.216)
    in_ps = Measurement("resnet_cifar_32", "k80", 128, 0.216, ps_count=1, workers=1, ps_machine_type="n1-standard-4")
    cal = Calibration()
    trip = comm_s(in_ps, cal, load_catalog())
    assert trip > 1e-3 and comm_s(base, cal, load_catalog()) == 0.0
    assert predict(in_ps, cal) == pytest.approx(predict(base, cal) + trip)


def test_spec_ratios_predict_a_held_out_2019_gpu() -> None:
    # ICAC'19 TF runs (ResNet-32, batch 128): fit two of K80 / P100 / V100, predict the third from its datasheet.
    v = leave_one_gpu_out([m for m in load_measurements(data_dir() / "measurements") if m.key == "tf1-graph"])
    assert {p.gpu for p in v.per_gpu} == {"k80", "p100", "v100"}
    assert all(p.mape < 0.10 for p in v.per_gpu)


def test_memory_keeps_what_backward_needs() -> None:
    prof = model_profile("resnet_cifar_56")
    # Per basic block, both convolutions' and both ReLUs' outputs are kept; batch-norm and add outputs not.
    blocks = [layer for layer in prof.layers if layer.name.startswith("s0b1_")]
    assert [layer.kind for layer in blocks] == ["conv", "batchnorm", "relu", "conv", "batchnorm", "add", "relu"]
    one_block = needed_activation_bytes(model_profile("resnet_cifar_56")) - needed_activation_bytes(
        model_profile("resnet_cifar_50"))
    assert one_block == 4 * (16384 + 8192 + 4096) * 4  # one block per stage, 4 tensors of each stage's size
    need = MemoryParams(needed_only=True)
    assert memory_bytes("resnet_cifar_56", 256, need) < memory_bytes("resnet_cifar_56", 256)  # default: every output


def test_synthetic_truth_is_recovered_for_held_out_gpus() -> None:
    v = leave_one_gpu_out(synthetic(("k80", "p100", "v100")))
    assert {p.gpu for p in v.per_gpu} == {"k80", "p100", "v100"}
    assert v.in_sample_mape < 0.04 and v.mape < 0.10


def test_real_h100_curve_in_sample() -> None:
    # Real data (../shared/measurements via data/measurements): the model has the shape real GPUs show.
    rows = [m for m in load_measurements(data_dir() / "measurements" / "h100-torch-resnet-cifar.csv")
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


def test_a_payloads_key_falls_back_to_its_runtimes_on_a_gpu_measured_only_in_that_runtime() -> None:
    from orchestrator.costmodel.compute import TORCHJOB_RUNTIME, base_runtime_key

    eager, payload = Efficiency(0.3, 0.5, 0.002, 2e-5), Efficiency(0.4, 0.6, 0.003, 3e-5)
    calib = Calibration(per_gpu={"v100/pytorch-eager": eager, "*/pytorch-eager+torchjob": payload,
                                 "v100/pytorch-eager+bf16": payload})
    assert calib.lookup("v100", TORCHJOB_RUNTIME) == ("v100/pytorch-eager", eager)  # this GPU's eager fit
    assert calib.lookup("t4", TORCHJOB_RUNTIME) == ("*/pytorch-eager+torchjob", payload)
    assert calib.lookup("t4", "pytorch-eager")[0] == "prior:pytorch-eager"
    assert base_runtime_key(f"{TORCHJOB_RUNTIME}+bf16") == "pytorch-eager+bf16"  # the precision stays
    assert calib.lookup("v100", f"{TORCHJOB_RUNTIME}+bf16")[0] == "v100/pytorch-eager+bf16"


def test_one_step_model_per_source() -> None:
    """A built-in profile takes the calibrated step model; its StepTime is step_fn's step with an interval around it
    and the worker's memory (costmodel/stepmodel.py)."""
    from orchestrator.costmodel.compute import DEFAULT_CALIBRATION
    from orchestrator.costmodel.stepmodel import CalibratedStep, cost_step_model

    steps = cost_step_model("resnet_cifar_32", DEFAULT_CALIBRATION)
    assert isinstance(steps, CalibratedStep) and steps.source == "calibrated"
    got = steps.step("resnet_cifar_32", "v100", 128, "fp32", "tf1-graph")
    assert got.mean_s == step_fn("resnet_cifar_32", "v100", DEFAULT_CALIBRATION).at(128.0)
    assert got.interval_s[0] < got.mean_s < got.interval_s[1] and got.memory_gb > 0
