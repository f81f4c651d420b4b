"""The PyTorch payload's protocol (jobs/torchjob) for the fast-forward harness (tests/fastforward.py).

Each instance's task is a torchrun agent (``node.py``), here a thread on the virtual clock: it sets up, joins the job's
elastic c10d rendezvous and, once a world forms, is one rank of it; when that world ends it goes back to the
rendezvous (torchrun restarts the worker group), until the world finishes training (exit 0) or its instance goes (-9).
What the real payload does, and this stub too:

- The rendezvous (``--nnodes=MIN:MAX``, hosted by the ``is_rdzv_host`` node's agent: no world forms without it) forms
  a world at once with MAX nodes, or with MIN or more after ``last_call_timeout`` (3 s); ranks go in slot order.
- Each world's start (``train.py``'s ``_record_world``): a ``start`` and a ``world`` metrics line, ``torch_world.json``
  and a ``world`` line in ``torch_events.jsonl`` (world N -> M: the daemon's shrink / grow events), from the newest
  complete checkpoint (``checkpoints/step-<N>/.metadata``, 3 kept). The split of the fixed global batch: the planned
  batches as weights, or the examples/s the job measured per slot (``torch_speeds.json``), as ``initial_weights``.
- Each step (``_control``): a new notice under ``notices/`` (polled every 0.5 s) makes every rank checkpoint
  (``ckpt_on_notice`` event); a noticed member then leaves with its agent (its task exits -9) and the others re-form
  the world. A node waiting at the rendezvous (a replacement) makes torchrun stop the group: a ``rescale`` checkpoint,
  then a world of all of them. A member whose instance is gone is seen by the others' collectives ``PEER_LOST_S``
  later: they re-form without it, from the latest checkpoint.
- Step times: per rank, (compute of its slice + the emulated GPU's sleep for its batch, ``sleep_table``) times its
  slowdown factor (``slowdowns``); the world's step is its slowest rank's. A pipeline's (``pipeline``): the 1F1B
  schedule's (micro-batches + stages - 1) slots of its slowest stage's forward + backward sleep.
- Re-splits (``resplit_every``): every rank's compute is probed, and the payload's own ``Rebalancer``
  (jobs/torchjob/rebalance.py, imported, not copied) decides; a re-split writes a ``resplit`` metrics line and event.
- The end: a ``final`` checkpoint, an ``eval`` line and ``result.json``; every rank's task exits 0.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.model import task as task_schema
from orchestrator.model.instances import ProcState
from orchestrator.storage.base import METRICS, NOTICES, RESULT

JOBS = str(Path(__file__).resolve().parent.parent / "jobs")
if JOBS not in sys.path:
    sys.path.append(JOBS)  # the payload's pure-Python modules (torchjob.rebalance, torchjob.split), shadowing nothing
# (mypy: typed with MYPYPATH=jobs, as the payload runs; without it, the names are Any)
from torchjob.rebalance import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    Rebalancer,
    initial_weights,
    slowdown_factor,
)
from torchjob.split import interpolate  # type: ignore[import-not-found, unused-ignore]  # noqa: E402

if TYPE_CHECKING:
    from fastforward import StubTask, StubTransport

AGENT_S = 3.0  # node.py and the torchrun agent up, before it joins the rendezvous
WORKER_START_S = 6.0  # a worker group's (re)start: torch's import, the process group, the data, the restore
LAST_CALL_S = 3.0  # the rendezvous' last_call_timeout: MIN nodes there, it waits this long for more
RESTART_S = 1.0  # torchrun's monitor sees its workers gone and restarts the group (monitor interval 0.5 s)
PEER_LOST_S = 2.0  # a dead peer's sockets close: the survivors' collective fails
POLL_S = 0.5  # how often an agent looks at its world, its instance and the rendezvous
NOTICE_POLL_S = 0.5  # rank 0's notice poll (tfjob/reporting.py NoticeWatcher)
# A rank's own step on the CPU (the tiny ResNet, one thread, batch norm's collectives, DDP's all-reduce): fixed
# and per example of its slice. About what a 2-core host measures: 300 steps of two ranks at batch 8 in ~70 s with
# their emulated V100s' sleep (tests/test_local_deadline_elastic_e2e.py), ~0.15-0.2 s a step at batch 45.
CPU_S_FIXED = 0.08
CPU_S_PER_EXAMPLE = 0.002
COMM_S = 0.002  # the gradient all-reduce on loopback
CKPT_S = 0.1  # a DCP save of the small model
EVAL_S = 1.0
KEEP = 3  # checkpoints kept (jobs/torchjob/ckpt.py)
STALE_PROBE_STEPS = 50  # a slowed rank re-times its own compute this often (train.py)
RUNTIME = "pytorch-eager+torchjob"
WORLD_FILE, EVENTS_FILE, SPEEDS_FILE = "torch_world.json", "torch_events.jsonl", "torch_speeds.json"


def cpu_s(batch: float) -> float:
    return CPU_S_FIXED + CPU_S_PER_EXAMPLE * batch


@dataclass(eq=False)
class Node:
    """One instance's torchrun agent."""

    stub: StubTask
    world: World | None = None
    leave: bool = False  # noticed: its rank takes the agent down with it after the checkpoint
    restarts: int = 0  # of its worker group (TORCHELASTIC_RESTART_COUNT)

    @property
    def torch(self) -> task_schema.TorchSection:
        assert self.stub.config.torch is not None
        return self.stub.config.torch

    @property
    def slot(self) -> int:
        return self.stub.config.index

    @property
    def name(self) -> str:
        return self.stub.config.instance

    def gone(self) -> bool:
        """Stopped (the transport's stop), exited, or its instance gone (then it exits -9, killed)."""
        if self.stub.stopped or self.stub.state != ProcState.RUNNING:
            return True
        if self.stub.instance_gone():
            exit_task(self.stub, -9)
            return True
        return False


@dataclass(eq=False)
class World:
    members: list[Node]  # in rank order
    outcome: str | None = None  # None while it trains; "done", or "restart" (every agent re-joins the rendezvous)
    ends_at: float = 0.0  # when the other ranks see the outcome (a lost peer: PEER_LOST_S after)


@dataclass
class Rendezvous:
    """The job's c10d rendezvous: the nodes that wait to join, and the world that trains now."""

    waiting: list[Node] = field(default_factory=list)
    world: World | None = None
    last_call: float | None = None

    def join(self, node: Node) -> None:
        if node not in self.waiting:
            self.waiting.append(node)

    def waiting_alive(self) -> list[Node]:
        self.waiting = [n for n in self.waiting if not n.gone()]
        return self.waiting

    def try_form(self, now: float) -> None:
        """A world of MAX waiting nodes at once, or of MIN or more once the last call is over."""
        if self.world is not None and self.world.outcome is None:
            return  # a world trains: the others wait (torchrun's wait list)
        waiting = self.waiting_alive()
        host = next((n for n in waiting if n.torch.is_rdzv_host), None)
        if host is None:
            self.last_call = None
            return
        lo, hi = host.torch.min_nodes, host.torch.max_nodes
        if len(waiting) < lo:
            self.last_call = None
            return
        if len(waiting) < hi:
            if self.last_call is None:
                self.last_call = now + LAST_CALL_S
            if now < self.last_call:
                return
        members = sorted([host, *[n for n in waiting if n is not host][:hi - 1]], key=lambda n: n.slot)
        self.waiting = [n for n in waiting if n not in members]
        self.last_call = None
        self.world = World(members)
        for n in members:
            n.world = self.world


def _factor(node: Node, step: int) -> float:
    """The node's emulated slowdown at ``step`` (provider.slowdowns; 1 before the first)."""
    return float(slowdown_factor([(int(a), float(f)) for a, f in node.torch.slowdowns], step))


def exit_task(stub: StubTask, code: int) -> None:
    if stub.state == ProcState.RUNNING:
        stub.state, stub.code = ProcState.EXITED, code


def run_node(transport: StubTransport, stub: StubTask) -> None:
    """One instance's task (``node.py`` under torchrun): rendezvous, train as a rank, again after each world."""
    clock = transport.vclock
    node = Node(stub)
    assert node.torch.run is None and node.torch.fault_tolerance == "torchrun", (
        "the stub speaks the built-in job under torchrun, not a run: script or torchft")
    rdzv: Rendezvous = transport.worlds.setdefault(stub.config.job_id, Rendezvous())
    clock.sleep(AGENT_S)
    while not node.gone():
        node.world, node.leave = None, False
        rdzv.join(node)
        world = _await_world(transport, rdzv, node)
        if world is None:
            return
        if world.members[0] is node:
            _Rank0(transport, world, node).run()
        else:
            _follow(transport, world, node)
        if node.gone():
            return
        if world.outcome == "done":
            return exit_task(stub, 0)
        if node.leave:
            return exit_task(stub, -9)  # leave_with_agent: SIGKILL to its own torchrun agent
        clock.sleep(RESTART_S)
        node.restarts += 1


def _await_world(transport: StubTransport, rdzv: Rendezvous, node: Node) -> World | None:
    while node.world is None:
        if node.gone():
            return None
        rdzv.try_form(transport.vclock.time())
        if node.world is None:
            transport.vclock.sleep(POLL_S)
    return node.world


def _follow(transport: StubTransport, world: World, node: Node) -> None:
    """A rank other than 0: it steps with the world until the world ends (or its own instance goes)."""
    clock = transport.vclock
    while world.outcome is None or clock.time() < world.ends_at:
        if node.gone():
            return
        clock.sleep(POLL_S)


@dataclass
class _Rank0:
    """Rank 0 runs the world's training loop and writes its files (the other ranks follow it)."""

    transport: StubTransport
    world: World
    node: Node
    step: int = 0
    batches: list[int] = field(default_factory=list)  # per rank
    compute_s: list[float] = field(default_factory=list)  # every rank's, from the latest probe
    probed_at: list[int] = field(default_factory=list)  # each rank's latest probe of its own compute (-1: none)
    seen: set[str] = field(default_factory=set)
    next_poll: float = 0.0
    rebalancer: Rebalancer = field(default_factory=lambda: Rebalancer(0))

    @property
    def cfg(self) -> task_schema.TaskConfig:
        return self.node.stub.config

    @property
    def storage(self) -> Path:
        return Path(self.cfg.storage)

    @property
    def global_batch(self) -> int:
        return sum(self.cfg.training.batch_per_worker)

    @property
    def pipeline(self) -> task_schema.PipelineSection | None:
        return self.node.torch.pipeline

    def now(self) -> float:
        return self.transport.vclock.time()

    def sleep(self, seconds: float) -> None:
        self.transport.vclock.sleep(seconds)

    def end(self, outcome: str, after_s: float = 0.0) -> None:
        self.world.outcome, self.world.ends_at = outcome, self.now() + after_s

    def run(self) -> None:
        self.storage.mkdir(parents=True, exist_ok=True)
        self.sleep(WORKER_START_S)
        if self._lost() or self._wrong_stages():
            return
        self.step = self._resume()
        self._start_world()
        t = self.cfg.training
        window_t, window_steps = self.now(), 0
        while self.step < t.train_steps:
            if self._control():
                return
            if self.rebalancer.due(self.step):
                self._probe_and_resplit()
                continue
            self.sleep(self._step_s())
            self.step += 1
            window_steps += 1
            if self.step % t.checkpoint_every == 0:
                self._checkpoint("periodic")
            if self.step % t.log_every == 0 or self.step == t.train_steps:
                self._log_step(window_steps, self.now() - window_t)
                window_t, window_steps = self.now(), 0
        self._checkpoint("final")
        self._finish()

    # ---------------------------------------------------------------- the world's start and end

    def _wrong_stages(self) -> bool:
        """A pipeline's world must be its stages (pipe.py raises, the group exits 1 and torchrun restarts it)."""
        p = self.pipeline
        if p is None or sorted(n.slot for n in self.world.members) == sorted(p.stage_slots):
            return False
        self.end("restart")
        return True

    def _start_world(self) -> None:
        members = self.world.members
        self.seen = self._notices() - {n.name for n in members}  # a member's notice from the restart still counts
        if self.pipeline is not None:
            self.batches = [self.global_batch] * len(members)
        else:
            speeds = self._measured_speeds()
            planned = [n.stub.config.training.batch_per_worker[n.slot] for n in members]
            weights = initial_weights(planned, [speeds.get(str(n.slot)) for n in members])
            self.batches = task_schema.proportional_split(self.global_batch, weights)
            self.rebalancer = Rebalancer(self.node.torch.resplit_every)
            self.rebalancer.start(self.step)
        self.probed_at = [-1] * len(members)
        try:
            previous = int(json.loads((self.storage / WORLD_FILE).read_text())["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            previous = 0
        world, batches = len(members), self._by_slot(self.batches)
        self._metric("start", step=self.step, resumed=self.step > 0, mode="sync", framework="pytorch", workers=world)
        self._metric("world", step=self.step, world_size=world, previous=previous, batches=batches,
                     restart=self.node.restarts)
        (self.storage / WORLD_FILE).write_text(json.dumps({"world_size": world, "step": self.step,
                                                            "batches": batches}))
        self._event("world", step=self.step, world_size=world, previous=previous, batches=batches)

    def _finish(self) -> None:
        self.sleep(EVAL_S)
        self._metric("eval", step=self.step, accuracy=0.9, loss=0.3, examples=359)
        (self.storage / RESULT).write_text(json.dumps({
            "step": self.step, "accuracy": 0.9, "loss": 0.3, "eval_examples": 359, "train_seconds": 1.0,
            "mode": "sync", "framework": "pytorch", "world_size": len(self.world.members)}))
        self.end("done")

    # ---------------------------------------------------------------- each step's control

    def _lost(self) -> bool:
        """Rank 0's own instance gone, or a peer's: the world fails (the others see it within PEER_LOST_S)."""
        if self.node.gone():
            self.end("restart", PEER_LOST_S)
            return True
        if any(n.gone() for n in self.world.members):
            self.sleep(PEER_LOST_S)
            self.end("restart")
            return True
        return False

    def _control(self) -> bool:
        """train.py's ``_control``: True when this world ends here (the agents re-form it)."""
        if self._lost():
            return True
        noticed = self._poll_notices()
        if noticed:
            self._checkpoint("notice")
            leaving = [n for n in self.world.members if n.name in noticed]
            if leaving:
                for n in leaving:
                    n.leave = True
                self.end("restart")
                return True
        rdzv: Rendezvous = self.transport.worlds[self.cfg.job_id]
        joining = [n for n in rdzv.waiting_alive() if n.world is None]
        if joining and len(self.world.members) < self.node.torch.max_nodes:
            self._checkpoint("rescale")  # torchrun's SIGTERM: a node waits to join, the world grows
            self.end("restart")
            return True
        return False

    def _poll_notices(self) -> set[str]:
        if self.now() < self.next_poll:
            return set()
        self.next_poll = self.now() + NOTICE_POLL_S
        new = self._notices() - self.seen
        self.seen |= new
        return new

    def _notices(self) -> set[str]:
        try:
            return {p.name for p in (self.storage / NOTICES).iterdir() if not p.name.startswith(".")}
        except OSError:
            return set()

    # ---------------------------------------------------------------- step times and re-splits

    def _rank_s(self, r: int, step: int) -> float:
        """Rank ``r``'s compute at its batch, its emulated GPU's sleep for it, both slowed by its factor."""
        n, b = self.world.members[r], self.batches[r]
        return _factor(n, step) * (cpu_s(b) + float(interpolate([list(p) for p in n.torch.sleep_table], b)))

    def _step_s(self) -> float:
        p = self.pipeline
        if p is not None:
            stages = len(p.stage_slots)
            micro = cpu_s(self.global_batch / p.micro_batches) / stages
            slowest = max((f + b for f, b in p.stage_sleep), default=0.0) + micro
            return (p.micro_batches + stages - 1) * slowest + COMM_S
        times = []
        for r, n in enumerate(self.world.members):
            t = self._rank_s(r, self.step)
            stale = self.probed_at[r] < 0 or self.step - self.probed_at[r] >= STALE_PROBE_STEPS
            if _factor(n, self.step) != 1.0 and stale:
                t += cpu_s(self.batches[r])  # a slowed rank times its own compute again (no collective)
                self.probed_at[r] = self.step
            times.append(t)
        return max(times) + COMM_S

    def _probe_and_resplit(self) -> None:
        """Every rank times its compute; the payload's Rebalancer decides on the shared times (cost: none here)."""
        ranks = range(len(self.world.members))
        self.compute_s = [self._rank_s(r, self.step) for r in ranks]
        self.probed_at = [self.step for _ in ranks]
        self.sleep(max(cpu_s(b) for b in self.batches) + COMM_S)
        old = self.batches
        new = self.rebalancer.record(self.step, self.compute_s, old, steps_left=self.cfg.training.train_steps
                                     - self.step)
        speeds = {k: v for k, v in self._by_slot([b / t for b, t in zip(old, self.compute_s, strict=True)]).items()
                  if v > 0}
        (self.storage / SPEEDS_FILE).write_text(json.dumps({"step": self.step, "examples_per_s": speeds}))
        if new is None:
            return
        self.batches = new
        by_slot, before = self._by_slot(new), self._by_slot(old)
        compute = {k: round(t, 5) for k, t in self._by_slot(self.rebalancer.verdict).items()}
        self._metric("resplit", step=self.step, batches=by_slot, previous=before, compute_s=compute)
        self._event("resplit", step=self.step, batches=by_slot, previous=before, compute_s=compute)

    # ---------------------------------------------------------------- files

    def _by_slot(self, per_rank: list[Any]) -> dict[str, Any]:
        return {str(n.slot): v for n, v in zip(self.world.members, per_rank, strict=True)}

    def _measured_speeds(self) -> dict[str, float]:
        try:
            raw = json.loads((self.storage / SPEEDS_FILE).read_text())["examples_per_s"]
            return {str(k): float(v) for k, v in raw.items() if float(v) > 0}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def _metric(self, kind: str, **fields: Any) -> None:
        with (self.storage / METRICS).open("a") as fh:
            fh.write(json.dumps({"kind": kind, "t": round(self.now(), 3), **fields}, separators=(",", ":")) + "\n")

    def _event(self, kind: str, **fields: Any) -> None:
        with (self.storage / EVENTS_FILE).open("a") as fh:
            fh.write(json.dumps({"kind": kind, "t": round(self.now(), 3), **fields}, separators=(",", ":")) + "\n")

    def _ckpt_root(self) -> Path:
        return self.storage / "checkpoints"

    def _complete(self) -> list[Path]:
        try:
            return sorted(p for p in self._ckpt_root().iterdir()
                          if p.name.startswith("step-") and (p / ".metadata").exists())
        except OSError:
            return []

    def _resume(self) -> int:
        found = self._complete()
        return int(found[-1].name.removeprefix("step-")) if found else 0

    def _checkpoint(self, reason: str) -> None:
        path = self._ckpt_root() / f"step-{self.step:08d}"
        if (path / ".metadata").exists():
            return  # that step is saved already: ckpt.save returns None, nothing is written
        self.sleep(CKPT_S)
        path.mkdir(parents=True, exist_ok=True)
        (path / ".metadata").write_text("")
        for old in self._complete()[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
        world = len(self.world.members)
        self._metric("checkpoint", step=self.step, reason=reason, seconds=CKPT_S, world_size=world)
        if reason == "notice":
            self._event("ckpt_on_notice", step=self.step, seconds=CKPT_S, world_size=world)

    def _log_step(self, steps: int, secs: float) -> None:
        secs = max(secs, 1e-9)
        g, world = self.global_batch, len(self.world.members)
        compute = self._by_slot(self.compute_s) if len(self.compute_s) == world else {}
        workers = {slot: {"steps": steps, "batch": b, "examples_per_s": round(b * steps / secs, 3),
                          "step_time_s": round(secs / steps, 5) if steps else None,
                          "compute_s": round(compute[slot], 5) if slot in compute else None, "gpus": 1}
                   for slot, b in self._by_slot(self.batches).items()}
        extra: dict[str, Any] = {"runtime": RUNTIME, "precision": "fp32"}
        if self.pipeline is not None:
            extra = {"strategy": "pipeline", "stages": world, "micro_batches": self.pipeline.micro_batches}
        self._metric("step", step=self.step, loss=round(1.0 / (1 + self.step / 100), 5),
                     examples_per_s=round(g * steps / secs, 3), steps_per_s=round(steps / secs, 4),
                     window_s=round(secs, 4), world_size=world, workers=workers, **extra)
