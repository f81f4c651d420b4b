"""CIFAR ResNet (He et al. 2016, section 4.2): a 3x3 stem, 3 stages of n basic blocks, depth 6n+2.

Batch norm is ``CrossRankBatchNorm``: in training its statistics cover the whole global batch across the
ranks (whatever each rank's share), so a DDP step equals one process on the concatenated batch.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from torch import nn

# name -> (blocks per stage n, channels per stage); the names are the TensorFlow job's hparam sets.
ARCHS: dict[str, tuple[int, tuple[int, int, int]]] = {
    "resnet_tiny": (1, (8, 16, 32)),  # depth 8, for tests
    "resnet_cifar_15": (2, (16, 32, 64)),  # depth 14
    "resnet_cifar_32": (5, (16, 32, 64)),  # depth 32
    "resnet_cifar_56": (9, (16, 32, 64)),  # depth 56
}

_bn_group: dist.ProcessGroup | None = None
# TORCHJOB_BN=cross: the cross-rank statistics even in a world of one (to measure their cost on one GPU).
_FORCE_CROSS = os.environ.get("TORCHJOB_BN", "") == "cross"
# Its replacement in torch._functional_collectives is not autograd-aware; this one is what we need.
warnings.filterwarnings("ignore", message=".*distributed.nn.functional.all_reduce is deprecated.*")


_probing = False  # inside local_statistics(): the cross-rank kernels, but no collective


@contextlib.contextmanager
def local_statistics() -> Iterator[None]:
    """Batch norm keeps its cross-rank kernels but sums this rank's statistics only: a rank can time its own
    compute (rebalance.py's probe) without waiting for the others."""
    global _probing
    _probing = True
    try:
        yield
    finally:
        _probing = False


def set_bn_group(group: dist.ProcessGroup | None) -> None:
    """A process group of its own for batch-norm statistics, so they never interleave with DDP's buckets."""
    global _bn_group
    _bn_group = group


class CrossRankBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are summed over every rank (uneven batches allowed).

    nn.SyncBatchNorm does the same but only on accelerators; this one runs on gloo/CPU too. The all-reduce
    is autograd-aware (torch.distributed.nn), so gradients flow through the global statistics exactly.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_world = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        shared = in_world and not _probing
        if not self.training or not (in_world or _FORCE_CROSS):
            # One rank holds the whole batch: the same statistics as below, in one fused (cuDNN) kernel
            # instead of ~20 elementwise ones per layer and pass.
            return super().forward(x)
        dims = (0, 2, 3)
        count = torch.full((1,), float(x.shape[0] * x.shape[2] * x.shape[3]), dtype=x.dtype, device=x.device)
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        if shared:
            stats = dist_nn.all_reduce(stats, group=_bn_group or dist.group.WORLD)
        c = self.num_features
        n = stats[-1]
        mean = stats[:c] / n
        var = stats[c : 2 * c] / n - mean * mean
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                m = self.momentum if self.momentum is not None else 0.1
                self.running_mean.mul_(1 - m).add_(mean.detach() * m)
                self.running_var.mul_(1 - m).add_(var.detach() * (n / torch.clamp(n - 1, min=1)) * m)
                if self.num_batches_tracked is not None:
                    self.num_batches_tracked.add_(1)
        scale = torch.rsqrt(var + self.eps) * self.weight
        return (x - mean[None, :, None, None]) * scale[None, :, None, None] + self.bias[None, :, None, None]


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: type[nn.BatchNorm2d] = CrossRankBatchNorm) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = norm(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = norm(cout)
        self.short: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


def resnet(hparam_set: str, classes: int = 10, norm: type[nn.BatchNorm2d] = CrossRankBatchNorm) -> nn.Sequential:
    """The CIFAR ResNet as one flat Sequential: stem conv, BN, ReLU; the blocks; pool, flatten, linear (a pipeline
    cuts it between these children). ``norm``: plain nn.BatchNorm2d for a pipeline, whose ranks hold other layers."""
    try:
        n, widths = ARCHS[hparam_set]
    except KeyError:
        raise ValueError(f"unknown hparam_set {hparam_set!r}; known: {sorted(ARCHS)}") from None
    layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), norm(widths[0]), nn.ReLU()]
    cin = widths[0]
    for stage, cout in enumerate(widths):
        for j in range(n):
            layers.append(Block(cin, cout, 2 if (j == 0 and stage > 0) else 1, norm))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, object]]:
    """Weight decay on conv and linear weights only (as the TensorFlow job: kernels, not BN or biases)."""
    decay, rest = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            (decay if name == "weight" and isinstance(module, nn.Conv2d | nn.Linear) else rest).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def weighted_loss(logits: torch.Tensor, labels: torch.Tensor, global_batch: int, world_size: int) -> torch.Tensor:
    """Sum of this rank's cross-entropies × world / global batch.

    DDP averages gradients over the ranks, so after its all-reduce the gradient is sum over every example of
    the global batch / global batch: exactly the global-batch mean, whatever the per-rank batches are.
    """
    return F.cross_entropy(logits, labels, reduction="sum") * (world_size / global_batch)
