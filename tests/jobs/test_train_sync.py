"""Sync mode (MultiWorkerMirroredStrategy) with real processes on localhost."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tfjob_cluster import Cluster, MakeCluster

pytest.importorskip("tensorflow")

from tfjob import data  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.extended
def test_sync_unequal_batches_with_notice(make_cluster: MakeCluster) -> None:
    c: Cluster = make_cluster(
        "sync", workers=2, train_steps=150, batch_per_worker=[48, 16], log_every=10, checkpoint_every=60
    )
    c.start_all()
    c.wait_for(lambda: c.reached(30), 90, "step 30")
    t0 = time.time()
    (c.storage / "notices" / "test-worker-1").write_text("")
    c.wait_for(lambda: any(m["reason"] == "notice" for m in c.metrics("checkpoint")), 10, "notice checkpoint")
    assert c.wait_exit("worker:0", 120) == 0, c.logs_tail()
    assert c.wait_exit("worker:1", 30) == 0, c.logs_tail()
    notice = next(m for m in c.metrics("checkpoint") if m["reason"] == "notice")
    seen = notice["t"] - notice["seconds"] - t0  # when the save began; its length is the host's speed
    print(f"sync notice checkpoint begun {seen:.2f}s after the notice ({notice['seconds']}s to save)")
    assert seen < 2.0
    # every worker saved at the same step (worker 1 into its scratch dir)
    assert f"worker 1: saved checkpoint at step {notice['step']} (notice)" in c.log("worker:1")
    assert (c.task_dir("worker:1") / "tfjob_scratch_ckpt" / "ckpt-150.index").exists()
    res = c.result()
    assert res["step"] == 150 and res["mode"] == "sync" and res["accuracy"] > 0.7, res
    start = c.metrics("start")[0]
    assert start["workers"] == 2 and not start["resumed"]
    last = c.metrics("step")[-1]
    assert last["workers"]["0"]["steps"] == last["workers"]["1"]["steps"] == 10
    assert last["workers"]["0"]["examples_per_s"] == pytest.approx(
        3 * last["workers"]["1"]["examples_per_s"], rel=1e-3
    )
    reasons = [m["reason"] for m in c.metrics("checkpoint")]
    assert reasons[0] == "notice" and reasons[-1] == "final" and "periodic" in reasons


@pytest.mark.extended
def test_sync_cifar_pickle_data_dir_and_resume(make_cluster: MakeCluster, tmp_path: Path) -> None:
    # a CIFAR-10 python-pickle folder holding the (learnable) digits images
    ddir = tmp_path / "cifar-10-batches-py"
    ddir.mkdir()
    x, y = data.load_split(None, "train")
    data.write_cifar10_batch(ddir / "data_batch_1", x[:700], y[:700])
    data.write_cifar10_batch(ddir / "data_batch_2", x[700:], y[700:])
    xt, yt = data.load_split(None, "test")
    data.write_cifar10_batch(ddir / "test_batch", xt[:200], yt[:200])
    c: Cluster = make_cluster(
        "sync",
        workers=1,
        train_steps=160,
        batch_per_worker=[32],
        checkpoint_every=40,
        eval_every=100,
        data_dir=str(ddir),
    )
    c.start_all()
    c.wait_for(lambda: any(m["step"] >= 40 for m in c.metrics("checkpoint")), 90, "a checkpoint")
    c.kill_all()
    c.start_all()
    assert c.wait_exit("worker:0", 120) == 0, c.logs_tail()
    starts = c.metrics("start")
    assert [s["resumed"] for s in starts] == [False, True] and starts[1]["step"] >= 40
    res = c.result()
    assert res["step"] == 160 and res["eval_examples"] == 200 and res["accuracy"] > 0.5, res
    assert [m["step"] for m in c.metrics("eval")] == [100, 160]


def test_odd_batch_with_default_threads_does_not_crash(tmp_path: Path) -> None:
    """Regression: TF 2.21's oneDNN CPU kernels crashed on batch 15 with several intra-op threads (the
    cluster fixture caps threads at 1, which hid it); jobs/train.py turns oneDNN off."""
    import json
    import os
    import subprocess
    import sys

    jobs = Path(__file__).resolve().parents[2] / "jobs"
    (tmp_path / "task.json").write_text(json.dumps({
        "version": 1, "job_id": "odd", "instance": "odd-worker-0-0", "mode": "sync", "role": "worker", "index": 0,
        "cluster": {"worker": ["127.0.0.1:0"]}, "storage": str(tmp_path / "storage"),
        "training": {"hparam_set": "resnet_tiny", "train_steps": 12, "batch_per_worker": [15], "log_every": 4,
                     "checkpoint_every": 1000},
    }))
    env = {k: v for k, v in os.environ.items() if k not in ("TFJOB_THREADS", "TF_ENABLE_ONEDNN_OPTS")}
    out = subprocess.run([sys.executable, str(jobs / "train.py"), "--task", "task.json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert json.loads((tmp_path / "storage" / "result.json").read_text())["step"] == 12
