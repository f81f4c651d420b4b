"""In-graph training input pipeline and the per-task files it reads from the task's cwd.

Every training task (async worker, sync worker) writes into its own cwd, before its server starts:
  - ``tfjob_train.records``: the training split as fixed-length records (see data.write_records);
  - ``task_index``: its worker index (decimal text);
  - ``emulated_step_sleep_us``: the emulated per-step extra delay in microseconds (decimal text).
In async mode the dataset function is traced on the chief but runs on each worker, so these relative
paths resolve against the *worker's* cwd: each worker reads its own data, index and sleep value in-graph.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing as _data_testing  # SleepDataset (TF 2.21)

from . import data

RECORD_FILE = "tfjob_train.records"
INDEX_FILE = "task_index"
SLEEP_FILE = "emulated_step_sleep_us"


def prepare_task_dir(cwd: Path, data_dir: str | None, worker_index: int, step_sleep_s: float) -> None:
    """Write the three per-task files (the records file only if missing or from another data source)."""
    src = cwd / (RECORD_FILE + ".source")
    source = f"cifar10:{Path(data_dir).resolve()}" if data_dir else "digits"
    if not (cwd / RECORD_FILE).exists() or not src.exists() or src.read_text() != source:
        images, labels = data.load_split(data_dir, "train")
        data.write_records(cwd / RECORD_FILE, images, labels)
        src.write_text(source)
    _write_text(cwd / INDEX_FILE, str(worker_index))
    _write_text(cwd / SLEEP_FILE, str(int(round(step_sleep_s * 1e6))))


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def read_int_file(name: str) -> tf.Tensor:
    """int64 scalar read in-graph from a text file (relative path: the executing task's cwd)."""
    return tf.strings.to_number(tf.strings.strip(tf.io.read_file(name)), out_type=tf.int64)


def _decode(raw: tf.Tensor, augment: bool) -> tuple[tf.Tensor, tf.Tensor]:
    label = tf.cast(raw[0], tf.int64)
    image = tf.reshape(raw[1:], data.IMAGE_SHAPE)
    image = (tf.cast(image, tf.float32) / 255.0 - 0.5) / 0.25
    if augment:  # CIFAR only (digits must not be flipped): random flip + 4-pixel pad and crop
        image = tf.image.random_flip_left_right(image)
        image = tf.image.resize_with_crop_or_pad(image, 40, 40)
        image = tf.image.random_crop(image, data.IMAGE_SHAPE)
    return image, label


def train_dataset(
    batch_size: int | tf.Tensor,
    seed: int | tf.Tensor,
    augment: bool,
    record_file: str = RECORD_FILE,
    sleep_us: int | tf.Tensor | None = None,
    worker_index: tf.Tensor | None = None,
) -> tf.data.Dataset:
    """Repeated batches (x float32 [B,32,32,3], y int64 [B][, worker index int32]).

    The record file is read whole into memory; each epoch is a full permutation drawn with a stateless op
    seeded by (seed, epoch), so tensor seeds (e.g. derived in-graph from the worker index) work.
    With ``sleep_us``, every get_next first sleeps that long (no prefetch after the sleep), which adds the
    emulated delay to each training step that consumes a batch.
    """
    recs = tf.reshape(tf.io.decode_raw(tf.io.read_file(record_file), tf.uint8), [-1, data.RECORD_BYTES])
    n = tf.shape(recs, out_type=tf.int64)[0]
    seed64 = tf.cast(seed, tf.int64)

    def epoch(e: tf.Tensor) -> tf.data.Dataset:
        order = tf.random.experimental.stateless_shuffle(tf.range(n), seed=tf.stack([seed64, e]))
        return tf.data.Dataset.from_tensor_slices(order)

    ds = tf.data.Dataset.range(2**62).flat_map(epoch)
    ds = ds.map(lambda i: _decode(tf.gather(recs, i), augment))
    ds = ds.batch(batch_size, drop_remainder=True)
    if worker_index is not None:
        idx = tf.cast(worker_index, tf.int32)
        ds = ds.map(lambda x, y: (x, y, idx))
    if sleep_us is not None:
        ds = ds.apply(_data_testing.sleep(tf.cast(sleep_us, tf.int64)))
    opts = tf.data.Options()
    opts.experimental_optimization.inject_prefetch = False
    opts.deterministic = True
    return ds.with_options(opts)


def worker_dataset_fn(
    batch_per_worker: tuple[int, ...], seed: int, augment: bool
) -> Callable[[], tf.data.Dataset]:
    """Dataset function for ClusterCoordinator.create_per_worker_dataset (runs on each worker)."""
    batches = tuple(int(b) for b in batch_per_worker)

    def dataset_fn() -> tf.data.Dataset:
        widx = read_int_file(INDEX_FILE)
        return train_dataset(
            batch_size=tf.gather(tf.constant(batches, tf.int64), widx),
            seed=tf.constant(seed, tf.int64) * 1009 + widx,  # distinct order per worker
            augment=augment,
            sleep_us=read_int_file(SLEEP_FILE),
            worker_index=widx,
        )

    return dataset_fn
