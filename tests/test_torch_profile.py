"""Profiling a user's PyTorch model on the meta device, predicting it across GPUs, and planning with it."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from orchestrator.costmodel.crossgpu import (  # noqa: E402
    Point,
    arch_gpu,
    gpu_seconds,
    layer_memory_bytes,
    layer_times,
    load_arch,
    predict,
)
from orchestrator.costmodel.profiles import ModelProfile  # noqa: E402
from orchestrator.profiler.cache import torch_profile  # noqa: E402
from orchestrator.profiler.torch_profile import ProfileError, load_factory, profile_factory  # noqa: E402
from tests.cli_inproc import run_cli  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODELS = "examples/own-script/models.py"
SMALL = f"{MODELS}:transformer_small"


def run(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "COLUMNS": "200", "ORCHESTRATOR_HOME": str(home)},
                          timeout=300)


def run_here(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """The same answer from this interpreter (tests/cli_inproc.py): no fresh interpreter's imports per call."""
    return run_cli(args, {**os.environ, "COLUMNS": "200", "ORCHESTRATOR_HOME": str(home)}, REPO)


@pytest.fixture(scope="module")
def resnet50() -> ModelProfile:
    return profile_factory(load_factory(f"{REPO}/{MODELS}:resnet50"))


def test_resnet50_flops_match_the_published_count(resnet50: ModelProfile) -> None:
    # torchvision's docs: ResNet50_Weights.IMAGENET1K_V1 "GFLOPS 4.09" (multiply-adds), 25,557,032 params
    assert resnet50.params == 25_557_032
    assert abs(resnet50.macs / 4.09e9 - 1) < 0.05
    # per example: the difference of two batches, so a layer's figures do not depend on the batch
    conv1 = next(layer for layer in resnet50.layers if layer.name == "conv1")
    assert conv1.macs == 112 * 112 * 64 * 7 * 7 * 3 and conv1.kind == "conv"
    tensor = sum(w.flops for layer in resnet50.layers for w in layer.train_ops if w.op_class == "tensor")
    assert 2.9 < tensor / (2 * resnet50.macs) < 3.1  # backward = data + weight gradients = 2x forward
    assert all(w.op_class == "vector" for w in next(x for x in resnet50.layers if x.name == "bn1").train_ops)


def test_a_grouped_convolution_weight_gradient_costs_its_forward(tmp_path: Path) -> None:
    # torch's flop formula counts a grouped conv's weight gradient as a dense conv's (x groups)
    (tmp_path / "dw.py").write_text(
        "import torch\n"
        "def build(batch):\n"
        "    return torch.nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False), (torch.randn(batch, 64, 8, 8),)\n")
    p = profile_factory(load_factory(f"{tmp_path}/dw.py:build"))
    assert p.macs == 8 * 8 * 64 * 3 * 3
    tensor = sum(w.flops for layer in p.layers for w in layer.train_ops if w.op_class == "tensor")
    assert tensor == 2 * 2 * p.macs  # forward and weight gradient (the input needs none); torch alone: 65x


def test_depthwise_convolutions_are_marked_and_survive_the_cache(tmp_path: Path) -> None:
    # host_fit scales depthwise layers apart (their kernels' speed varies by machine like no other layer's)
    (tmp_path / "mix.py").write_text(
        "import torch\n"
        "def build(batch):\n"
        "    net = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=8),\n"
        "                              torch.nn.Conv2d(8, 16, 3, padding=1, groups=2),\n"
        "                              torch.nn.Conv2d(16, 16, 1))\n"
        "    return net, (torch.randn(batch, 8, 8, 8),)\n")
    p = profile_factory(load_factory(f"{tmp_path}/mix.py:build"))
    assert [(layer.name, layer.depthwise) for layer in p.layers if layer.kind == "conv"] == [
        ("0", True), ("1", False), ("2", False)]  # grouped but not depthwise: an ordinary convolution
    assert ModelProfile.from_dict(json.loads(json.dumps(p.to_dict()))).layers == p.layers
    assert "depthwise" not in p.layers[1].to_dict()  # profiles without one are written as before
    out = run("model", "profile", "--torch", f"{tmp_path}/mix.py:build", "--json", home=tmp_path / "home")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["totals"]["depthwise_layers"] == 1 and doc["layers"][0]["depthwise"] is True


def test_a_profile_does_not_depend_on_the_hash_seed() -> None:
    # a tie between two modules open in backward once went to set order (PYTHONHASHSEED)
    code = ("import hashlib, sys; from orchestrator.profiler.torch_profile import load_factory, profile_factory; "
            f"p = profile_factory(load_factory('{REPO}/{SMALL}')); "
            "print(hashlib.sha256(repr([x.to_dict() for x in p.layers]).encode()).hexdigest())")
    out = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True,
                          env={**os.environ, "PYTHONHASHSEED": seed}, timeout=300).stdout for seed in ("1", "2")}
    assert len(out) == 1


def test_small_transformer_flops_match_an_independent_count() -> None:
    p = profile_factory(load_factory(f"{REPO}/{SMALL}"))
    seq, d, layers, vocab = 128, 256, 4, 8192
    macs = layers * (seq * 12 * d * d + 2 * seq * seq * d) + seq * d * vocab  # qkv+out+mlp, QK^T and AV, head
    assert abs(p.macs / macs - 1) < 0.05
    assert p.params == 7_123_456


def test_profiles_are_cached_by_content(tmp_path: Path) -> None:
    src = tmp_path / "mine.py"
    src.write_text("import torch\nfrom torch import nn\n"
                   "def build(batch):\n    return nn.Linear(64, 32), (torch.randn(batch, 64),)\n")
    first, cached = torch_profile(f"{src}:build")
    assert not cached and first.macs == 64 * 32
    assert torch_profile(f"{src}:build")[1]
    src.write_text(src.read_text().replace("32", "16"))
    second, cached = torch_profile(f"{src}:build")
    assert not cached and second.macs == 64 * 16


def test_bad_factories_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="MODULE:FACTORY"):
        load_factory("nocolon")
    with pytest.raises(ProfileError, match="does not exist"):
        load_factory(f"{tmp_path}/none.py:build")
    (tmp_path / "bad.py").write_text("def build(batch):\n    return 1, 2\n")
    with pytest.raises(ProfileError, match="must return"):
        profile_factory(load_factory(f"{tmp_path}/bad.py:build"))


def test_layer_times_and_memory_per_layer(resnet50: ModelProfile) -> None:
    times = layer_times(resnet50, "a100", "amp", 64)
    assert len(times) == len(resnet50.layers) and all(t >= 0 for t in times)
    assert sum(times) == pytest.approx(gpu_seconds(resnet50, "a100", "amp", 64))
    assert sum(layer_times(resnet50, "v100", "fp32", 64)) > sum(times)  # tensor cores and half the bytes
    assert len(layer_memory_bytes(resnet50, 64)) == len(resnet50.layers)


def test_one_measured_point_predicts_another_gpu(resnet50: ModelProfile) -> None:
    # Lambda's table (../shared/public-throughput): ResNet-50 v1.5 fp16, V100 32 GB 828 img/s at batch 596
    point = Point("V100-32GB", 596, "amp", 596 / 828 * 1e3)
    pred = predict(resnet50, "A100-40GB-SXM", 768, "amp", [point])
    assert pred.kind == "other-gpu" and pred.low_ms < pred.step_ms < pred.high_ms
    truth = 768 / 1211 * 1e3  # the same table's A100 40 GB SXM row
    assert abs(pred.step_ms / truth - 1) < 0.5
    alone = predict(resnet50, "a100", 768, "amp")
    assert alone.kind == "none" and alone.relative > pred.relative


def test_gpu_facts_agree_with_the_catalog() -> None:
    with (REPO / "data" / "gpus.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            g = load_arch()[row["key"]]
            assert (g.fp32_tflops, g.fp16_tflops, g.memory_bw_gbs) == (
                float(row["fp32_tflops"]), float(row["fp16_tflops"]), float(row["memory_bw_gbs"])), row["key"]
    assert all(g.source_url.startswith("https://") for g in load_arch().values())
    assert arch_gpu("a100-40gb-sxm").key == "a100"


def test_cli_profile_predict_and_plan(tmp_path: Path) -> None:
    # The console script once (the profile in a fresh interpreter); the rest in process.
    out = run("model", "profile", "--torch", SMALL, "--json", home=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["name"] == f"torch:{SMALL}" and doc["totals"]["params"] == 7_123_456
    assert any(layer.get("train_ops") for layer in doc["layers"])

    measured = tmp_path / "m.csv"
    measured.write_text("gpu,framework,runtime,model,depth,batch,precision,step_ms\n"
                        f"v100,pytorch,pytorch-eager,{SMALL},,64,amp,40.0\n")
    out = run_here("model", "predict", "--torch", SMALL, "--gpu", "a100", "--batch", "64", "--precision", "amp",
              "--runtime", "pytorch-eager", "--measurements", str(measured), "--json", home=tmp_path)
    assert out.returncode == 0, out.stderr
    pred = json.loads(out.stdout)
    assert pred["kind"] == "other-gpu" and 0 < pred["low_ms"] < pred["step_ms"] < pred["high_ms"] < 40.0
    # no other model's rows in the file: the machines of the calibration `plan` uses (the shipped one's H100)
    assert set(pred["machine_fits"]) == {"h100/fp32", "h100/bf16"}
    assert pred["machine_fits_from"] == "calibration measured-2026-11-28"

    # other models' rows on both machines: each machine's host time is fitted on them (host_fit), and a
    # slow host on the target (4x the measured GPU's per batch) carries into the prediction
    other = f"{MODELS}:resnet50"
    with measured.open("a") as fh:
        for b, ms in ((8, 30.0), (16, 32.0), (32, 36.0)):
            fh.write(f"v100,pytorch,pytorch-eager,{other},,{b},amp,{ms}\n")
            fh.write(f"a100,pytorch,pytorch-eager,{other},,{b},amp,{4 * ms}\n")
        fh.write("a100,pytorch,pytorch-eager,nonexistent_model,,8,amp,1.0\n")
    out = run_here("model", "predict", "--torch", SMALL, "--gpu", "a100", "--batch", "64", "--precision", "amp",
              "--runtime", "pytorch-eager", "--measurements", str(measured), "--json", home=tmp_path)
    assert out.returncode == 0, out.stderr
    fitted = json.loads(out.stdout)
    assert set(fitted["machine_fits"]) == {"v100/amp", "a100/amp"} and fitted["skipped_models"] == [
        "nonexistent_model"]
    assert fitted["machine_fits"]["v100/amp"]["points"] == 4  # resnet50's 3 rows and the model's own
    assert fitted["step_ms"] > 2 * pred["step_ms"]

    out = run_here("model", "predict", "--torch", SMALL, "--gpu", "a100", "--batch", "64", "--precision", "int3",
              home=tmp_path)
    assert out.returncode == 2 and "precision" in out.stderr and "Traceback" not in out.stderr

    out = run_here("plan", "examples/gce-own-model.yaml", "--json", home=tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["model"] == "torch:own-script/models.py:transformer_small"  # as the spec names it
    assert plan["prediction_interval"]["kind"] == "none" and plan["prediction_interval"]["relative"] > 0
