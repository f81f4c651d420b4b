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
* ``transformer_base``: Vaswani et al. 2017 base (6+6 layers, d_model 512, d_ff 2048, 8 heads,
  post-layer-norm, biases in every projection, shared 37,000-token source/target/pre-softmax embedding,
  sinusoidal positions); one example = a sentence pair of 128 source and 128 target tokens.

``python -m orchestrator.core.costmodel.profiles --write`` regenerates ``data/model_profiles.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.paths import data_dir

BYTES_PER_VALUE = 4  # fp32
PROFILES_FILE = "model_profiles.json"
PROFILES_VERSION = 1

# Forward FLOPs per element of the element-wise layers (training-mode batch norm computes the batch
# mean and variance, normalises, scales and shifts: ~8 operations per element).
BN_FLOPS_PER_ELEMENT = 8
LAYERNORM_FLOPS_PER_ELEMENT = 8
SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide

Shape = tuple[int, ...]


class UnknownModelError(LookupError):
    """A model name without a profile; the message lists the known ones."""


@dataclass(frozen=True)
class Variable:
    name: str
    shape: Shape
    trainable: bool = True

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * BYTES_PER_VALUE


@dataclass(frozen=True)
class Layer:
    name: str
    kind: str
    output_shape: Shape
    macs: int
    flops: int
    read_bytes: int
    write_bytes: int
    weight_bytes: int
    saved_bytes: int
    variables: tuple[Variable, ...] = ()

    @property
    def params(self) -> int:
        return sum(v.size for v in self.variables if v.trainable)

    @property
    def non_trainable_params(self) -> int:
        return sum(v.size for v in self.variables if not v.trainable)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "output_shape": list(self.output_shape),
            "macs": self.macs,
            "flops": self.flops,
            "read_bytes": self.read_bytes,
            "write_bytes": self.write_bytes,
            "weight_bytes": self.weight_bytes,
            "saved_bytes": self.saved_bytes,
            "variables": [
                {"name": v.name, "shape": list(v.shape), "trainable": v.trainable} for v in self.variables
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Layer:
        return cls(
            name=str(d["name"]),
            kind=str(d["kind"]),
            output_shape=tuple(int(x) for x in d["output_shape"]),
            macs=int(d["macs"]),
            flops=int(d["flops"]),
            read_bytes=int(d["read_bytes"]),
            write_bytes=int(d["write_bytes"]),
            weight_bytes=int(d["weight_bytes"]),
            saved_bytes=int(d["saved_bytes"]),
            variables=tuple(
                Variable(str(v["name"]), tuple(int(x) for x in v["shape"]), bool(v["trainable"]))
                for v in d["variables"]
            ),
        )


@dataclass(frozen=True)
class ModelProfile:
    name: str
    description: str
    example: str  # what one example is
    input_shape: Shape
    default_batch: int  # per-worker batch when the spec gives none
    layers: tuple[Layer, ...] = field(repr=False)

    # ---- totals
    @functools.cached_property
    def params(self) -> int:
        """Trainable parameters."""
        return sum(layer.params for layer in self.layers)

    @functools.cached_property
    def non_trainable_params(self) -> int:
        """Batch-norm moving statistics."""
        return sum(layer.non_trainable_params for layer in self.layers)

    @functools.cached_property
    def total_params(self) -> int:
        """What Keras ``count_params()`` reports (trainable + non-trainable)."""
        return self.params + self.non_trainable_params

    @functools.cached_property
    def variables(self) -> tuple[Variable, ...]:
        return tuple(v for layer in self.layers for v in layer.variables)

    @functools.cached_property
    def param_bytes(self) -> int:
        """Bytes of every variable (all of them live on the parameter servers)."""
        return sum(v.nbytes for v in self.variables)

    @functools.cached_property
    def trainable_bytes(self) -> int:
        return self.params * BYTES_PER_VALUE

    @functools.cached_property
    def macs(self) -> int:
        return sum(layer.macs for layer in self.layers)

    @functools.cached_property
    def flops(self) -> int:
        return sum(layer.flops for layer in self.layers)

    @functools.cached_property
    def input_bytes(self) -> int:
        return math.prod(self.input_shape) * BYTES_PER_VALUE

    @functools.cached_property
    def activation_bytes(self) -> int:
        """Activation memory per example: the input plus every layer output kept for the backward pass."""
        return self.input_bytes + sum(layer.saved_bytes for layer in self.layers)

    @functools.cached_property
    def peak_layer_bytes(self) -> int:
        """The largest single activation per example (a gradient buffer of that size is live in backward)."""
        return max([layer.write_bytes for layer in self.layers] + [self.input_bytes])

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "example": self.example,
            "input_shape": list(self.input_shape),
            "default_batch": self.default_batch,
            "totals": {
                "params": self.params,
                "non_trainable_params": self.non_trainable_params,
                "param_bytes": self.param_bytes,
                "macs": self.macs,
                "flops": self.flops,
                "activation_bytes": self.activation_bytes,
            },
            "layers": [layer.to_dict() for layer in self.layers],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelProfile:
        return cls(
            name=str(d["name"]),
            description=str(d["description"]),
            example=str(d["example"]),
            input_shape=tuple(int(x) for x in d["input_shape"]),
            default_batch=int(d["default_batch"]),
            layers=tuple(Layer.from_dict(x) for x in d["layers"]),
        )


# ---------------------------------------------------------------- layer constructors


def _nbytes(shape: Shape) -> int:
    return math.prod(shape) * BYTES_PER_VALUE


def _elementwise(name: str, kind: str, shape: Shape, flops_per_el: int, reads: int = 1) -> Layer:
    n = math.prod(shape)
    return Layer(
        name, kind, shape, 0, flops_per_el * n, reads * n * BYTES_PER_VALUE, _nbytes(shape), 0, _nbytes(shape)
    )


def _with_vars(layer: Layer, variables: Sequence[Variable]) -> Layer:
    return Layer(
        layer.name,
        layer.kind,
        layer.output_shape,
        layer.macs,
        layer.flops,
        layer.read_bytes,
        layer.write_bytes,
        sum(v.nbytes for v in variables if v.trainable) + layer.weight_bytes,
        layer.saved_bytes,
        tuple(variables),
    )


def conv2d(
    name: str, x: Shape, filters: int, kernel: int, stride: int, bias: bool, relu: bool = False
) -> Layer:
    """'same' padding, NHWC; ``relu`` fused (VGG) adds one FLOP an output element."""
    h, w, c = x
    out = (math.ceil(h / stride), math.ceil(w / stride), filters)
    n_out = math.prod(out)
    macs = n_out * kernel * kernel * c
    flops = 2 * macs + (n_out if bias else 0) + (n_out if relu else 0)
    variables = [Variable(f"{name}/kernel", (kernel, kernel, c, filters))]
    if bias:
        variables.append(Variable(f"{name}/bias", (filters,)))
    base = Layer(name, "conv", out, macs, flops, _nbytes(x), _nbytes(out), 0, _nbytes(out))
    return _with_vars(base, variables)


def batch_norm(name: str, x: Shape) -> Layer:
    c = x[-1]
    base = _elementwise(
        name, "batchnorm", x, BN_FLOPS_PER_ELEMENT, reads=2
    )  # statistics pass + normalise pass
    return _with_vars(
        base,
        [
            Variable(f"{name}/gamma", (c,)),
            Variable(f"{name}/beta", (c,)),
            Variable(f"{name}/moving_mean", (c,), trainable=False),
            Variable(f"{name}/moving_variance", (c,), trainable=False),
        ],
    )


def relu(name: str, x: Shape) -> Layer:
    return _elementwise(name, "relu", x, 1)


def add(name: str, x: Shape) -> Layer:
    return _elementwise(name, "add", x, 1, reads=2)


def dense(
    name: str, x: Shape, units: int, bias: bool = True, relu: bool = False, tied_weight_bytes: int = 0
) -> Layer:
    """Dense over the last axis (leading axes, e.g. tokens, are batch-like). ``tied_weight_bytes``: the
    layer reads a weight matrix owned by another layer (no variables of its own)."""
    lead = math.prod(x[:-1])
    out = (*x[:-1], units)
    n_out = math.prod(out)
    macs = lead * x[-1] * units
    flops = 2 * macs + (n_out if bias else 0) + (n_out if relu else 0)
    base = Layer(name, "dense", out, macs, flops, _nbytes(x), _nbytes(out), tied_weight_bytes, _nbytes(out))
    if tied_weight_bytes:
        return base
    variables = [Variable(f"{name}/kernel", (x[-1], units))]
    if bias:
        variables.append(Variable(f"{name}/bias", (units,)))
    return _with_vars(base, variables)


def max_pool(name: str, x: Shape, size: int = 2) -> Layer:
    h, w, c = x
    out = (h // size, w // size, c)
    return Layer(name, "maxpool", out, 0, math.prod(x), _nbytes(x), _nbytes(out), 0, _nbytes(out))


def global_avg_pool(name: str, x: Shape) -> Layer:
    out = (x[-1],)
    return Layer(name, "avgpool", out, 0, math.prod(x), _nbytes(x), _nbytes(out), 0, _nbytes(out))


def softmax_xent(name: str, x: Shape) -> Layer:
    n = math.prod(x)
    return Layer(name, "softmax", x, 0, SOFTMAX_FLOPS_PER_ELEMENT * n, _nbytes(x), _nbytes(x), 0, _nbytes(x))


# ---------------------------------------------------------------- ResNet (CIFAR), as jobs/tfjob/models.py

RESNET_SETS: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    "resnet_tiny": ((1, 1, 1), (8, 16, 32)),
    "resnet_cifar_15": ((2, 2, 2), (16, 32, 64)),
    "resnet_cifar_32": ((5, 5, 5), (16, 32, 64)),
    "resnet_cifar_56": ((9, 9, 9), (16, 32, 64)),
}
# Depths measured on real GPUs (data/measurements) that the TF job does not offer.
MEASURED_RESNETS: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    "resnet_cifar_20": ((3, 3, 3), (16, 32, 64)),
    "resnet_cifar_110": ((18, 18, 18), (16, 32, 64)),
}


def resnet_cifar(
    name: str,
    blocks: tuple[int, int, int],
    filters: tuple[int, int, int],
    input_shape: Shape = (32, 32, 3),
    num_classes: int = 10,
) -> ModelProfile:
    layers: list[Layer] = []

    def push(layer: Layer) -> Shape:
        layers.append(layer)
        return layer.output_shape

    x = push(conv2d("stem_conv", input_shape, filters[0], 3, 1, bias=False))
    x = push(batch_norm("stem_bn", x))
    x = push(relu("stem_relu", x))
    for stage, (n_blocks, f) in enumerate(zip(blocks, filters, strict=True)):
        for b in range(n_blocks):
            stride = 2 if (stage > 0 and b == 0) else 1
            n = f"s{stage}b{b}"
            block_in = x
            y = push(conv2d(f"{n}_conv1", block_in, f, 3, stride, bias=False))
            y = push(batch_norm(f"{n}_bn1", y))
            y = push(relu(f"{n}_relu1", y))
            y = push(conv2d(f"{n}_conv2", y, f, 3, 1, bias=False))
            y = push(batch_norm(f"{n}_bn2", y))
            if stride != 1 or block_in[-1] != f:
                s = push(conv2d(f"{n}_proj", block_in, f, 1, stride, bias=False))
                push(batch_norm(f"{n}_proj_bn", s))
            y = push(add(f"{n}_add", y))
            x = push(relu(f"{n}_out", y))
    x = push(global_avg_pool("gap", x))
    x = push(dense("logits", x, num_classes))
    push(softmax_xent("softmax_xent", x))
    depth = 6 * blocks[0] + 2 if blocks[0] == blocks[1] == blocks[2] else 0
    desc = (
        f"CIFAR ResNet blocks {list(blocks)} filters {list(filters)}"
        + (f" (ResNet-{depth})" if depth else "")
        + ", 1x1 projection shortcuts, as jobs/tfjob/models.py"
    )
    return ModelProfile(name, desc, "one 32x32x3 image", input_shape, 128, tuple(layers))


# ---------------------------------------------------------------- Shake-Shake (CIFAR)

# Gastaldi 2017 ("Shake-Shake regularization", Table 1): Shake-Shake-26 2x32d has 2.9M parameters and
# 2x96d 26.2M; the ICAC'19 study trained both ("small" and "big") beside the ResNets.
SHAKE_SETS: dict[str, int] = {"shake_shake_small": 32, "shake_shake_big": 96}


def _shake_branch(n: str, x: Shape, f: int, stride: int) -> list[Layer]:
    out = [relu(f"{n}_relu1", x), conv2d(f"{n}_conv1", x, f, 3, stride, bias=False)]
    y = out[-1].output_shape
    out += [batch_norm(f"{n}_bn1", y), relu(f"{n}_relu2", y), conv2d(f"{n}_conv2", y, f, 3, 1, bias=False)]
    return [*out, batch_norm(f"{n}_bn2", y)]


def shake_shake(name: str, width: int, blocks: int = 4) -> ModelProfile:
    """Shake-Shake-26 2x<width>d: 16-filter stem, three stages of ``blocks`` residual blocks with two
    branches each (ReLU-conv3x3-BN-ReLU-conv3x3-BN), widths w/2w/4w; a widening shortcut is two
    1x1 convs of half the width each, concatenated, then BN (Gastaldi 2017, sec. 2.2)."""
    layers: list[Layer] = [conv2d("stem_conv", (32, 32, 3), 16, 3, 1, bias=False)]
    x = layers[-1].output_shape
    layers.append(batch_norm("stem_bn", x))
    for stage, f in enumerate((width, 2 * width, 4 * width)):
        for b in range(blocks):
            stride = 2 if (stage > 0 and b == 0) else 1
            n = f"s{stage}b{b}"
            for branch in ("a", "b"):
                layers += _shake_branch(f"{n}{branch}", x, f, stride)
            y = layers[-1].output_shape
            if stride != 1 or x[-1] != f:
                layers += [conv2d(f"{n}_short{i}", x, f // 2, 1, stride, bias=False) for i in (1, 2)]
                layers.append(batch_norm(f"{n}_short_bn", y))
            layers.append(add(f"{n}_add", y))
            x = y
    layers += [relu("final_relu", x), global_avg_pool("gap", x)]
    layers.append(dense("logits", layers[-1].output_shape, 10))
    layers.append(softmax_xent("softmax_xent", layers[-1].output_shape))
    return ModelProfile(name, f"Shake-Shake-26 2x{width}d for CIFAR-10 (Gastaldi 2017)", "one 32x32x3 image",
                        (32, 32, 3), 128, tuple(layers))


# ---------------------------------------------------------------- VGG-16 (ImageNet)


def vgg16(input_shape: Shape = (224, 224, 3), num_classes: int = 1000) -> ModelProfile:
    layers: list[Layer] = []
    x = input_shape
    for block, (n_convs, f) in enumerate([(2, 64), (2, 128), (3, 256), (3, 512), (3, 512)], start=1):
        for i in range(1, n_convs + 1):
            layer = conv2d(f"block{block}_conv{i}", x, f, 3, 1, bias=True, relu=True)
            layers.append(layer)
            x = layer.output_shape
        layers.append(max_pool(f"block{block}_pool", x))
        x = layers[-1].output_shape
    x = (math.prod(x),)  # flatten: a view, no traffic
    for i, units in enumerate([4096, 4096], start=1):
        layers.append(dense(f"fc{i}", x, units, relu=True))
        x = layers[-1].output_shape
    layers.append(dense("predictions", x, num_classes))
    layers.append(softmax_xent("softmax_xent", layers[-1].output_shape))
    return ModelProfile(
        "vgg16",
        "VGG-16 (configuration D) for ImageNet, 224x224x3, 1000 classes, as keras.applications.VGG16",
        "one 224x224x3 image",
        input_shape,
        32,
        tuple(layers),
    )


# ---------------------------------------------------------------- Transformer base


def _attention(prefix: str, lq: int, lk: int, d: int, heads: int) -> list[Layer]:
    q_in, kv_in = (lq, d), (lk, d)
    layers = [
        dense(f"{prefix}_query", q_in, d),
        dense(f"{prefix}_key", kv_in, d),
        dense(f"{prefix}_value", kv_in, d),
    ]
    scores = (heads, lq, lk)
    n_scores = math.prod(scores)
    # Q K^T: lq*lk*d MACs; softmax over the keys; probabilities times V: lq*lk*d MACs.
    layers.append(
        Layer(
            f"{prefix}_scores",
            "matmul",
            scores,
            lq * lk * d,
            2 * lq * lk * d + n_scores,
            _nbytes(q_in) + _nbytes(kv_in),
            _nbytes(scores),
            0,
            _nbytes(scores),
        )
    )
    layers.append(
        Layer(
            f"{prefix}_softmax",
            "softmax",
            scores,
            0,
            SOFTMAX_FLOPS_PER_ELEMENT * n_scores,
            _nbytes(scores),
            _nbytes(scores),
            0,
            _nbytes(scores),
        )
    )
    layers.append(
        Layer(
            f"{prefix}_context",
            "matmul",
            q_in,
            lq * lk * d,
            2 * lq * lk * d,
            _nbytes(scores) + _nbytes(kv_in),
            _nbytes(q_in),
            0,
            _nbytes(q_in),
        )
    )
    layers.append(dense(f"{prefix}_output", q_in, d))
    return layers


def _layer_norm(name: str, x: Shape) -> Layer:
    base = _elementwise(name, "layernorm", x, LAYERNORM_FLOPS_PER_ELEMENT, reads=2)
    return _with_vars(base, [Variable(f"{name}/gamma", (x[-1],)), Variable(f"{name}/beta", (x[-1],))])


def _ffn(prefix: str, x: Shape, d_ff: int) -> list[Layer]:
    h = dense(f"{prefix}_ffn1", x, d_ff)
    return [h, relu(f"{prefix}_ffn_relu", h.output_shape), dense(f"{prefix}_ffn2", h.output_shape, x[-1])]


def transformer(
    name: str = "transformer_base",
    layers_n: int = 6,
    d: int = 512,
    d_ff: int = 2048,
    heads: int = 8,
    vocab: int = 37000,
    src_len: int = 128,
    tgt_len: int = 128,
) -> ModelProfile:
    layers: list[Layer] = []
    src, tgt = (src_len, d), (tgt_len, d)
    emb = Variable("shared_embedding/embeddings", (vocab, d))
    # Embedding lookup (a gather: reads the looked-up rows), scale by sqrt(d) and add the positions.
    layers.append(
        Layer(
            "src_embedding",
            "embedding",
            src,
            0,
            2 * math.prod(src),
            _nbytes(src),
            _nbytes(src),
            0,
            _nbytes(src),
            (emb,),
        )
    )
    for i in range(layers_n):
        p = f"enc{i}"
        layers += _attention(f"{p}_self", src_len, src_len, d, heads)
        layers += [add(f"{p}_add1", src), _layer_norm(f"{p}_ln1", src)]
        layers += _ffn(p, src, d_ff)
        layers += [add(f"{p}_add2", src), _layer_norm(f"{p}_ln2", src)]
    layers.append(
        Layer(
            "tgt_embedding",
            "embedding",
            tgt,
            0,
            2 * math.prod(tgt),
            _nbytes(tgt),
            _nbytes(tgt),
            0,
            _nbytes(tgt),
        )
    )
    for i in range(layers_n):
        p = f"dec{i}"
        layers += _attention(f"{p}_self", tgt_len, tgt_len, d, heads)  # causal mask: same work, masked
        layers += [add(f"{p}_add1", tgt), _layer_norm(f"{p}_ln1", tgt)]
        layers += _attention(f"{p}_cross", tgt_len, src_len, d, heads)
        layers += [add(f"{p}_add2", tgt), _layer_norm(f"{p}_ln2", tgt)]
        layers += _ffn(p, tgt, d_ff)
        layers += [add(f"{p}_add3", tgt), _layer_norm(f"{p}_ln3", tgt)]
    layers.append(dense("logits", tgt, vocab, bias=False, tied_weight_bytes=emb.nbytes))
    layers.append(softmax_xent("softmax_xent", (tgt_len, vocab)))
    desc = (
        f"Transformer base (Vaswani et al. 2017): {layers_n}+{layers_n} layers, d_model {d}, d_ff {d_ff}, "
        f"{heads} heads, shared {vocab}-token embedding"
    )
    return ModelProfile(
        name,
        desc,
        f"a sentence pair of {src_len} source + {tgt_len} target tokens",
        (src_len + tgt_len,),
        32,
        tuple(layers),
    )


# ---------------------------------------------------------------- registry and cache


def build_profiles() -> dict[str, ModelProfile]:
    """Every supported model, computed from the analytic descriptions above."""
    resnets = {**RESNET_SETS, **MEASURED_RESNETS}
    out = {name: resnet_cifar(name, blocks, filters) for name, (blocks, filters) in resnets.items()}
    out.update({name: shake_shake(name, width) for name, width in SHAKE_SETS.items()})
    out["vgg16"] = vgg16()
    out["transformer_base"] = transformer()
    return out


MODEL_NAMES: tuple[str, ...] = (*RESNET_SETS, *MEASURED_RESNETS, *SHAKE_SETS, "vgg16", "transformer_base")


def profiles_path() -> Path:
    return data_dir() / PROFILES_FILE


def profiles_document(profiles: dict[str, ModelProfile]) -> dict[str, Any]:
    return {
        "version": PROFILES_VERSION,
        "generated_by": "python -m orchestrator.core.costmodel.profiles --write",
        "units": "per example unless named otherwise; bytes in fp32; flops = 2*macs + element-wise ops",
        "models": {name: p.to_dict() for name, p in profiles.items()},
    }


def write_profiles(path: Path | None = None) -> Path:
    target = path or profiles_path()
    target.write_text(json.dumps(profiles_document(build_profiles()), indent=1) + "\n")
    return target


@functools.cache
def load_profiles() -> dict[str, ModelProfile]:
    """Profiles from the cached ``data/model_profiles.json``; computed if the file is missing or stale."""
    try:
        doc = json.loads(profiles_path().read_text())
        if doc.get("version") == PROFILES_VERSION and set(doc["models"]) == set(MODEL_NAMES):
            return {name: ModelProfile.from_dict(d) for name, d in doc["models"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return build_profiles()


def get_profile(model: str) -> ModelProfile:
    profiles = load_profiles()
    try:
        return profiles[model]
    except KeyError:
        raise UnknownModelError(
            f"no cost-model profile for model '{model}'; known: {', '.join(profiles)}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.core.costmodel.profiles", description=__doc__.split("\n")[0]
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
