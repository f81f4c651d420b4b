"""In-process TensorFlow unit tests: weighted loss (sync mode), models, input pipeline."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402
from tfjob import data, pipeline  # noqa: E402
from tfjob.common import weight_decay_loss, weighted_loss  # noqa: E402
from tfjob.models import build_model, kernel_variables  # noqa: E402


def test_weighted_loss_equals_single_machine_loss() -> None:
    rng = np.random.RandomState(0)
    logits = tf.constant(rng.randn(64, 10).astype(np.float32))
    labels = tf.constant(rng.randint(0, 10, 64))
    single = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    shards = [(0, 48), (48, 64)]  # unequal per-worker batches [48, 16]
    summed = sum(weighted_loss(labels[a:b], logits[a:b], 64) for a, b in shards)
    assert float(summed) == pytest.approx(float(single), rel=1e-6)


def test_weighted_gradients_sum_to_single_machine_gradient() -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )
    rng = np.random.RandomState(1)
    x, y = tf.constant(rng.randn(20, 5).astype(np.float32)), tf.constant(rng.randint(0, 3, 20))
    wd, n_workers = 1e-2, 2

    def grads(xs: tf.Tensor, ys: tf.Tensor, scale_wd: float) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = weighted_loss(ys, model(xs), 20) + weight_decay_loss(model, wd) * scale_wd
        return tape.gradient(loss, model.trainable_variables)

    single = grads(x, y, 1.0)
    parts = [grads(x[:14], y[:14], 1 / n_workers), grads(x[14:], y[14:], 1 / n_workers)]
    for g, a, b in zip(single, *parts, strict=True):
        np.testing.assert_allclose(g.numpy(), (a + b).numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "name,n_convs",
    [("resnet_tiny", 1 + 2 * 3 + 2), ("resnet_cifar_15", 1 + 2 * 6 + 2), ("resnet_cifar_56", 1 + 2 * 27 + 2)],
)
def test_models(name: str, n_convs: int) -> None:
    m = build_model(name, (32, 32, 3), 10)
    assert m.output_shape == (None, 10)
    convs = [v for v in kernel_variables(m) if len(v.shape) == 4]
    assert len(convs) == n_convs  # stem + 2 per block + 2 projection shortcuts
    assert convs[-1].shape[-1] == (32 if name == "resnet_tiny" else 64)


def test_pipeline_reads_task_files_and_sleeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    pipeline.prepare_task_dir(tmp_path, None, worker_index=1, step_sleep_s=0.05)
    assert (tmp_path / pipeline.SLEEP_FILE).read_text().strip() == "50000"
    assert (tmp_path / pipeline.INDEX_FILE).read_text().strip() == "1"
    n = (tmp_path / pipeline.RECORD_FILE).stat().st_size // data.RECORD_BYTES
    assert n == 1797 - 359
    ds = tf.function(pipeline.worker_dataset_fn((8, 4), seed=0, augment=False))()
    it = iter(ds)
    x, y, w = next(it)
    assert x.shape == (4, 32, 32, 3) and y.shape == (4,) and int(w) == 1  # worker 1 -> batch 4
    t0 = time.monotonic()
    for _ in range(5):
        next(it)
    assert time.monotonic() - t0 >= 5 * 0.05  # each get_next pays the emulated sleep
    xa, _ = next(iter(pipeline.train_dataset(2, 0, augment=True, record_file=pipeline.RECORD_FILE)))
    assert xa.shape == (2, 32, 32, 3)
