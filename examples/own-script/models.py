"""Model factories for `orchestrator model profile --torch examples.own-script...` and `training.model:
{torch: "models:resnet50"}`: each ``FACTORY(batch)`` returns ``(torch.nn.Module, tuple_of_example_inputs)``.

Written with torch.nn only (torchvision is optional): ``resnet50`` is torchvision's ResNet-50 v1.5
(stride on the 3x3 convolution of a bottleneck; 25,557,032 parameters, 4.09 GMACs at 224x224, the figure
the torchvision docs print as "GFLOPS"); ``transformer_small`` is a 4-layer pre-norm GPT-style language
model. The cost model's public-throughput bench (bench/cross_gpu.py) profiles these and the factories in
``bench/public_models.py``.
"""

from __future__ import annotations

import torch
from torch import nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False), nn.BatchNorm2d(planes * 4)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, blocks: tuple[int, int, int, int], num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages: list[nn.Module] = []
        inplanes = 64
        for i, (n, planes) in enumerate(zip(blocks, (64, 128, 256, 512), strict=True)):
            layers: list[nn.Module] = []
            for j in range(n):
                layers.append(Bottleneck(inplanes, planes, stride=2 if (j == 0 and i > 0) else 1))
                inplanes = planes * 4
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ResNet-50 v1.5 at 224x224 (ImageNet, 1000 classes)."""
    return ResNet((3, 4, 6, 3)), (torch.randn(batch, 3, 224, 224),)


def resnet152(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return ResNet((3, 8, 36, 3)), (torch.randn(batch, 3, 224, 224),)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("positions", torch.arange(seq), persistent=False)
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos(self.positions)
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln(x))


def transformer_small(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A 4-layer, 256-wide, 4-head causal language model over 128 tokens of an 8,192-token vocabulary."""
    seq = 128
    return TinyLM(8192, 256, 4, 4, seq), (torch.randint(0, 8192, (batch, seq)),)
