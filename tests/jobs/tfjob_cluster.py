"""Test helpers for the jobs/ payload: launch real train.py processes on free localhost ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.providers.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TRAIN_PY = REPO / "jobs" / "train.py"
if str(REPO / "jobs") not in sys.path:  # make the payload package `tfjob` importable by the unit tests
    sys.path.insert(0, str(REPO / "jobs"))


def free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def read_metrics(storage: Path) -> list[dict[str, Any]]:
    path = storage / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Cluster:
    root: Path
    mode: str
    training: dict[str, Any]
    cluster: dict[str, list[str]]
    sleeps: dict[str, float] = field(default_factory=dict)  # "worker:1" -> step_sleep_s
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def storage(self) -> Path:
        return self.root / "storage"

    def task_dir(self, name: str) -> Path:
        d = self.root / name.replace(":", "-")
        d.mkdir(parents=True, exist_ok=True)
        return d

    def start(self, name: str) -> subprocess.Popen[bytes]:
        role, index = name.split(":")
        d = self.task_dir(name)
        task = {
            "version": 1,
            "job_id": "test",
            "instance": f"test-{role}-{index}",
            "mode": self.mode,
            "role": role,
            "index": int(index),
            "cluster": self.cluster,
            "storage": str(self.storage),
            "training": self.training,
            "emulation": {"step_sleep_s": self.sleeps.get(name, 0.0)},
        }
        (d / "task.json").write_text(json.dumps(task))
        env = {**os.environ, "TFJOB_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
        log = open(d / "log.txt", "ab")  # noqa: SIM115
        p = subprocess.Popen(
            [sys.executable, str(TRAIN_PY), "--task", "task.json"],
            cwd=d,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = p
        return p

    def start_all(self) -> None:
        for role in ("ps", "worker", "chief"):
            for i in range(len(self.cluster.get(role, []))):
                self.start(f"{role}:{i}")

    def kill(self, name: str) -> None:
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)

    def kill_all(self) -> None:
        order = {"chief": 0, "worker": 1, "ps": 2}  # chief first: no PS-loss noise in its log
        for name in sorted(self.procs, key=lambda n: order[n.split(":")[0]]):
            self.kill(name)

    def log(self, name: str) -> str:
        path = self.task_dir(name) / "log.txt"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs_tail(self, n: int = 3000) -> str:
        return "\n".join(f"==== {k}\n{self.log(k)[-n:]}" for k in self.procs)

    def metrics(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [m for m in read_metrics(self.storage) if kind is None or m["kind"] == kind]

    def reached(self, step: int) -> bool:
        return any(m["step"] >= step for m in self.metrics("step"))

    def wait_for(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            for name, p in self.procs.items():
                if p.poll() not in (None, 0):
                    raise AssertionError(
                        f"{name} exited {p.returncode} while waiting for {what}\n" + self.logs_tail()
                    )
            time.sleep(0.1)
        raise AssertionError(f"timeout waiting for {what}\n" + self.logs_tail())

    def wait_exit(self, name: str, timeout: float) -> int:
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {timeout}s\n" + self.logs_tail()) from None

    def result(self) -> dict[str, Any]:
        return json.loads((self.storage / "result.json").read_text())


def training(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "resnet",
        "hparam_set": "resnet_tiny",
        "problem": "image_cifar10",
        "data_dir": None,
        "train_steps": 100,
        "batch_per_worker": [32, 32],
        "checkpoint_every": 0,
        "eval_every": 0,
        "log_every": 10,
        "seed": 0,
    }
    base.update(over)
    return base


MakeCluster = Callable[..., Cluster]  # the make_cluster fixture: (mode, workers=2, **training overrides)
