"""The built-in job on torchft replica groups: ``python ft_worker.py --task task.json`` (node.py execs it).

Each node is one replica group of one process (jobs/torchjob/ft_step.py); no torchrun and no restarts. The loop
is ``ft_step.step_once``: a lost peer makes the step in flight retry at the next quorum, and a replacement heals
from a live peer's weights and optimizer state. A DCP checkpoint is read only when the first quorum has every group
at step 0 (a fresh job resuming); the participating rank 0 saves one every ``checkpoint_every`` steps, at the end
and at the step after a notice, and writes the metrics lines (start, step, ``quorum``, ``heal``, eval) and
result.json as the torchrun trainer does (jobs/README.md). A noticed node leaves at the next step boundary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # jobs/

from torchjob import EXIT_BAD_TASK  # noqa: E402
from torchjob.runtime import log  # noqa: E402
from torchjob.task import TaskError, TorchTask, load  # noqa: E402

RUNTIME = "pytorch-eager+torchft"
EVENTS = "torch_events.jsonl"  # as the torchrun trainer's (train.EVENTS_FILE): the controller makes them events
JOIN_WAIT_S = 30.0  # how long a joiner with no live peer waits for the job's result before starting alone
MEMBERS = "torchft_members.jsonl"  # each group's process id at each quorum change it saw: no restart, checkable


class FtTrainer:
    def __init__(self, task: TorchTask) -> None:
        import torch
        from tfjob.data import load_split
        from tfjob.hparams import get_hparams

        from torchjob import ft_step
        from torchjob.model import param_groups, resnet
        from torchjob.rebalance import Rebalancer
        from torchjob.train import to_tensors

        self.task = task
        torch.set_num_threads(task.threads or 1)
        torch.manual_seed(task.seed)  # every group starts alike: a heal then only brings a late one forward
        self.model = resnet(task.hparam_set).train()
        hp = get_hparams(task.hparam_set)
        self.base_lr = hp.scaled_lr(task.global_batch)
        self.opt = torch.optim.SGD(param_groups(self.model, hp.weight_decay), lr=self.base_lr,
                                   momentum=hp.momentum, nesterov=hp.nesterov)
        assert task.lighthouse
        self.replica = ft_step.make_replica(self.model, self.opt, lighthouse=task.lighthouse,
                                            replica_id=f"{task.job_id}-slot{task.slot_index}", slot=task.slot_index,
                                            weight=float(task.planned_batch), global_batch=task.global_batch,
                                            timeout_s=float(os.environ.get("TORCHJOB_TIMEOUT_S", 10)),
                                            host=task.replica_host)
        self.x_all, self.y_all = to_tensors(*load_split(task.data_dir, "train"))
        self.metrics: Any = None  # opened by whichever process is participating rank 0
        self.world = 0  # the last committed step's groups
        self.failed_at: float | None = None  # the first failed attempt since the last commit (a peer was lost)
        self.first_quorum = True
        self.rebalancer = Rebalancer(task.resplit_every)
        self.slots: list[int] = []  # the last committed step's groups (a change starts the re-split's count anew)
        self.started = False
        self.join = task.join
        self.join_since: float | None = None  # a joiner that found no live peer: since when (FtTrainer._joined_late)
        self.window: tuple[float, int, float] = (time.monotonic(), 0, 0.0)  # since the last step line

    def run(self) -> None:
        from torchjob import ft_step

        task, m, t_start = self.task, self.replica.manager, time.monotonic()
        while m.current_step() < task.train_steps:
            noticed = task.notice_file.exists()
            t0 = time.time()
            joining = 1.0 if self.join and self.first_quorum else 0.0
            info = ft_step.agree(self.replica, [1.0 if noticed else 0.0, 0.0, joining])
            if info is None:
                m.should_commit()  # closes the failed attempt (it says no)
                self.failed_at = self.failed_at or t0
                continue
            if self.first_quorum:
                if self.join and info.step == 0:  # no group of the quorum is past step 0: the peers are gone
                    late = self._joined_late(info.world - round(info.flags[2]))
                    if late == "done":
                        return  # they finished while this group started: the job is done, nothing to write
                    if late == "wait":
                        continue  # the attempt is closed: wait for the result (or a peer) a while longer
                self.first_quorum = False
                self._resume(info)
            self._set_lr(m.current_step())
            loss = ft_step.train_step(self.replica, info, self._loss_of(m.current_step()))
            if loss is None:
                self.failed_at = self.failed_at or t0
                continue
            self._committed(info, float(loss), t0)
            self._resplit(info)
            if info.flags[0] > 0:  # a group was noticed: its state is saved before it goes (all could go)
                self._checkpoint("notice")
                if noticed:
                    self._leave()
            elif m.current_step() % task.checkpoint_every == 0:
                self._checkpoint("periodic")
        self._checkpoint("final")
        if m.participating_rank() == 0 and self._metrics() is not None:
            self._evaluate(time.monotonic() - t_start)

    def _joined_late(self, others: int) -> Literal["done", "wait", "go"]:
        """A joiner whose first quorum has no group past step 0: the groups it was started to join are gone, having
        finished (their result.json reaches this node's storage: "done", and it leaves without training or writing a
        line, whoever else joined with it) or all been lost. With joiners only (``others``: the quorum's groups that
        are not), it closes the attempt without a step and waits ("wait") JOIN_WAIT_S for the result or a peer; then,
        or with a group that started the world afresh, it starts from the newest checkpoint ("go"), as a fresh job
        does. (Training from a checkpoint after the others finished would write again steps the job already has.)"""
        done = (self.task.storage / "result.json").exists()
        if self.join_since is None:
            self.join_since = time.monotonic()
            log(f"{self.task.instance} joined with no group past step 0: waiting for the job's result or a peer")
        if not done and (others > 0 or time.monotonic() - self.join_since > JOIN_WAIT_S):
            if others == 0:
                log(f"no live peer for {JOIN_WAIT_S:.0f} s and no result: starting from the newest checkpoint")
            self.join = False
            return "go"
        m = self.replica.manager
        m.report_error(RuntimeError("joined with no live peer"))
        m.should_commit()  # says no: no step is counted
        if done:
            log(f"{self.task.instance} joined after the other groups finished: the job is done")
            return "done"
        time.sleep(0.5)
        return "wait"

    def _resume(self, info: Any) -> None:
        """A fresh job resumes from its newest checkpoint when every group of the first quorum is at step 0 (all
        read the same one); a group joining a running job heals from a peer instead (its quorum's step > 0)."""
        from torchjob import ckpt

        step = 0
        if info.step == 0:
            step = ckpt.restore(self.task.checkpoint_dir, self.model, self.opt)
            if step:
                m = self.replica.manager
                m.load_state_dict({"step": step, "batches_committed": step * self.task.global_batch})
        if info.step == 0 and info.rank == 0 and self._metrics() is not None:  # a joiner healed: no new start
            self.metrics.write("start", step=step or info.step, resumed=step > 0, mode="sync", framework="pytorch",
                               workers=info.world, fault_tolerance="torchft")
            self.started = True

    def _loss_of(self, step: int) -> Any:
        import numpy as np
        import torch
        import torch.nn.functional as F

        from torchjob.rebalance import slowdown_factor
        from torchjob.split import interpolate
        from torchjob.train import global_indices

        task = self.task

        def loss_of(offset: int, batch: int) -> torch.Tensor:
            idx = global_indices(task.seed, step, len(self.y_all), task.global_batch)[offset:offset + batch]
            idx_t = torch.from_numpy(np.ascontiguousarray(idx))
            x, y = self.x_all[idx_t], self.y_all[idx_t]
            if task.data_dir and step % 2:
                x = x.flip(3)
            loss = F.cross_entropy(self.model(x), y, reduction="sum") / task.global_batch
            # local provider: the emulated GPU's time, slowed from a step on where the spec says
            extra = interpolate(task.sleep_table, batch) * slowdown_factor(task.slowdowns, step)
            if extra > 0:
                time.sleep(extra)
            return loss

        return loss_of

    def _set_lr(self, step: int) -> None:
        lr = self.base_lr * 0.5 * (1 + math.cos(math.pi * step / self.task.train_steps))
        for group in self.opt.param_groups:
            group["lr"] = lr

    def _committed(self, info: Any, loss: float, t0: float) -> None:
        """The writer's metrics for a committed step: a quorum change (with the survivors' pause), heals, step lines
        (every group keeps the window: the writer may change with the quorum)."""
        step, now = self.replica.manager.current_step(), time.time()
        before, self.world = self.world, info.world
        failed, self.failed_at = self.failed_at, None
        if before != info.world:
            with open(self.task.storage / MEMBERS, "a", encoding="utf-8") as f:  # noqa: PTH123
                f.write(json.dumps({"instance": self.task.instance, "slot": self.task.slot_index, "pid": os.getpid(),
                                    "step": step, "world": info.world, "t": round(now, 3)}) + "\n")
        t_w, steps, loss_sum = self.window
        self.window = (t_w, steps + 1, loss_sum + loss)
        if info.rank != _writer(info) or self._metrics() is None:
            if step % self.task.log_every == 0:
                self.window = (time.monotonic(), 0, 0.0)
            return
        if before and before != info.world:
            pause = now - (failed if failed is not None else t0)
            self.metrics.write("quorum", step=step, world_before=before, world_after=info.world,
                               survivors_pause_s=round(pause, 3))
            log(f"quorum {before} -> {info.world} at step {step}; survivors' pause {pause:.3f} s")
        senders = [s for s, sent in zip(info.slots, info.sent, strict=True) if sent]
        for slot, healed in zip(info.slots, info.healed_s, strict=True):
            if healed is not None and senders:
                self.metrics.write("heal", step=step, worker=slot, from_worker=senders[0], heal_s=round(healed, 3))
        if step % self.task.log_every == 0 or step == self.task.train_steps:
            self._log_step(step, info)

    def _resplit(self, info: Any) -> None:
        """Every participant feeds the same shared compute times to the same Rebalancer (jobs/torchjob/rebalance.py,
        the torchrun trainer's rule) and takes its share of the same new split as its weight from the next step on.
        A change of the groups starts it anew on every participant alike (a joiner's is new)."""
        from torchjob.rebalance import Rebalancer

        step = self.replica.manager.current_step()
        if info.slots != self.slots:
            self.slots, self.rebalancer = list(info.slots), Rebalancer(self.task.resplit_every)
            self.rebalancer.start(step)
            return
        if not self.rebalancer.due(step) or min(info.compute_s) <= 0:
            return
        new = self.rebalancer.record(step, info.compute_s, info.batches, steps_left=self.task.train_steps - step)
        if new is None:
            return
        self.replica.weight = float(new[info.rank])  # integers summing to G: the next split is exactly these
        if info.rank == _writer(info) and self._metrics() is not None:
            by_slot = {str(s): b for s, b in zip(info.slots, new, strict=True)}
            before = {str(s): b for s, b in zip(info.slots, info.batches, strict=True)}
            compute = {str(s): round(t, 5) for s, t in zip(info.slots, self.rebalancer.verdict, strict=True)}
            self.metrics.write("resplit", step=step, batches=by_slot, previous=before, compute_s=compute)
            with open(self.task.storage / EVENTS, "a", encoding="utf-8") as f:  # noqa: PTH123
                f.write(json.dumps({"kind": "resplit", "t": round(time.time(), 3), "step": step, "batches": by_slot,
                                    "previous": before, "compute_s": compute}, separators=(",", ":")) + "\n")
            log(f"re-split at step {step}: batches by slot {before} -> {by_slot} (compute s {compute})")

    def _log_step(self, step: int, info: Any) -> None:
        t_w, steps, loss_sum = self.window
        secs = max(time.monotonic() - t_w, 1e-9)
        workers = {str(s): {"steps": steps, "batch": b, "examples_per_s": round(b * steps / secs, 3),
                            "step_time_s": round(secs / steps, 5), "compute_s": round(c, 5) if c > 0 else None,
                            "gpus": 1}
                   for s, b, c in zip(info.slots, info.batches, info.compute_s, strict=True)}
        self.metrics.write("step", step=step, loss=round(loss_sum / steps, 5),
                           examples_per_s=round(self.task.global_batch * steps / secs, 3),
                           steps_per_s=round(steps / secs, 4), window_s=round(secs, 4), world_size=info.world,
                           workers=workers, runtime=RUNTIME, precision="fp32")
        self.window = (time.monotonic(), 0, 0.0)

    def _metrics(self) -> Any:
        if self.metrics is None:
            from tfjob.reporting import MetricsWriter

            self.metrics = MetricsWriter(self.task.storage / "metrics.jsonl")
        return self.metrics

    def _checkpoint(self, reason: str) -> None:
        """The participating rank 0 alone saves (the replicas are equal): DCP without a process group."""
        from torchjob import ckpt

        m = self.replica.manager
        if m.participating_rank() != 0:
            return
        step = m.current_step()
        seconds = ckpt.save(self.task.checkpoint_dir, self.model, self.opt, step)
        if seconds is not None:
            self._metrics().write("checkpoint", step=step, reason=reason, seconds=round(seconds, 4),
                                  world_size=self.world)
            log(f"checkpoint at step {step} ({reason}) in {seconds:.3f}s")

    def _leave(self) -> None:
        """A noticed node leaves between steps: its manager stops (no heartbeat: the next quorum goes on without
        it at once) and the process ends as a revoked node's does."""
        log(f"{self.task.instance} was noticed: leaving the quorum at step {self.replica.manager.current_step()}")
        self.replica.manager.shutdown(wait=False)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def _evaluate(self, train_seconds: float) -> None:
        import torch
        from tfjob.data import load_split
        from tfjob.reporting import write_json_atomic

        from torchjob.train import to_tensors

        x, y = to_tensors(*load_split(self.task.data_dir, "test"))
        self.model.eval()
        correct, loss_sum = 0, 0.0
        with torch.no_grad():
            for i in range(0, len(y), 500):
                logits = self.model(x[i:i + 500])
                correct += int((logits.argmax(1) == y[i:i + 500]).sum())
                loss_sum += float(torch.nn.functional.cross_entropy(logits, y[i:i + 500], reduction="sum"))
        n, step = len(y), self.replica.manager.current_step()
        acc = correct / max(n, 1)
        self.metrics.write("eval", step=step, accuracy=round(acc, 5), loss=round(loss_sum / max(n, 1), 5), examples=n)
        write_json_atomic(self.task.storage / "result.json", {
            "step": step, "accuracy": acc, "loss": loss_sum / max(n, 1), "eval_examples": n,
            "train_seconds": round(train_seconds, 3), "mode": "sync", "framework": "pytorch",
            "world_size": self.world, "fault_tolerance": "torchft"})
        log(f"done: step {step}, accuracy {acc:.4f}")


def _writer(info: Any) -> int:
    """Who writes a step's metrics: the first participant that did not just heal (it knows the previous quorum)."""
    return next((r for r, healed in enumerate(info.healed_s) if healed is None), 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ft_worker.py")
    parser.add_argument("--task", required=True)
    args = parser.parse_args(argv)
    try:
        task = load(args.task)
    except TaskError as e:
        log(str(e))
        return EXIT_BAD_TASK
    FtTrainer(task).run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the manager's threads and the gloo group: no teardown to hang in


if __name__ == "__main__":
    sys.exit(main())
