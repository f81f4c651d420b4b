"""TensorFlow pieces shared by the async chief and the sync workers."""

from __future__ import annotations

import os
import socket
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from .hparams import HParams
from .models import kernel_variables

EVAL_BATCH = 500


def log(msg: str) -> None:
    print(f"[tfjob {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def thread_count() -> int | None:
    """TFJOB_THREADS=n caps TF's intra-op threads per process (useful when many tasks share a machine)."""
    raw = os.environ.get("TFJOB_THREADS", "").strip()
    return int(raw) if raw else None


def configure_local_threads() -> None:
    n = thread_count()
    if n:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, n))


def server_config() -> tf.compat.v1.ConfigProto:
    cfg = tf.compat.v1.ConfigProto()
    n = thread_count()
    if n:
        cfg.intra_op_parallelism_threads = n
        cfg.inter_op_parallelism_threads = max(2, n)
    return cfg


def make_optimizer(hp: HParams, batch_per_update: float, train_steps: int) -> keras.optimizers.Optimizer:
    schedule = keras.optimizers.schedules.CosineDecay(hp.scaled_lr(batch_per_update), decay_steps=train_steps)
    return keras.optimizers.SGD(learning_rate=schedule, momentum=hp.momentum, nesterov=hp.nesterov)


def weighted_loss(labels: tf.Tensor, logits: tf.Tensor, global_batch: int | float) -> tf.Tensor:
    """Sum of per-example cross-entropies / global batch.

    Summed over the workers' (possibly unequal) shards of a global batch, this equals the mean loss of
    single-machine training on the concatenated batch, so all-reduce-SUM of the gradients is exact.
    """
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int64), logits=tf.cast(logits, tf.float32)
    )
    return tf.reduce_sum(per_example) / tf.cast(global_batch, tf.float32)


def weight_decay_loss(model: keras.Model, weight_decay: float) -> tf.Tensor:
    """0.5 * wd * sum(kernel**2): gradient wd * w on conv/dense kernels."""
    return 0.5 * weight_decay * tf.add_n([tf.reduce_sum(tf.square(v.value)) for v in kernel_variables(model)])


def evaluate(model: keras.Model, images: np.ndarray, labels: np.ndarray) -> tuple[float, float, int]:
    """(accuracy, mean cross-entropy, examples) with inference-mode batch norm, on this process."""

    @tf.function(reduce_retracing=True)  # type: ignore[untyped-decorator]
    def logits_fn(x: tf.Tensor) -> tf.Tensor:
        return model(x, training=False)

    correct, loss_sum = 0, 0.0
    for i in range(0, len(labels), EVAL_BATCH):
        x, y = images[i : i + EVAL_BATCH], labels[i : i + EVAL_BATCH]
        logits = logits_fn(tf.constant(x)).numpy()
        correct += int((logits.argmax(axis=1) == y).sum())
        loss_sum += float(weighted_loss(tf.constant(y), tf.constant(logits), 1.0).numpy())
    n = int(len(labels))
    return correct / max(n, 1), loss_sum / max(n, 1), n


def wait_for_addresses(addresses: list[str], timeout_s: float) -> list[str]:
    """Block until every host:port accepts TCP connections; return the ones still down at timeout."""
    deadline = time.monotonic() + timeout_s
    pending = list(addresses)
    while pending:
        pending = [a for a in pending if not address_up(a)]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return pending


def address_up(address: str, timeout_s: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False
