"""Unit tests of the training payload's pure-Python parts (no TensorFlow needed)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from tfjob import data
from tfjob import task as task_module
from tfjob.hparams import HPARAM_SETS, get_hparams
from tfjob.reporting import MetricsWriter, NoticeWatcher, WindowStats, write_json_atomic
from tfjob.task import TaskError, chief_address, load_task, parse_task

CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"], "ps": ["127.0.0.1:4"]}


def _raw(**over: object) -> dict[str, object]:
    raw: dict[str, object] = {
        "version": 1,
        "job_id": "j",
        "instance": "j-worker-1",
        "mode": "async",
        "role": "worker",
        "index": 1,
        "cluster": CLUSTER,
        "storage": "/tmp/x",
        "training": {"hparam_set": "resnet_tiny", "batch_per_worker": [32, 16], "train_steps": 10},
        "emulation": {"step_sleep_s": 0.15},
    }
    raw.update(over)
    return raw


def test_parse_task(tmp_path: Path) -> None:
    (tmp_path / "task.json").write_text(json.dumps(_raw()))
    t = load_task(tmp_path / "task.json")
    assert (t.role, t.index, t.num_workers, t.step_sleep_s) == ("worker", 1, 2, 0.15)
    assert t.training.batch_per_worker == (32, 16) and t.training.checkpoint_every == 100
    assert not t.is_chief and parse_task(_raw(role="chief", index=0)).is_chief
    sync = parse_task(_raw(mode="sync", index=0, cluster={"worker": CLUSTER["worker"]}))
    assert sync.is_chief


def test_worker0_runs_the_chief_when_the_cluster_has_none() -> None:
    # cluster.chief.on_worker0: the controller leaves the chief out of the cluster; worker 0 runs it.
    no_chief = {k: v for k, v in CLUSTER.items() if k != "chief"}
    w0 = parse_task(_raw(index=0, cluster=no_chief))
    assert w0.hosts_chief and w0.is_chief
    assert not parse_task(_raw(index=1, cluster=no_chief)).hosts_chief
    assert not parse_task(_raw(index=0)).hosts_chief, "a chief task of its own"
    assert not parse_task(_raw(role="ps", index=0, cluster=no_chief)).hosts_chief
    with pytest.raises(TaskError, match="at most one chief"):
        parse_task(_raw(cluster={**CLUSTER, "chief": ["127.0.0.1:1", "127.0.0.1:9"]}))
    # A VM of its own (cloud): the next port, inside the firewall's task port range; one shared address
    # (local instances): a free port below the ephemeral range.
    vms = {"worker": ["10.0.0.5:2222", "10.0.0.6:2222"], "ps": ["10.0.0.7:2222"]}
    assert chief_address(vms) == "10.0.0.5:2223"
    host, _, port = chief_address(no_chief).rpartition(":")
    low = task_module._ephemeral_low()  # this host's ephemeral range (32768 up by Linux default)
    assert host == "127.0.0.1" and (20000 <= int(port) < low or low - 20000 < 1024)  # no client takes it


@pytest.mark.parametrize(
    "over",
    [
        {"mode": "weird"},
        {"role": "worker", "index": 5},
        {"training": {"batch_per_worker": [32]}},
        {"mode": "sync"},  # sync cluster must only have workers
        {"emulation": {"step_sleep_s": -1}},
    ],
)
def test_parse_task_rejects(over: dict[str, object]) -> None:
    with pytest.raises(TaskError):
        parse_task(_raw(**over))


def test_hparams() -> None:
    assert get_hparams("resnet_cifar_56").blocks_per_stage == (9, 9, 9)
    assert set(HPARAM_SETS) >= {"resnet_cifar_15", "resnet_cifar_32", "resnet_cifar_56", "resnet_tiny"}
    assert get_hparams("resnet_cifar_15").scaled_lr(128) == pytest.approx(0.4)
    with pytest.raises(ValueError):
        get_hparams("nope")


def test_cifar10_pickle_reader(tmp_path: Path) -> None:
    rng = np.random.RandomState(0)
    batches = {}
    for name, n in [("data_batch_1", 5), ("data_batch_2", 3), ("test_batch", 4)]:
        imgs = rng.randint(0, 256, size=(n, 32, 32, 3)).astype(np.uint8)
        labels = rng.randint(0, 10, size=n)
        data.write_cifar10_batch(tmp_path / name, imgs, labels)
        batches[name] = (imgs, labels)
    # the file really is CIFAR's layout: channel planes of 1024 bytes, R first
    import pickle

    with open(tmp_path / "data_batch_1", "rb") as f:
        raw = pickle.load(f, encoding="bytes")
    assert raw[b"data"].shape == (5, 3072) and raw[b"data"].dtype == np.uint8
    assert raw[b"data"][0, 1] == batches["data_batch_1"][0][0, 0, 1, 0]  # R plane, pixel (0, 1)
    assert raw[b"data"][0, 1024] == batches["data_batch_1"][0][0, 0, 0, 1]  # G plane, pixel (0, 0)

    x, y = data.load_split(str(tmp_path), "train")
    assert x.shape == (8, 32, 32, 3) and x.dtype == np.uint8 and y.dtype == np.int64
    np.testing.assert_array_equal(x[:5], batches["data_batch_1"][0])
    np.testing.assert_array_equal(x[5:], batches["data_batch_2"][0])
    np.testing.assert_array_equal(y, np.concatenate([batches["data_batch_1"][1], batches["data_batch_2"][1]]))
    xt, yt = data.load_split(str(tmp_path), "test")
    np.testing.assert_array_equal(xt, batches["test_batch"][0])
    np.testing.assert_array_equal(yt, batches["test_batch"][1])
    with pytest.raises(FileNotFoundError):
        data.load_cifar10(tmp_path / "missing", "train")


def test_digits_split_is_fixed_and_disjoint() -> None:
    xtr, ytr = data.load_split(None, "train")
    xte, yte = data.load_split(None, "test")
    assert xtr.shape[1:] == (32, 32, 3) and len(xtr) + len(xte) == 1797 and len(xte) == 359
    assert set(np.unique(ytr)) == set(range(10))
    x2, y2 = data.load_split(None, "test")
    np.testing.assert_array_equal(yte, y2)
    assert xtr.max() == 255 and (xtr[..., 0] == xtr[..., 2]).all()


def test_records_roundtrip(tmp_path: Path) -> None:
    x, y = data.load_split(None, "test")
    p = data.write_records(tmp_path / "r.bin", x, y)
    recs = np.frombuffer(p.read_bytes(), np.uint8).reshape(-1, data.RECORD_BYTES)
    np.testing.assert_array_equal(recs[:, 0], y)
    np.testing.assert_array_equal(recs[:, 1:].reshape(x.shape), x)


def test_reporting(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "m" / "metrics.jsonl")
    w.write("start", step=0)
    w.write("step", step=1)
    lines = [json.loads(s) for s in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert [m["kind"] for m in lines] == ["start", "step"] and all("t" in m for m in lines)
    write_json_atomic(tmp_path / "result.json", {"step": 3})
    assert json.loads((tmp_path / "result.json").read_text()) == {"step": 3}

    (tmp_path / "notices").mkdir()
    (tmp_path / "notices" / "old").write_text("")
    nw = NoticeWatcher(tmp_path / "notices", poll_s=0.0)
    assert nw.poll() == []  # notices present at start count as seen
    (tmp_path / "notices" / "inst-1").write_text("")
    assert nw.poll() == ["inst-1"] and nw.poll() == []

    ws = WindowStats(start=time.monotonic() - 1.0)
    for wk in (0, 0, 0, 1, -1):
        ws.add(wk, 1.0)
    rec = ws.record(5, (32, 16))
    assert rec["workers"]["0"]["steps"] == 3 and rec["workers"]["1"]["steps"] == 1
    assert rec["steps_per_s"] == pytest.approx(5.0, rel=0.05)
    assert rec["workers"]["0"]["examples_per_s"] == pytest.approx(96, rel=0.05)
