"""Analytic per-layer profiles of the supported models (pure Python, no TensorFlow).

Every figure is *per example* unless named otherwise, in fp32 (4 bytes a value):

* ``macs``: forward multiply-accumulates; ``flops``: forward floating-point operations, counted as
  2 per MAC plus the element-wise work (bias adds, batch-norm, ReLU, residual adds, softmax). The
  published "ResNet-56 has 125 MFLOPs" and "VGG-16 has 15.5 GFLOPs" figures are MAC counts; compare
  them with ``macs``, not ``flops``.
* ``read_bytes`` / ``write_bytes``: activation bytes the forward pass of the layer reads / writes.
* ``weight_bytes``: bytes of weights the layer reads each step (independent of the batch; a tied
  embedding is read by the layers that use it even though only one layer owns the variable).
* ``saved_bytes``: activation bytes kept for the backward pass (the layer's output).
* ``variables``: the variables the layer owns (name, shape, trainable), the unit of PS sharding.

Models (input, what one example is):

* ``resnet_tiny``, ``resnet_cifar_15/32/56``: exactly ``jobs/tfjob/models.py`` (He et al. 2016 sec. 4.2
  CIFAR ResNets, 32x32x3 input, 10 classes): 3x3 stem conv (no bias) + BN + ReLU, three stages of basic
  blocks (3x3 convs without bias, BN after each) with a 1x1 projection conv + BN on the shortcut when
  the stride or width changes, global average pooling and a dense layer with bias.
* ``resnet_cifar_20/110``: the same family at the depths measured on an H100 (data/measurements).
* ``shake_shake_small`` / ``shake_shake_big``: Shake-Shake-26 2x32d / 2x96d (Gastaldi 2017: 2.9M / 26.2M
  parameters), the ICAC'19 study's other CIFAR-10 models.
* ``vgg16``: the **ImageNet** VGG-16 (configuration D, 224x224x3 input, 1000 classes, fc 4096-4096-1000,
  ReLU fused into the conv/dense layers; as ``keras.applications.VGG16``: 138,357,544 parameters).
* ``gpt_1_5b``: a GPT-2 XL-shaped decoder-only transformer (48 layers, d_model 1600, 25 heads, 50,257-token
  tied embedding, 1.56 B parameters); one example = a sequence of 512 tokens. With Adam it fits no T4 or L4
  whole: the pipeline planner's test case.
* ``transformer_base``: Vaswani et al. 2017 base (6+6 layers, d_model 512, d_ff 2048, 8 heads,
  post-layer-norm, biases in every projection, shared 37,000-token source/target/pre-softmax embedding,
  sinusoidal positions); one example = a sentence pair of 128 source and 128 target tokens.

The parts: ``model`` (variables, layers, a model's totals), ``layers`` (layer builders), ``architectures``
(the models above, layer by layer); here, the registry and ``data/model_profiles.json``, the cache of them.

``python -m orchestrator.costmodel.profiles --write`` regenerates ``data/model_profiles.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.costmodel.profiles.architectures import (
    MEASURED_RESNETS,
    RESNET_SETS,
    SHAKE_SETS,
    gpt,
    resnet_cifar,
    shake_shake,
    transformer,
    vgg16,
)
from orchestrator.costmodel.profiles.model import BYTES_PER_VALUE, Layer, ModelProfile, OpWork, Variable
from orchestrator.costmodel.profiles.user import find_user_profile, is_user_model, register_profile
from orchestrator.model.names import did_you_mean
from orchestrator.model.paths import data_dir

PROFILES_FILE = "model_profiles.json"
PROFILES_VERSION = 1


class UnknownModelError(LookupError):
    """A model name without a profile; the message lists the known ones."""


# ---------------------------------------------------------------- registry and cache


def build_profiles() -> dict[str, ModelProfile]:
    """Every supported model, computed from its analytic description (``architectures``)."""
    resnets = {**RESNET_SETS, **MEASURED_RESNETS}
    out = {name: resnet_cifar(name, blocks, filters) for name, (blocks, filters) in resnets.items()}
    out.update({name: shake_shake(name, width) for name, width in SHAKE_SETS.items()})
    out["vgg16"] = vgg16()
    out["transformer_base"] = transformer()
    out["gpt_1_5b"] = gpt()
    return out


MODEL_NAMES: tuple[str, ...] = (*RESNET_SETS, *MEASURED_RESNETS, *SHAKE_SETS, "vgg16", "transformer_base",
                                "gpt_1_5b")


def profiles_path() -> Path:
    return data_dir() / PROFILES_FILE


def profiles_document(profiles: dict[str, ModelProfile]) -> dict[str, Any]:
    return {
        "version": PROFILES_VERSION,
        "generated_by": "python -m orchestrator.costmodel.profiles --write",
        "units": "per example unless named otherwise; bytes in fp32; flops = 2*macs + element-wise ops",
        "models": {name: p.to_dict() for name, p in profiles.items()},
    }


def write_profiles(path: Path | None = None) -> Path:
    target = path or profiles_path()
    target.write_text(json.dumps(profiles_document(build_profiles()), indent=1) + "\n")
    return target


@functools.cache
def _stored_models() -> dict[str, dict[str, Any]] | None:
    """The cached ``data/model_profiles.json``'s models as stored, or None if it is missing or stale."""
    try:
        doc = json.loads(profiles_path().read_text())
        if doc.get("version") == PROFILES_VERSION and set(doc["models"]) == set(MODEL_NAMES):
            models: dict[str, dict[str, Any]] = doc["models"]
            return models
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


@functools.cache
def load_profiles() -> dict[str, ModelProfile]:
    """Profiles from the cached ``data/model_profiles.json``; computed if the file is missing or stale."""
    stored = _stored_models()
    if stored is None:
        return build_profiles()
    try:
        return {name: ModelProfile.from_dict(d) for name, d in stored.items()}
    except (KeyError, TypeError, ValueError):
        return build_profiles()


@functools.cache
def _one_profile(model: str) -> ModelProfile | None:
    """One built-in profile, read alone from a good stored file (a plan needs one of them, not all)."""
    stored = _stored_models()
    try:
        return ModelProfile.from_dict(stored[model]) if stored is not None and model in stored else None
    except (KeyError, TypeError, ValueError):
        return None


def get_profile(model: str) -> ModelProfile:
    if is_user_model(model):
        found = find_user_profile(model)
        if found is None:
            ref = model.removeprefix("torch:")
            raise UnknownModelError(
                f"model '{model}' has not been profiled yet: run `orchestrator model profile --torch {ref}`"
            )
        return found
    found = _one_profile(model) or load_profiles().get(model)
    if found is not None:
        return found
    profiles = load_profiles()
    raise UnknownModelError(
        f"no cost-model profile for model '{model}'; {did_you_mean(model, profiles)}known: {', '.join(profiles)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.costmodel.profiles", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--write", action="store_true", help=f"regenerate data/{PROFILES_FILE}")
    parser.add_argument("--out", type=Path, default=None, help="write here instead of the data folder")
    args = parser.parse_args(argv)
    if args.write or args.out:
        print(f"wrote {write_profiles(args.out)}")
        return 0
    for p in build_profiles().values():
        print(
            f"{p.name:18s} params {p.params:>12,d}  MACs {p.macs:>16,d}  activations/example "
            f"{p.activation_bytes / 2**20:8.2f} MiB  layers {len(p.layers)}"
        )
    return 0


__all__ = [
    "BYTES_PER_VALUE",
    "MODEL_NAMES",
    "RESNET_SETS",
    "Layer",
    "ModelProfile",
    "OpWork",
    "UnknownModelError",
    "Variable",
    "build_profiles",
    "get_profile",
    "load_profiles",
    "main",
    "profiles_document",
    "profiles_path",
    "register_profile",
    "resnet_cifar",
    "write_profiles",
]
