"""CIFAR-style ResNets (He et al. 2016, section 4.2) as Keras models."""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import layers

from .hparams import get_hparams


def _conv(filters: int, stride: int, name: str) -> layers.Conv2D:
    return layers.Conv2D(
        filters, 3, strides=stride, padding="same", use_bias=False, kernel_initializer="he_normal", name=name
    )


def _block(x: keras.KerasTensor, filters: int, stride: int, name: str) -> keras.KerasTensor:
    shortcut = x
    y = _conv(filters, stride, f"{name}_conv1")(x)
    y = layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=f"{name}_bn1")(y)
    y = layers.ReLU(name=f"{name}_relu1")(y)
    y = _conv(filters, 1, f"{name}_conv2")(y)
    y = layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=f"{name}_bn2")(y)
    if stride != 1 or x.shape[-1] != filters:
        shortcut = layers.Conv2D(
            filters, 1, strides=stride, use_bias=False, kernel_initializer="he_normal", name=f"{name}_proj"
        )(x)
        shortcut = layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=f"{name}_proj_bn")(shortcut)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([y, shortcut]))


def build_model(hparam_set: str, input_shape: Sequence[int], num_classes: int) -> keras.Model:
    """ResNet for 32x32 images: conv16 + 3 stages of basic blocks (filters f1/f2/f3, strides 1/2/2) + GAP."""
    hp = get_hparams(hparam_set)
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = _conv(hp.filters[0], 1, "stem_conv")(inputs)
    x = layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name="stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    for stage, (n_blocks, filters) in enumerate(zip(hp.blocks_per_stage, hp.filters, strict=True)):
        for b in range(n_blocks):
            stride = 2 if (stage > 0 and b == 0) else 1
            x = _block(x, filters, stride, f"s{stage}b{b}")
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = layers.Dense(num_classes, kernel_initializer="he_normal", name="logits")(x)
    return keras.Model(inputs, outputs, name=hp.name)


def kernel_variables(model: keras.Model) -> list[keras.Variable]:
    """The variables weight decay applies to (conv and dense kernels)."""
    return [v for v in model.trainable_variables if v.path.endswith("kernel")]
