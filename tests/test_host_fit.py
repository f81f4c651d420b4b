"""host_fit: each machine's host time and GPU scales, fitted on other models' rows (no torch needed)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from orchestrator.costmodel import host_fit
from orchestrator.costmodel.compute import RUNTIME_PRIORS
from orchestrator.costmodel.crossgpu import ClassWork, gpu_parts

PRIOR = RUNTIME_PRIORS["pytorch-eager"]


def _work(layers: int, flops: float, depthwise: int = 0) -> ClassWork:
    """``layers`` layers, the first ``depthwise`` of them depthwise convolutions (few FLOPs per byte)."""
    one = np.ones(layers)
    dw = (np.arange(layers) < depthwise).astype(np.float64)
    tensor = one * flops * (1 - 0.99 * dw)
    return ClassWork(tensor, tensor, one * flops / 20, one * flops / 10, one * 1e5,
                     tuple(f"l{i}" for i in range(layers)), one * 3, dw if depthwise else None)


def _machine(gpu: str, overhead: float, per_kernel: float, cs: float, ms: float, work: ClassWork,
             kernels: float, ds: float = 1.0, precision: str = "tf32") -> float:
    c, m, d = gpu_parts(work, gpu, precision, 12)
    return overhead + per_kernel * kernels + cs * c + ms * m + ds * d


def test_a_machine_s_host_and_scales_come_back_from_other_models() -> None:
    truth = {"v100": (1e-3, 60e-6, 1.5, 0.8), "a100": (2e-3, 40e-6, 0.7, 1.3)}  # host-heavy, off the prior
    models = [(_work(n, f), 3.0 * n) for n in (20, 60, 150, 300) for f in (1e8, 1e9, 4e9)]
    samples = [host_fit.sample(w, k, g, "tf32", 12, _machine(g, *t, w, k)) for g, t in truth.items()
               for w, k in models]
    fits = host_fit.fit_machines(samples, PRIOR)
    assert set(fits) == {("v100", "tf32"), ("a100", "tf32")}
    for g, t in truth.items():
        f = fits[(g, "tf32")]
        assert f.points == len(models)
        # a new model (not among the fitted ones) on this machine, within 5%: the host per kernel is learnt
        w, k = _work(100, 2e9), 300.0
        assert abs(host_fit.machine_step_s(w, k, g, "tf32", 12, fits, PRIOR) / _machine(g, *t, w, k) - 1) < 0.05
        assert abs(f.per_kernel_s / t[1] - 1) < 0.25
    # a machine without rows (or with fewer than MIN_POINTS) and no measured machine at its precision keeps
    # the runtime prior's host
    assert ("h100", "tf32") not in fits
    few = host_fit.fit_machines(samples[: host_fit.MIN_POINTS - 1], PRIOR)
    assert few == {}
    w = _work(100, 2e9)
    c, m, d = gpu_parts(w, "h100", "tf32", 12)
    assert d == 0.0
    assert host_fit.machine_step_s(w, 300.0, "h100", "tf32", 12, few, PRIOR) == host_fit.smooth_max(
        PRIOR.host_s(300.0), c + m)
    # with other machines measured (and none of its architecture): their host time, the committed GPU time
    other = host_fit.fit_for(fits, "h100", "tf32")
    assert other is not None and (other.compute_scale, other.memory_scale) == (1.0, 1.0)
    v, a = fits[("v100", "tf32")], fits[("a100", "tf32")]
    assert abs(other.overhead_s / (v.overhead_s * a.overhead_s) ** 0.5 - 1) < 1e-9
    # the same step as the fit's own sum, up to the order the layers are summed in (stepmodel.machine_curve)
    assert host_fit.machine_step_s(w, 300.0, "h100", "tf32", 12, fits, PRIOR) == pytest.approx(
        other.step_s(300.0, c, m), rel=1e-12)


def test_a_gpu_never_measured_takes_the_fit_of_its_architecture() -> None:
    truth = (3e-3, 50e-6, 1.2, 0.8)
    models = [(_work(n, f), 3.0 * n) for n in (20, 60, 150, 300) for f in (1e8, 1e9, 4e9)]
    fits = host_fit.fit_machines([host_fit.sample(w, k, "h100", "tf32", 12, _machine("h100", *truth, w, k))
                                  for w, k in models], PRIOR)
    assert host_fit.fit_for(fits, "h200", "tf32") is fits[("h100", "tf32")]  # Hopper, like the H100
    # another precision: the host carries (the CPU's and software's time), the GPU scales do not
    amp = host_fit.fit_for(fits, "h200", "amp")
    assert amp is not None and amp.overhead_s == fits[("h100", "tf32")].overhead_s
    assert (amp.compute_scale, amp.memory_scale, amp.points) == (1.0, 1.0, 0)
    assert host_fit.fit_for({}, "h200", "amp") is None
    other = host_fit.fit_for(fits, "a100", "tf32")  # another architecture: the host alone
    assert other is not None and other.overhead_s == fits[("h100", "tf32")].overhead_s
    assert (other.compute_scale, other.memory_scale) == (1.0, 1.0)
    w, k = _work(100, 2e9), 300.0
    c, m, _ = gpu_parts(w, "h200", "tf32", 12)
    f = fits[("h100", "tf32")]
    assert host_fit.machine_step_s(w, k, "h200", "tf32", 12, fits, PRIOR) == pytest.approx(f.step_s(k, c, m), rel=1e-12)


def test_depthwise_convolutions_get_a_scale_of_their_own() -> None:
    """A machine that runs depthwise convolutions 12x slower than the roofline (the Titan Xp's 16-bit
    MNASNet): fitted on other models, some with depthwise layers, a new depthwise model comes within 5%,
    where one scale for every memory-bound layer cannot; a machine whose rows hold no depthwise layer scales
    them as its other memory-bound layers (as before the depthwise scale)."""
    truth = (2e-3, 50e-6, 0.9, 1.4)
    models = [(_work(n, f, dw), 3.0 * n) for n in (20, 60, 150) for f in (1e8, 1e9) for dw in (0, n // 4)]
    samples = [host_fit.sample(w, k, "titanxp", "amp", 12, _machine("titanxp", *truth, w, k, 12.0, "amp"))
               for w, k in models]
    fit = host_fit.fit_machines(samples, PRIOR)[("titanxp", "amp")]
    assert 9.0 < fit.depthwise_scale < 15.0
    w, k = _work(100, 5e8, 30), 300.0
    truth_s = _machine("titanxp", *truth, w, k, 12.0, "amp")
    assert abs(host_fit.machine_step_s(w, k, "titanxp", "amp", 12, {("titanxp", "amp"): fit}, PRIOR) / truth_s
               - 1) < 0.05
    c, m, d = gpu_parts(w, "titanxp", "amp", 12)
    assert d > 0 and gpu_parts(_work(100, 5e8), "titanxp", "amp", 12)[2] == 0.0
    one_scale = host_fit.fit_machines([host_fit.Sample(s.gpu, s.precision, s.kernels, s.compute_s,
                                                       s.memory_s + s.depthwise_s, s.step_s) for s in samples],
                                      PRIOR)[("titanxp", "amp")]
    assert abs(one_scale.step_s(k, c, m + d) / truth_s - 1) > 0.05
    plain = [(_work(n, f), 3.0 * n) for n in (20, 60, 150) for f in (1e8, 1e9)]
    none = host_fit.fit_machines([host_fit.sample(w, k, "a100", "tf32", 12, _machine("a100", *truth, w, k))
                                  for w, k in plain], PRIOR)[("a100", "tf32")]
    assert abs(none.depthwise_scale / none.memory_scale - 1) < 1e-3 and abs(none.memory_scale / 1.4 - 1) < 0.2


def test_a_machine_s_host_share_is_its_fitted_host_over_the_step() -> None:
    truth = (3e-3, 50e-6, 1.2, 0.8)
    models = [(_work(n, f), 3.0 * n) for n in (20, 60, 150, 300) for f in (1e8, 1e9, 4e9)]
    fits = host_fit.fit_machines([host_fit.sample(w, k, "v100", "tf32", 12, _machine("v100", *truth, w, k))
                                  for w, k in models], PRIOR)
    f = fits[("v100", "tf32")]
    small, big = (_work(100, 1e6), 300.0), (_work(100, 4e10), 300.0)
    for w, k in (small, big):
        c, m, d = gpu_parts(w, "v100", "tf32", 12)
        host = f.host_s(k)
        share = host_fit.machine_host_share(w, k, "v100", "tf32", 12, fits, PRIOR)
        assert share == pytest.approx(host / f.step_s(k, c, m, d))  # additive (OVERLAP 1): host / step
    assert host_fit.machine_host_share(*small, "v100", "tf32", 12, fits, PRIOR) > 0.9
    assert host_fit.machine_host_share(*big, "v100", "tf32", 12, fits, PRIOR) < 0.1
    # no fit at all: the runtime prior's host against the committed GPU time, as machine_step_s takes them
    assert 0.0 < host_fit.machine_host_share(*big, "v100", "tf32", 12, {}, PRIOR) < 1.0


def test_plan_steps_a_users_model_through_the_calibrations_machine_fits_as_model_predict_does() -> None:
    """One model of a user's step: `model calibrate` fits host_fit's machines on the eager rows and stores them
    with the calibration; the planner's step_fn of a `torch:` model is host_fit.machine_step_s under them."""
    from orchestrator.costmodel.calibration import fit_report, load_measurements
    from orchestrator.costmodel.compute import Calibration, layer_arrays, model_profile
    from orchestrator.costmodel.crossgpu import class_work
    from orchestrator.costmodel.profiles.user import register_profile
    from orchestrator.costmodel.stepmodel import step_fn
    from orchestrator.model.catalog import load_catalog
    from orchestrator.model.paths import data_dir

    calib = fit_report(load_measurements(data_dir() / "measurements")).calibration
    fits = calib.machine_fits("pytorch-eager")
    assert set(fits) == {("h100", "fp32"), ("h100", "bf16")} and fits[("h100", "fp32")].points == 32
    assert calib.machine_fits("pytorch-eager+torchjob") is fits  # the payload's too few rows: eager's machines
    again = Calibration.from_json(calib.to_json())
    assert again.machine_fits("pytorch-eager") == fits

    name = "torch:tests.users:model"  # any profile, registered under a user model's name
    register_profile(replace(model_profile("resnet_cifar_56"), name=name), persist=False)
    work, kernels = class_work(model_profile(name)), layer_arrays(name).kernel_count("pytorch-eager", "fp32")
    for gpu in ("h100", "h200", "a100"):  # its own fit, its architecture's, the measured machines' host
        planned = step_fn(name, gpu, again, load_catalog(), "pytorch-eager", "fp32").at(64.0)
        assert planned == pytest.approx(host_fit.machine_step_s(work, kernels, gpu, "fp32", 64, fits, PRIOR))
    assert again.describe("a100", "pytorch-eager", name).endswith("machine fit host of h100/fp32 (pytorch-eager)")
    # no machine at tf32: the measured machines' host at the other precisions (machine_fit.fit_for)
    assert again.describe("a100", "pytorch-eager", name, "tf32").endswith(
        "machine fit host of h100/bf16, h100/fp32 (pytorch-eager)")
