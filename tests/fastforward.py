"""Fast-forward: a local job driven by the real daemon pass loop (``control.daemon.run_on``), the real local
provider with its emulated hosts (``providers.local.host.run``), SQLite and local storage, all on one
``VirtualClock``; the payload is a stub that speaks the payload's protocol (jobs/README.md) on that clock.

What runs as processes in a real launch runs here as threads that take turns on the virtual clock (one at a time,
in an order fixed by their sleeps), so a job of minutes runs in seconds and its decisions are the same every run,
whatever the host's load. The stub reads its ``task.json``, writes the ``start``, ``step``, ``checkpoint`` and
``eval`` lines of ``metrics.jsonl`` at the emulated step times, checkpoints every ``checkpoint_every`` steps and on
each new notice under ``notices/``, resumes from its latest checkpoint, writes ``result.json`` at the end, and
exits as the real tasks do: 3 when a sync peer or a parameter server is lost, -9 (killed) when its instance is.
A PyTorch job's tasks (task.json with a ``torch`` section) speak that payload's protocol instead: torchrun agents
in an elastic rendezvous, world changes, re-splits and pipeline stages (tests/fastforward_torch.py).
What it does not do is train: the payload contracts themselves are the real-payload tests' (tests/test_*_e2e.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastforward_torch  # tests/: the PyTorch payload's protocol (it imports this module's types only)
import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.clock import VirtualClock
from orchestrator.control import daemon
from orchestrator.control.execute import TASK
from orchestrator.control.launcher import create_job
from orchestrator.model import task as task_schema
from orchestrator.model.instances import ProcState, ProcStatus
from orchestrator.model.spec import JobSpec, validate_spec
from orchestrator.model.status import FINAL_JOB
from orchestrator.model.torch_spec import is_pytorch
from orchestrator.providers import registry
from orchestrator.providers.local import backend as local_backend
from orchestrator.providers.local import host
from orchestrator.providers.local.provider import LocalProvider, ProcessHosts
from orchestrator.storage.base import CHECKPOINTS, METRICS, NOTICES, RESULT
from orchestrator.store.db import open_session
from orchestrator.store.models import Event, Instance, Job, Metric
from orchestrator.transport.base import Endpoint
from orchestrator.transport.local import LocalTransport
from tests.e2e_helpers import example_doc

START_S = 10.0  # the stub's set-up before its first step (TensorFlow's import and the cluster's connect: 8-15 s)
COMPUTE_S = 0.02  # a step's own compute, beside the emulated GPU's sleep
POLL_S = 0.5  # how often a task looks for notices, its peers and its instance (the real chief's notice poll)
PEER_LOST_S = 2.0  # a sync peer's loss is seen this long after (the coordination service's heartbeats)


class ThreadHosts(ProcessHosts):
    """Each instance's emulated host (``host.run``) as a thread on the virtual clock, not a detached process."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.threads: dict[str, Any] = {}

    def start(self, d: Path) -> int:
        def run() -> None:
            with contextlib.suppress(host.FolderGone):  # deleted: its stub tasks see the folder gone and end
                host.run(d, self.clock)

        self.threads[str(d)] = self.clock.spawn(run, f"host {d.name}")
        return 0

    def started(self, d: Path) -> bool:
        return str(d) in self.threads

    def alive(self, d: Path, state: dict[str, Any], now: float) -> bool:
        thread = self.threads.get(str(d))
        return thread is not None and thread.is_alive()

    def recorded(self, d: Path, state: dict[str, Any] | None) -> list[int]:
        return []

    def end_and_remove(self, folder: Path, host_of: tuple[Path, list[int]] | None) -> None:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class StubTask:
    workdir: Path
    config: task_schema.TaskConfig
    state: ProcState = ProcState.RUNNING
    code: int | None = None
    stopped: bool = False
    joins_at: float = 0.0  # when it has set up and steps (a worker that rejoins takes START_S, as TF's import)

    @property
    def alive(self) -> bool:
        return self.state == ProcState.RUNNING

    def stepping(self, now: float) -> bool:
        return self.alive and now >= self.joins_at

    def instance_gone(self) -> bool:
        try:
            state: dict[str, Any] = json.loads((self.workdir.parent / "instance.json").read_text())
            return bool(state["state"] == "terminated")
        except (OSError, ValueError):
            return True  # its folder was deleted (or moved aside)


class StubTransport(LocalTransport):
    """The local transport, but ``task`` starts the stub payload as a thread on the clock (files are real)."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock)
        self.vclock = clock
        self.tasks: dict[str, StubTask] = {}
        self.started: list[str] = []  # instance names, in the order their tasks started
        self.worlds: dict[str, Any] = {}  # PyTorch jobs: job id -> its rendezvous (tests/fastforward_torch.py)

    def start(self, ep: Endpoint, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        assert name == TASK, f"the stub payload runs the task only, not {name}"
        current = self.tasks.get(ep.workdir)
        if current is not None and current.alive:
            return
        workdir = Path(ep.workdir)
        stub = StubTask(workdir, task_schema.load(workdir / "task.json"), joins_at=self.vclock.time() + START_S)
        self.tasks[ep.workdir] = stub
        self.started.append(stub.config.instance)
        if stub.config.torch is not None:  # the PyTorch payload's protocol: a torchrun agent per instance
            self.vclock.spawn(lambda: fastforward_torch.run_node(self, stub), f"node {stub.config.instance}")
        else:
            self.vclock.spawn(lambda: _run_stub(self, stub), f"task {stub.config.instance}")

    def status(self, ep: Endpoint, names: list[str]) -> dict[str, ProcStatus]:
        stub = self.tasks.get(ep.workdir)
        if stub is None:
            return {n: ProcStatus(ProcState.ABSENT) for n in names}
        return {n: ProcStatus(stub.state, stub.code) for n in names}

    def stop(self, ep: Endpoint, name: str) -> None:
        stub = self.tasks.get(ep.workdir)
        if stub is not None and stub.alive:
            stub.stopped = True  # it writes nothing more: seen before anything else when it next runs
            stub.state, stub.code = ProcState.EXITED, -9

    def peers(self, job_id: str) -> list[StubTask]:
        return [t for t in self.tasks.values() if t.config.job_id == job_id]


def _exit(stub: StubTask, code: int) -> None:
    if stub.alive:
        stub.state, stub.code = ProcState.EXITED, code


def _run_stub(transport: StubTransport, stub: StubTask) -> None:
    cfg = stub.config
    chief = _is_chief(cfg)
    clock = transport.vclock
    if not chief:
        while not stub.stopped:
            clock.sleep(POLL_S)
            if stub.stopped or stub.instance_gone():
                return _exit(stub, -9)
            if cfg.mode == "sync" and _lost_peer(transport, stub, lambda t: _is_chief(t.config)):
                clock.sleep(PEER_LOST_S)
                return _exit(stub, 3)
        return None
    return _Chief(transport, stub).run()


def _is_chief(cfg: task_schema.TaskConfig) -> bool:
    if cfg.mode == "sync" or "chief" not in cfg.cluster:
        return cfg.role == "worker" and cfg.index == 0
    return cfg.role == "chief"


def _lost_peer(transport: StubTransport, stub: StubTask, which: Callable[[StubTask], bool]) -> bool:
    """Is a peer that ``which`` picks, of this task's cluster generation, gone? (its newest task per slot)"""
    newest: dict[tuple[str, int], StubTask] = {}
    for t in transport.peers(stub.config.job_id):
        newest[(t.config.role, t.config.index)] = t
    return any(not t.alive for t in newest.values() if t is not stub and which(t))


@dataclass
class _Chief:
    transport: StubTransport
    stub: StubTask
    step: float = 0.0
    seen_notices: set[str] = field(default_factory=set)

    @property
    def storage(self) -> Path:
        return Path(self.stub.config.storage)

    def write(self, record: dict[str, Any]) -> None:
        with (self.storage / METRICS).open("a") as fh:
            fh.write(json.dumps({"t": self.transport.vclock.time(), **record}) + "\n")

    def checkpoint(self, reason: str) -> None:
        (self.storage / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
        (self.storage / CHECKPOINTS / f"ckpt-{int(self.step)}").write_text("")
        self.write({"kind": "checkpoint", "step": int(self.step), "reason": reason, "seconds": 0.1})

    def notices(self) -> set[str]:
        try:
            return set(os.listdir(self.storage / NOTICES))
        except OSError:
            return set()

    def step_s(self) -> float | None:
        """Seconds a global step takes now (None: no worker to run one): sync, the slowest; async, their rates."""
        cfg = self.stub.config
        if cfg.mode == "sync":
            return self.stub.config.step_sleep_s + COMPUTE_S
        workers = {t.config.index: t for t in self.transport.peers(cfg.job_id) if t.config.role == "worker"}
        now = self.transport.vclock.time()
        rates = [1.0 / (t.config.step_sleep_s + COMPUTE_S) for t in workers.values() if t.stepping(now)]
        return 1.0 / sum(rates) if rates else None

    def live_workers(self) -> set[int]:
        """The worker indices that step now (sync: every one, the world steps together)."""
        cfg = self.stub.config
        if cfg.mode == "sync":
            return set(range(len(cfg.training.batch_per_worker)))
        now = self.transport.vclock.time()
        return {t.config.index for t in self.transport.peers(cfg.job_id)
                if t.config.role == "worker" and t.stepping(now)}

    def resume(self) -> int:
        try:
            steps = [int(p.name.removeprefix("ckpt-")) for p in (self.storage / CHECKPOINTS).iterdir()]
        except OSError:
            steps = []
        return max(steps, default=0)

    def run(self) -> None:
        clock, cfg, t = self.transport.vclock, self.stub.config, self.stub.config.training
        self.storage.mkdir(parents=True, exist_ok=True)
        self.seen_notices = self.notices()  # present at start: handled already
        clock.sleep(START_S)
        if self.stopped():
            return None
        self.step = float(self.resume())
        self.write({"kind": "start", "step": int(self.step), "resumed": self.step > 0, "mode": cfg.mode,
                    "workers": len(cfg.training.batch_per_worker), "setup_s": START_S})
        last_log = clock.time()
        while int(self.step) < t.train_steps:
            clock.sleep(POLL_S)
            if self.stopped():
                return None
            if self._peer_lost():
                clock.sleep(PEER_LOST_S)
                return _exit(self.stub, 3)
            before, pace = int(self.step), self.step_s()
            if pace is not None:
                self.step = min(float(t.train_steps), self.step + POLL_S / pace)
            self._lines(before, int(self.step), clock.time() - last_log)
            if int(self.step) // t.log_every > before // t.log_every:
                last_log = clock.time()
            new = self.notices() - self.seen_notices
            if new:
                self.seen_notices |= new
                self.checkpoint("notice")
        self.checkpoint("final")
        self.write({"kind": "eval", "step": int(self.step), "accuracy": 0.9, "loss": 0.3, "examples": 359})
        result = {"step": int(self.step), "accuracy": 0.9, "loss": 0.3, "eval_examples": 359, "mode": cfg.mode}
        (self.storage / RESULT).write_text(json.dumps(result))
        return _exit(self.stub, 0)

    def stopped(self) -> bool:
        if self.stub.stopped or not self.stub.alive:
            return True
        if self.stub.instance_gone():
            _exit(self.stub, -9)
            return True
        return False

    def _peer_lost(self) -> bool:
        cfg = self.stub.config
        if cfg.mode == "sync":
            return _lost_peer(self.transport, self.stub, lambda t: t.config.role == "worker")
        return _lost_peer(self.transport, self.stub, lambda t: t.config.role == "ps")

    def _lines(self, before: int, now: int, window_s: float) -> None:
        t = self.stub.config.training
        for step in range(before + 1, now + 1):
            if step % t.log_every == 0 or step == t.train_steps:
                batch = sum(t.batch_per_worker)
                pace = self.step_s() or 1.0
                self.write({"kind": "step", "step": step, "loss": 1.0 / (1 + step / 100),
                            "examples_per_s": batch / pace, "steps_per_s": 1.0 / pace, "window_s": window_s,
                            "workers": {str(i): {"steps": t.log_every, "examples_per_s": b / pace,
                                                 "step_time_s": pace}
                                        for i, b in enumerate(t.batch_per_worker) if i in self.live_workers()}})
            if t.checkpoint_every and step % t.checkpoint_every == 0 and step < t.train_steps:
                self.step, at = float(step), self.step
                self.checkpoint("periodic")
                self.step = at


@dataclass
class Run:
    """What a fast-forwarded job left in its results DB, read back after it ended."""

    job: dict[str, Any]
    events: list[tuple[str, str, str | None, str | None, float]]  # entity, to_status, reason, instance, at
    instances: dict[str, dict[str, Any]]
    checkpoints: list[tuple[float, int]]
    started: list[str]
    wall_s: float  # virtual seconds from the job's record to its end

    def notes(self, what: str) -> list[tuple[str, str, str | None, str | None, float]]:
        return [e for e in self.events if e[0] == "note" and e[1] == what]

    def timeline(self) -> str:
        t0 = self.events[0][4] if self.events else 0.0
        return "\n".join(f"{at - t0:8.1f} s {entity} {to}: {reason} [{inst}]"
                         for entity, to, reason, inst, at in self.events)


@contextmanager
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORCHESTRATOR_DB_URL", f"sqlite:///{tmp_path}/results.db")
    yield


def spec_of(raw: str | dict[str, Any]) -> JobSpec:
    return validate_spec(yaml.safe_load(raw) if isinstance(raw, str) else raw)


def fast_forward(spec: JobSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, interval_s: float = 2.0,
                 max_s: float = 6 * 3600, restart_daemon_at: float | None = None,
                 recorded: Callable[[Session, str], None] | None = None) -> Run:
    """Launch ``spec`` (local provider) and drive it with the daemon's pass loop on a virtual clock until it ends.
    ``restart_daemon_at``: virtual seconds after the launch at which the daemon is killed between two passes (its
    in-process state lost: its provider, its caches) and started again at once, as the same daemon. ``recorded``:
    called with the session and the job's id once the job is recorded, before the daemon's first pass (what a
    launch stores beside the job: control.launcher.record_plan)."""
    clock = VirtualClock()
    spec = _torchrun_unless_given(spec)
    with _home(tmp_path, monkeypatch):
        transport, hosts = StubTransport(clock), ThreadHosts(clock)
        _install(spec, clock, transport, hosts)
        with open_session(clock=clock) as session:
            job_id = create_job(session, spec).id
            if recorded is not None:
                recorded(session, job_id)
        t0 = clock.time()

        def ended() -> bool:
            with open_session(clock=clock) as session:
                job = session.get(Job, job_id)
                assert job is not None
                return job.status in FINAL_JOB or clock.time() - t0 > max_s

        try:
            if restart_daemon_at is not None:
                daemon.run_on(clock, OWNER, interval_s=interval_s, gc_every_s=60.0,
                              until=lambda: ended() or clock.time() - t0 >= restart_daemon_at)
                _install(spec, clock, transport, hosts)  # the new daemon's provider; hosts and tasks live on
            daemon.run_on(clock, OWNER, interval_s=interval_s, gc_every_s=60.0, until=ended)
            return _read(job_id, clock, transport, t0)
        finally:
            clock.close()


def _torchrun_unless_given(spec: JobSpec) -> JobSpec:
    """The PyTorch stub speaks torchrun's protocol (tests/fastforward_torch.py): a built-in PyTorch job that does not
    name its fault tolerance (torchft replica groups by default, model.torch_spec.fault_tolerance) runs under torchrun
    here. The daemon's decisions under test are the same; replica groups' protocol is the real payload's tests'
    (tests/test_torch_ft_e2e.py, tests/jobs/test_ft_worker.py)."""
    if not is_pytorch(spec) or getattr(spec.training, "fault_tolerance", "torchrun") is not None:
        return spec
    return spec.model_copy(update={"training": spec.training.model_copy(update={"fault_tolerance": "torchrun"})})


OWNER = "daemon-fastforward"  # a daemon's id is stable across its restarts (control.daemon.daemon_id)


def _install(spec: JobSpec, clock: VirtualClock, transport: StubTransport, hosts: ThreadHosts) -> None:
    local = spec.provider.as_local()
    assert local is not None, "fast-forward drives local jobs"
    built = local_backend.build("fastforward", local, "", clock)
    assert isinstance(built.provider, LocalProvider)
    built.provider.hosts = hosts
    registry.use_backend(spec, clock, dataclasses.replace(built, transport=transport))


def _read(job_id: str, clock: VirtualClock, transport: StubTransport, t0: float) -> Run:
    with open_session(clock=clock) as session:
        job = session.get(Job, job_id)
        assert job is not None
        rows = session.execute(select(Event.entity, Event.to_status, Event.reason, Instance.name, Event.at)
                               .outerjoin(Instance, Instance.id == Event.instance_id)
                               .where(Event.job_id == job_id).order_by(Event.at, Event.id)).all()
        insts: dict[str, dict[str, Any]] = {
            i.name: {"status": i.status, "end_reason": i.end_reason, "spot": i.spot, "zone": i.zone, "gpu": i.gpu,
                     "slot": i.slot, "generation": i.generation}
            for i in session.scalars(select(Instance).where(Instance.job_id == job_id))}
        cps = [(m.at, m.step) for m in session.scalars(select(Metric).where(
            Metric.job_id == job_id, Metric.kind == "checkpoint").order_by(Metric.at))]
        summary = {"id": job.id, "status": job.status, "outcome": job.outcome, "accuracy": job.accuracy,
                   "final_step": job.final_step, "restarts": job.restarts, "ended_at": job.ended_at,
                   "started_at": job.started_at, "deadline_s": job.deadline_s}
    events: list[tuple[str, str, str | None, str | None, float]] = [
        (str(r[0]), str(r[1]), r[2], r[3], float(r[4])) for r in rows]
    return Run(summary, events, insts, cps, list(transport.started), (job.ended_at or clock.time()) - t0)


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example_spec(name: str, tmp_path: Path, **changes: Any) -> JobSpec:
    """``examples/<name>.yaml`` with its storage under ``tmp_path`` and its traces' paths made absolute; ``changes``:
    top-level sections merged over the example's (``policy={"deadline": "900s"}``)."""
    raw = example_doc(EXAMPLES / f"{name}.yaml", tmp_path)
    for key, value in changes.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) else value
    return spec_of(raw)
