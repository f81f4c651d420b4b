"""The built-in job on torchft replica groups (jobs/torchjob/ft_worker.py), started as the controller starts it.

Three real processes (``node.py`` with ``torch.fault_tolerance: torchft``, gloo on the CPU) train through one
Lighthouse in this test's process. Worker 0's notice makes it leave at the next step boundary after a checkpoint;
the two survivors go on in the same processes (no torchrun, no restart) with the planned global batch, lose no step,
and rank 0 writes the quorum change, the step lines, the eval and result.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchft")
from torchft.coordination import LighthouseServer  # noqa: E402

pytestmark = pytest.mark.slow
JOBS = Path(__file__).resolve().parents[2] / "jobs"
STEPS = 40


def _task(storage: Path, index: int, lighthouse: str) -> dict[str, Any]:
    return {
        "version": 1, "job_id": "ft", "instance": f"ft-worker-{index}-0", "mode": "sync", "role": "worker",
        "index": index, "cluster": {"worker": []}, "storage": str(storage), "gpu": None,
        "training": {"hparam_set": "resnet_tiny", "train_steps": STEPS, "batch_per_worker": [8, 8, 16],
                     "checkpoint_every": 10, "log_every": 1},
        "torch": {"rdzv_endpoint": "127.0.0.1:1", "min_nodes": 1, "max_nodes": 3, "threads": 1,
                  "fault_tolerance": "torchft", "lighthouse": lighthouse},
    }


def _lighthouse(min_replicas: int) -> tuple[LighthouseServer, str, dict[str, str]]:
    """A Lighthouse in this process (as the controller runs one), its address, and the groups' environment."""
    server = LighthouseServer(bind="[::]:0", min_replicas=min_replicas, join_timeout_ms=1000, quorum_tick_ms=50,
                              heartbeat_timeout_ms=1000)
    lighthouse = "http://127.0.0.1:" + server.address().rsplit(":", 1)[1]
    return server, lighthouse, {**os.environ, "TORCHJOB_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}


def _node(tmp_path: Path, i: int, task: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Node ``i`` of the job: its task.json written, jobs/torchjob/node.py started on it, its output in node-i.log."""
    path = tmp_path / f"task-{i}.json"
    path.write_text(json.dumps(task))
    log = (tmp_path / f"node-{i}.log").open("wb")  # noqa: SIM115 - the child's, closed with the folder
    return subprocess.Popen([sys.executable, str(JOBS / "torchjob" / "node.py"), "--task", str(path)],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)


def _records(storage: Path) -> list[dict[str, Any]]:
    path = storage / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def test_a_noticed_replica_group_leaves_and_the_survivors_train_on_in_the_same_processes(tmp_path: Path) -> None:
    server, lighthouse, env = _lighthouse(min_replicas=1)
    storage = tmp_path / "storage"
    procs = []
    for i in range(3):
        procs.append(_node(tmp_path, i, _task(storage, i, lighthouse), env))
    try:
        end = time.monotonic() + 180
        while not any(r["kind"] == "step" and r["step"] >= 8 and r["world_size"] == 3 for r in _records(storage)):
            assert time.monotonic() < end and all(p.poll() is None for p in procs), "no 3-group step came"
            time.sleep(0.1)
        (storage / "notices").mkdir(parents=True, exist_ok=True)
        (storage / "notices" / "ft-worker-0-0").write_text("{}")
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
        server.shutdown()
    logs = "\n".join((tmp_path / f"node-{i}.log").read_text()[-2000:] for i in range(3))
    assert codes == [-9, 0, 0], logs  # worker 0 left as a revoked node does; the survivors were never restarted
    records = _records(storage)
    steps = [r["step"] for r in records if r["kind"] == "step"]
    assert steps == list(range(1, STEPS + 1)), logs  # every step once: none lost, none repeated
    # A group that starts late (a loaded host) makes the first quorum 2 and grows it to 3 with a heal; the notice's
    # change is the one shrink, and it is the last change.
    quorum = [(r["world_before"], r["world_after"], r["step"]) for r in records if r["kind"] == "quorum"]
    assert [(b, a) for b, a, _ in quorum if a < b] == [(3, 2)], quorum
    assert quorum[-1][:2] == (3, 2) and all(a == 3 for _, a, _ in quorum[:-1]), quorum
    after = [r for r in records if r["kind"] == "step" and r["step"] > quorum[-1][2]]
    assert after and all(sum(w["batch"] for w in r["workers"].values()) == 32 for r in after)  # the planned batch
    assert any(r["kind"] == "checkpoint" and r["reason"] == "notice" for r in records)
    assert json.loads((storage / "result.json").read_text())["step"] == STEPS
    assert sum(r["kind"] == "start" for r in records) == 1


def test_replica_groups_re_split_the_global_batch_off_a_slowed_group(tmp_path: Path) -> None:
    """Worker 0's emulated GPU runs 4x slow from step 0: the groups share their compute times in each step's
    agreement, every one runs the torchrun trainer's Rebalancer on the same figures, and examples move off worker 0
    (a ``resplit`` event for the controller) while the global batch stays 32 (jobs/torchjob/ft_worker._resplit)."""
    server, lighthouse, env = _lighthouse(min_replicas=3)
    storage = tmp_path / "storage"
    procs = []
    for i in range(3):
        task = _task(storage, i, lighthouse)
        task["training"]["train_steps"] = 30
        task["torch"].update(resplit_every=4, sleep_table=[[1, 0.004], [32, 0.128]],  # emulated: 4 ms an example
                             slowdowns=[[0, 4.0]] if i == 0 else [])
        procs.append(_node(tmp_path, i, task, env))
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
        server.shutdown()
    logs = "\n".join((tmp_path / f"node-{i}.log").read_text()[-2000:] for i in range(3))
    assert codes == [0, 0, 0], logs
    events = [json.loads(ln) for ln in (storage / "torch_events.jsonl").read_text().splitlines()]
    assert events and all(e["kind"] == "resplit" for e in events), events
    assert events[-1]["batches"]["0"] < 8 and all(sum(e["batches"].values()) == 32 for e in events), events
    last = [r for r in _records(storage) if r["kind"] == "step"][-1]
    assert last["workers"]["0"]["batch"] == events[-1]["batches"]["0"], last  # trained at the split it chose


def test_a_joiner_whose_peers_have_finished_leaves_without_training(tmp_path: Path) -> None:
    """A replacement started while the others trained (``torch.join``) whose first quorum comes after they finished:
    alone at step 0 with the job's result.json in its storage, it exits 0 and writes no line. (Training alone from
    the checkpoint wrote the job's steps a second time: tests/test_gce_torchft_e2e under a loaded host.)"""
    server, lighthouse, env = _lighthouse(min_replicas=1)
    storage = tmp_path / "storage"
    storage.mkdir()
    done = [{"kind": "start", "t": 0.0}] + [{"kind": "step", "step": s, "world_size": 2} for s in (1, 2)]
    (storage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done))
    (storage / "result.json").write_text(json.dumps({"step": STEPS}))
    task = _task(storage, 0, lighthouse)
    task["torch"]["join"] = True
    proc = _node(tmp_path, 0, task, env)
    try:
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
        server.shutdown()
    log = (tmp_path / "node-0.log").read_text()
    assert code == 0, log[-2000:]
    assert "joined after the other groups finished" in log, log[-2000:]
    assert _records(storage) == done  # no start line, no step written again


def test_two_joiners_whose_peers_have_finished_wait_for_the_result_and_leave(tmp_path: Path) -> None:
    """Two replacements that both start after the others finished, before the job's result.json reaches them: in a
    quorum of joiners only at step 0 they wait (each says it joins, in the step's agreement), and leave with exit 0 and
    no line once the result is there. (Two joiners together went on from the checkpoint, as a fresh world does.)"""
    server, lighthouse, env = _lighthouse(min_replicas=2)
    storage = tmp_path / "storage"
    storage.mkdir()
    done = [{"kind": "start", "t": 0.0}] + [{"kind": "step", "step": s, "world_size": 3} for s in (1, 2)]
    (storage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done))
    procs = []
    for i in range(2):
        task = _task(storage, i, lighthouse)
        task["torch"]["join"] = True
        procs.append(_node(tmp_path, i, task, env))
    try:
        end = time.monotonic() + 120
        logs = [tmp_path / f"node-{i}.log" for i in range(2)]
        while not all("waiting for the job's result" in p.read_text() for p in logs):
            assert time.monotonic() < end and all(p.poll() is None for p in procs), "no quorum came"
            time.sleep(0.2)
        time.sleep(2.0)  # a few closed attempts of the joiners' quorum
        (storage / "result.json").write_text(json.dumps({"step": STEPS}))
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
        server.shutdown()
    text = "\n".join(p.read_text()[-2000:] for p in logs)
    assert codes == [0, 0], text
    assert _records(storage) == done, text  # no start line, no step written again
