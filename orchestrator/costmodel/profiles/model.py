"""The data of a model profile: variables, layers and the model's totals (per example, fp32)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

BYTES_PER_VALUE = 4  # fp32

Shape = tuple[int, ...]

# Op classes of a training step, by what bounds them on a GPU: "tensor" (matmul / convolution, which
# tensor cores run), "vector" (element-wise and normalization: CUDA cores, usually memory-bound),
# "memory" (data movement: copies, concatenation, pooling, gathers; no arithmetic to speak of).
OP_CLASSES = ("tensor", "vector", "memory")


@dataclass(frozen=True)
class OpWork:
    """One op class's work in one layer, per example, forward + backward of a training step."""

    op_class: str
    flops: int
    bytes: int
    ops: int = 0  # ATen ops (~ kernels) a training step runs, whatever the batch

    def to_dict(self) -> dict[str, Any]:
        return {"op_class": self.op_class, "flops": self.flops, "bytes": self.bytes, "ops": self.ops}


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
    # Measured op-class split of a training step (profiles of PyTorch models); empty for the analytic
    # profiles, whose split ``op_work`` derives from the layer kind.
    train_ops: tuple[OpWork, ...] = ()
    # A depthwise convolution (groups = input channels > 1): its own kernels, whose speed against the roofline
    # differs by GPU and precision far more than other convolutions' (host_fit scales it apart)
    depthwise: bool = False

    @property
    def params(self) -> int:
        return sum(v.size for v in self.variables if v.trainable)

    @property
    def non_trainable_params(self) -> int:
        return sum(v.size for v in self.variables if not v.trainable)

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"train_ops": [w.to_dict() for w in self.train_ops]} if self.train_ops else {}
        if self.depthwise:
            extra["depthwise"] = True
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
            **extra,
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
            train_ops=tuple(
                OpWork(str(w["op_class"]), int(w["flops"]), int(w["bytes"]), int(w.get("ops", 0)))
                for w in d.get("train_ops") or ()
            ),
            depthwise=bool(d.get("depthwise", False)),
        )


@dataclass(frozen=True)
class ModelProfile:
    name: str
    description: str
    example: str  # what one example is
    input_shape: Shape
    default_batch: int  # kept in the profile format; a spec without a batch trains at spec.training.DEFAULT_BATCH
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
