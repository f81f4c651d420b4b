"""The CIFAR ResNets of data/measurements/h100-torch-resnet-cifar*.csv (bench/gpu/torchbench.py's model: He et al.
6n+2, 16/32/64 channels) as ``model profile --torch`` factories: ``bench/factories/cifar_resnet.py:resnet32``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

from torchbench import resnet  # noqa: E402


def _build(depth: int, batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return resnet(depth), (torch.randn(batch, 3, 32, 32),)


def resnet20(batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return _build(20, batch)


def resnet32(batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return _build(32, batch)


def resnet44(batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return _build(44, batch)


def resnet56(batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return _build(56, batch)


def resnet110(batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return _build(110, batch)
