"""Hyper-parameter sets (names follow tensor2tensor's, as used by the 2019 transient-GPU study).

Optimizer: SGD, momentum 0.9, Nesterov; weight decay 1e-4 as an L2 term on conv/dense kernels added to the
loss (``0.5 * wd * sum(w**2)``, i.e. gradient ``wd * w``); learning rate 0.4 at a batch of 128 per update,
scaled linearly with the batch per update (``lr = 0.4 * batch / 128``: the global batch in sync mode, the
mean per-worker batch in async mode, where each worker's step is one update), cosine-decayed to 0 over
``train_steps``. The linear scaling keeps small-batch runs (e.g. digits at batch 32, lr 0.1) stable.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HParams:
    name: str
    blocks_per_stage: tuple[int, int, int]
    filters: tuple[int, int, int]
    learning_rate: float = 0.4
    base_batch: int = 128
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 1e-4

    def scaled_lr(self, batch_per_update: float) -> float:
        return self.learning_rate * batch_per_update / self.base_batch


HPARAM_SETS: dict[str, HParams] = {
    "resnet_cifar_15": HParams("resnet_cifar_15", (2, 2, 2), (16, 32, 64)),
    "resnet_cifar_32": HParams("resnet_cifar_32", (5, 5, 5), (16, 32, 64)),
    "resnet_cifar_56": HParams("resnet_cifar_56", (9, 9, 9), (16, 32, 64)),
    "resnet_tiny": HParams("resnet_tiny", (1, 1, 1), (8, 16, 32)),
}

MODELS = ("resnet",)
PROBLEMS = ("image_cifar10",)


def get_hparams(name: str) -> HParams:
    try:
        return HPARAM_SETS[name]
    except KeyError:
        raise ValueError(f"unknown hparam_set {name!r}; known: {sorted(HPARAM_SETS)}") from None
