"""Layer builders: one ``Layer`` (FLOPs, bytes, variables) per Keras-like layer, 'same' padding, NHWC."""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.costmodel.profiles.model import BYTES_PER_VALUE, Layer, Shape, Variable

# Forward FLOPs per element of the element-wise layers (training-mode batch norm computes the batch
# mean and variance, normalises, scales and shifts: ~8 operations per element).
BN_FLOPS_PER_ELEMENT = 8
LAYERNORM_FLOPS_PER_ELEMENT = 8
SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide


def nbytes(shape: Shape) -> int:
    """Bytes of a tensor of this shape, per example."""
    return math.prod(shape) * BYTES_PER_VALUE


def elementwise(name: str, kind: str, shape: Shape, flops_per_el: int, reads: int = 1) -> Layer:
    """A layer that works element by element: ``flops_per_el`` FLOPs each, the input read ``reads`` times."""
    n = math.prod(shape)
    return Layer(
        name, kind, shape, 0, flops_per_el * n, reads * n * BYTES_PER_VALUE, nbytes(shape), 0, nbytes(shape)
    )


def with_vars(layer: Layer, variables: Sequence[Variable]) -> Layer:
    """``layer`` owning ``variables``: their trainable bytes are read each step."""
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
    base = Layer(name, "conv", out, macs, flops, nbytes(x), nbytes(out), 0, nbytes(out))
    return with_vars(base, variables)


def batch_norm(name: str, x: Shape) -> Layer:
    c = x[-1]
    base = elementwise(
        name, "batchnorm", x, BN_FLOPS_PER_ELEMENT, reads=2
    )  # statistics pass + normalise pass
    return with_vars(
        base,
        [
            Variable(f"{name}/gamma", (c,)),
            Variable(f"{name}/beta", (c,)),
            Variable(f"{name}/moving_mean", (c,), trainable=False),
            Variable(f"{name}/moving_variance", (c,), trainable=False),
        ],
    )


def relu(name: str, x: Shape) -> Layer:
    return elementwise(name, "relu", x, 1)


def add(name: str, x: Shape) -> Layer:
    return elementwise(name, "add", x, 1, reads=2)


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
    base = Layer(name, "dense", out, macs, flops, nbytes(x), nbytes(out), tied_weight_bytes, nbytes(out))
    if tied_weight_bytes:
        return base
    variables = [Variable(f"{name}/kernel", (x[-1], units))]
    if bias:
        variables.append(Variable(f"{name}/bias", (units,)))
    return with_vars(base, variables)


def max_pool(name: str, x: Shape, size: int = 2) -> Layer:
    h, w, c = x
    out = (h // size, w // size, c)
    return Layer(name, "maxpool", out, 0, math.prod(x), nbytes(x), nbytes(out), 0, nbytes(out))


def global_avg_pool(name: str, x: Shape) -> Layer:
    out = (x[-1],)
    return Layer(name, "avgpool", out, 0, math.prod(x), nbytes(x), nbytes(out), 0, nbytes(out))


def softmax_xent(name: str, x: Shape) -> Layer:
    n = math.prod(x)
    return Layer(name, "softmax", x, 0, SOFTMAX_FLOPS_PER_ELEMENT * n, nbytes(x), nbytes(x), 0, nbytes(x))


def layer_norm(name: str, x: Shape) -> Layer:
    base = elementwise(name, "layernorm", x, LAYERNORM_FLOPS_PER_ELEMENT, reads=2)
    return with_vars(base, [Variable(f"{name}/gamma", (x[-1],)), Variable(f"{name}/beta", (x[-1],))])
