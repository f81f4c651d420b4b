"""Datasets as uint8 arrays (numpy only, no TensorFlow): CIFAR-10 python pickles or offline digits.

Images are uint8 [N, 32, 32, 3], labels int64 [N]. Training tasks turn the training split into a
fixed-length record file (1 label byte + 3072 image bytes per record, CIFAR-10's binary layout) that
the in-graph input pipeline reads (see pipeline.py).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
RECORD_BYTES = 1 + 32 * 32 * 3
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0  # fixed: the held-out split never depends on the training seed

Arrays = tuple[np.ndarray, np.ndarray]


def read_cifar10_batch(path: str | Path) -> Arrays:
    """One CIFAR-10 python-pickle batch: dict with b"data" uint8 [N, 3072] (R, G, B planes) and b"labels"."""
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    data = np.asarray(d[b"data"], dtype=np.uint8)
    labels = np.asarray(d[b"labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise ValueError(f"{path}: not a CIFAR-10 batch (data {data.shape}, labels {labels.shape})")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def load_cifar10(data_dir: str | Path, split: str) -> Arrays:
    """split "train" (data_batch_1..5, whichever exist, at least one) or "test" (test_batch)."""
    root = Path(data_dir)
    names = [n for n in TRAIN_FILES if (root / n).exists()] if split == "train" else [TEST_FILE]
    if not names:
        raise FileNotFoundError(f"no CIFAR-10 data_batch_* in {root}")
    parts = [read_cifar10_batch(root / n) for n in names]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def load_digits_32(split: str) -> Arrays:
    """scikit-learn's bundled 8x8 digits (offline), upsampled 4x to 32x32, 3 channels, fixed 80/20 split."""
    from sklearn.datasets import load_digits

    ds = load_digits()
    imgs = np.round(ds.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)  # [N, 8, 8]
    imgs = np.repeat(np.repeat(imgs, 4, axis=1), 4, axis=2)  # [N, 32, 32]
    imgs = np.repeat(imgs[..., None], 3, axis=3)
    labels = ds.target.astype(np.int64)
    order = np.random.RandomState(DIGITS_SPLIT_SEED).permutation(len(labels))
    n_test = int(round(len(labels) * DIGITS_TEST_FRACTION))
    idx = order[:n_test] if split == "test" else order[n_test:]
    return np.ascontiguousarray(imgs[idx]), labels[idx]


def load_split(data_dir: str | None, split: str) -> Arrays:
    if split not in ("train", "test"):
        raise ValueError(f"bad split {split!r}")
    return load_cifar10(data_dir, split) if data_dir else load_digits_32(split)


def normalize(images: np.ndarray) -> np.ndarray:
    """uint8 -> float32 roughly zero-mean unit-variance (same formula as the in-graph pipeline)."""
    return ((images.astype(np.float32) / 255.0) - 0.5) / 0.25


def write_records(path: str | Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """Fixed-length records (label byte + HWC image bytes), written atomically."""
    path = Path(path)
    recs = np.empty((len(labels), RECORD_BYTES), dtype=np.uint8)
    recs[:, 0] = labels.astype(np.uint8)
    recs[:, 1:] = images.reshape(len(labels), -1)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(recs.tobytes())
    os.replace(tmp, path)
    return path


def write_cifar10_batch(path: str | Path, images: np.ndarray, labels: np.ndarray) -> None:
    """Write arrays in CIFAR-10 python-pickle format (used by tests to fake a data_dir)."""
    data = np.ascontiguousarray(images.transpose(0, 3, 1, 2)).reshape(len(labels), -1).astype(np.uint8)
    with open(path, "wb") as f:
        pickle.dump({b"batch_label": b"fake", b"data": data, b"labels": [int(v) for v in labels]}, f)
