"""Analytic model profiles against published figures, the cached JSON, and Keras' own parameter counts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from orchestrator.costmodel.profiles import (
    MODEL_NAMES,
    RESNET_SETS,
    UnknownModelError,
    build_profiles,
    get_profile,
    profiles_document,
    profiles_path,
)

REPO = Path(__file__).resolve().parent.parent


def test_resnet56_matches_published_figures() -> None:
    # He et al. 2016 / pruning literature: ResNet-56 (CIFAR) ~0.85M parameters, ~125M FLOPs -- the
    # "FLOPs" there are multiply-accumulates. Our 1x1 projection shortcuts add ~3k parameters.
    p = get_profile("resnet_cifar_56")
    assert p.params == pytest.approx(0.85e6, rel=0.01)
    assert p.macs == pytest.approx(125.5e6, rel=0.01)
    assert p.flops > 2 * p.macs  # FLOPs = 2 x MACs + element-wise work


def test_vgg16_imagenet_matches_published_figures() -> None:
    p = get_profile("vgg16")
    assert p.total_params == 138_357_544  # keras.applications.VGG16(weights=None).count_params()
    assert p.macs == pytest.approx(15.47e9, rel=0.01)  # the "15.5 GFLOPs" usually quoted are MACs
    assert p.flops == pytest.approx(2 * 15.47e9, rel=0.01)


def test_transformer_base_matches_published_figures() -> None:
    p = get_profile("transformer_base")
    assert p.params == pytest.approx(65e6, rel=0.05)  # Vaswani et al. 2017, Table 3: 65M
    # Forward ~2 FLOPs per weight per token it touches: encoder weights x 128 source tokens, decoder weights
    # x 128 target tokens, the tied 37000 x 512 output projection x 128 target tokens; attention adds ~4%.
    enc, dec = 6 * 3_152_384, 6 * 4_204_032
    assert enc + dec + 37000 * 512 == p.params
    assert p.flops == pytest.approx(2 * 128 * (enc + dec + 37000 * 512), rel=0.06)


def test_cached_json_is_up_to_date() -> None:
    on_disk = json.loads(profiles_path().read_text())
    fresh = json.loads(json.dumps(profiles_document(build_profiles())))
    assert on_disk == fresh, "run: python -m orchestrator.costmodel.profiles --write"
    assert set(on_disk["models"]) == set(MODEL_NAMES)


def test_unknown_model_lists_known_ones() -> None:
    with pytest.raises(UnknownModelError, match="resnet_cifar_32"):
        get_profile("resnet_9000")


def test_activation_memory_and_totals_are_consistent() -> None:
    for name in MODEL_NAMES:
        p = get_profile(name)
        assert p.param_bytes == 4 * p.total_params
        assert p.activation_bytes > p.input_bytes
        assert all(layer.flops >= 2 * layer.macs for layer in p.layers)


def test_resnet_profiles_match_the_keras_models() -> None:
    pytest.importorskip("tensorflow")
    sys.path.insert(0, str(REPO / "jobs"))
    try:
        from tfjob.models import build_model
    finally:
        sys.path.remove(str(REPO / "jobs"))
    for name in RESNET_SETS:
        model = build_model(name, (32, 32, 3), 10)
        prof = get_profile(name)
        assert model.count_params() == prof.total_params, name
        trainable = sum(int(v.numpy().size) for v in model.trainable_variables)
        assert trainable == prof.params, name
        # Same variables, same shapes (the PS sharding works on these).
        keras_shapes = sorted(tuple(int(d) for d in v.shape) for v in model.variables)
        ours = sorted(v.shape for v in prof.variables)
        assert keras_shapes == ours, name
