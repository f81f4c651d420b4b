"""Async mode (ParameterServerStrategy) with real processes on localhost: 1 ps + chief + 2 workers."""

from __future__ import annotations

import time

import pytest
from tfjob_cluster import Cluster, MakeCluster

pytest.importorskip("tensorflow")

pytestmark = pytest.mark.slow


def _check_common(c: Cluster, steps: int) -> None:
    res = c.result()
    assert res["step"] == steps and res["mode"] == "async" and res["eval_examples"] == 359
    kinds = [m["kind"] for m in c.metrics()]
    assert kinds[0] == "start" and kinds[-2:] == ["checkpoint", "eval"]
    assert c.metrics("checkpoint")[-1]["reason"] == "final"


@pytest.mark.extended
def test_async_trains_to_high_accuracy(make_cluster: MakeCluster) -> None:
    c = make_cluster("async", train_steps=120, log_every=10, eval_every=60)
    c.start_all()
    assert c.wait_exit("chief:0", 150) == 0, c.logs_tail()
    _check_common(c, 120)
    # chance = 0.1. Async staleness depends on how the host schedules the two workers: 0.85+ on a quiet host,
    # 0.64 once on a loaded CI machine; the falling loss below is the other half of "it learns".
    assert c.result()["accuracy"] > 0.5
    assert [m["step"] for m in c.metrics("eval")] == [60, 120]
    steps = c.metrics("step")
    assert [m["step"] for m in steps] == list(range(10, 121, 10))
    per_worker = {w: sum(m["workers"][w]["steps"] for m in steps) for w in ("0", "1")}
    assert sum(per_worker.values()) == 120 and min(per_worker.values()) > 20, per_worker
    last = steps[-1]
    assert last["loss"] < steps[0]["loss"] and last["examples_per_s"] > 0 and last["steps_per_s"] > 0
    for w in last["workers"].values():
        assert set(w) == {"steps", "batch", "examples_per_s", "step_time_s"}  # the batch it ran
    assert c.procs["ps:0"].poll() is None and c.procs["worker:0"].poll() is None  # servers run until killed


@pytest.mark.extended
def test_async_emulated_slow_worker(make_cluster: MakeCluster) -> None:
    c = make_cluster("async", train_steps=200, log_every=20)
    c.sleeps = {"worker:1": 0.2}
    c.start_all()
    assert c.wait_exit("chief:0", 150) == 0, c.logs_tail()
    steps = c.metrics("step")[1:]  # skip the warm-up window
    secs = sum(m["window_s"] for m in steps)
    n0 = sum(m["workers"]["0"]["steps"] for m in steps)
    n1 = sum(m["workers"]["1"]["steps"] for m in steps)
    t0, t1 = secs / n0, secs / max(n1, 1)
    print(
        f"emulation: worker0 {n0} steps ({t0:.3f} s/step), worker1 {n1} steps ({t1:.3f} s/step), "
        f"ratio {n0 / max(n1, 1):.2f}, expected {(t0 + 0.2) / t0:.2f}"
    )
    # the ratio follows the measured step: 0.2 s on a 0.1 s step is 3x, on a loaded host's 0.25 s step 1.8x;
    # half of the expected slowdown showing is the claim (the emulation acts), not its exact size
    expected = (t0 + 0.2) / t0
    assert n1 > 0 and n0 / n1 > 1 + 0.5 * (expected - 1)
    # the slow worker pays ~0.2 s on top of the same compute; a loaded host adds to both workers' steps
    # (their difference moves), so the bounds check "once, not zero times or twice"
    assert 0.1 < t1 - t0 < 0.4


@pytest.mark.extended
def test_async_survives_worker_loss(make_cluster: MakeCluster) -> None:
    c = make_cluster("async", train_steps=500, log_every=10)
    c.sleeps = {"worker:0": 0.04, "worker:1": 0.04}
    c.start_all()
    c.wait_for(lambda: c.reached(40), 90, "step 40")
    c.kill("worker:1")
    time.sleep(2)
    c.start("worker:1")  # replacement at the same host:port
    t_restart = time.time()
    assert c.wait_exit("chief:0", 150) == 0, c.logs_tail()
    _check_common(c, 500)
    assert c.result()["accuracy"] > 0.7
    rejoined = [m for m in c.metrics("step") if m["t"] > t_restart and m["workers"]["1"]["steps"] > 0]
    assert rejoined, "the replacement worker never ran a step"
    print(f"replacement worker ran its first step {rejoined[0]['t'] - t_restart:.1f}s after its restart")


@pytest.mark.extended
def test_async_chief_exits_nonzero_on_ps_loss(make_cluster: MakeCluster) -> None:
    c = make_cluster("async", train_steps=5000)
    c.start_all()
    c.wait_for(lambda: c.reached(20), 90, "step 20")
    c.kill("ps:0")
    t0 = time.monotonic()
    assert c.wait_exit("chief:0", 60) == 3
    print(f"chief exited {time.monotonic() - t0:.1f}s after the PS was killed")
    assert not (c.storage / "result.json").exists()


@pytest.mark.extended
def test_async_resume_from_checkpoint(make_cluster: MakeCluster) -> None:
    c = make_cluster("async", train_steps=200, checkpoint_every=50)
    c.start_all()
    c.wait_for(lambda: any(m["step"] >= 50 for m in c.metrics("checkpoint")), 90, "a checkpoint")
    saved = max(m["step"] for m in c.metrics("checkpoint"))
    c.kill_all()  # the whole cluster goes down (SIGKILL)
    c.start_all()
    assert c.wait_exit("chief:0", 150) == 0, c.logs_tail()
    starts = c.metrics("start")
    assert [s["resumed"] for s in starts] == [False, True]
    assert starts[1]["step"] >= saved >= 50
    _check_common(c, 200)


def test_async_notice_triggers_checkpoint(make_cluster: MakeCluster) -> None:
    c = make_cluster("async", train_steps=5000, checkpoint_every=0)
    (c.storage / "notices").mkdir(parents=True)
    (c.storage / "notices" / "stale").write_text("")  # present before start: already handled
    c.start_all()
    c.wait_for(lambda: c.reached(20), 90, "step 20")
    t0 = time.time()
    (c.storage / "notices" / "test-worker-1").write_text("preempted\n")
    c.wait_for(lambda: bool(c.metrics("checkpoint")), 10, "notice checkpoint")
    ck = c.metrics("checkpoint")
    assert len(ck) == 1 and ck[0]["reason"] == "notice" and ck[0]["step"] >= 20
    seen = ck[0]["t"] - ck[0]["seconds"] - t0  # when the save began: the save's own length is the host's speed
    print(f"notice checkpoint begun {seen:.2f}s after the notice ({ck[0]['seconds']}s to save)")
    assert seen < 2.0
    assert (c.storage / "checkpoints" / "checkpoint").exists()
