"""The built-in job's training loop on one rank (see worker.py)."""

from __future__ import annotations

import json
import math
import os
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from tfjob.data import load_split, normalize
from tfjob.hparams import get_hparams
from tfjob.reporting import MetricsWriter, NoticeWatcher, write_json_atomic
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torchjob import ckpt
from torchjob.model import local_statistics, param_groups, resnet, set_bn_group, weighted_loss
from torchjob.rebalance import Rebalancer, initial_weights, slowdown_factor
from torchjob.runtime import leave_with_agent, log, use_cuda
from torchjob.split import interpolate, offsets, proportional_split
from torchjob.task import TorchTask

WORLD_FILE = "torch_world.json"  # the last world rank 0 recorded, to tell a shrink from a grow
EVENTS_FILE = "torch_events.jsonl"  # world changes and checkpoints on notice: the controller makes them events
SPEEDS_FILE = "torch_speeds.json"  # the latest probe's examples/s per slot: a restarted world splits by them
RUNTIME = "pytorch-eager+torchjob"  # the calibration's runtime key of this payload (data/measurements)
T = TypeVar("T", int, float)
STALE_PROBE_STEPS = 50  # an emulated slowdown re-times this rank's own compute this often


class WorldChange(RuntimeError):
    """A node leaves (preemption notice): every rank exits so that torchrun re-forms the world."""


def to_tensors(images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(normalize(images)).permute(0, 3, 1, 2).contiguous()
    return x, torch.from_numpy(labels.astype(np.int64))


def global_indices(seed: int, step: int, n: int, global_batch: int) -> np.ndarray:
    """The step's global batch: the same examples whatever the world size (a rank takes its slice)."""
    return np.random.default_rng([seed, step]).permutation(n)[:global_batch]


class Trainer:
    def __init__(self, task: TorchTask) -> None:
        self.task = task
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda() else "cpu")
        if task.threads:
            torch.set_num_threads(task.threads)
        # On GPUs the model and its inputs are channels_last (NHWC); its cuDNN kernels and their speed-up
        # than NCHW are measured in data/measurements/h100-torchjob-payload.csv (bench/gpu/torchjob_gpu.py).
        # TORCHJOB_MEMORY_FORMAT=contiguous keeps NCHW. The CPU path stays NCHW.
        self.memory_format = torch.contiguous_format
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes per world: pick the fastest conv algorithms
            if os.environ.get("TORCHJOB_MEMORY_FORMAT", "") != "contiguous":
                self.memory_format = torch.channels_last
        torch.manual_seed(task.seed)
        set_bn_group(dist.new_group(backend=dist.get_backend()) if self.world > 1 else None)
        # Who is where: each rank's slot (stable), the planner's batch for it, and (rank 0) the speeds this job
        # measured per slot before a restart: the split starts from them.
        # On a multi-GPU node each local rank weighs its share of the node's planned batch.
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        me = (task.slot_index, task.rank_batch(local_rank), task.instance,
              self._measured_speeds() if self.rank == 0 else {})
        peers: list[Any] = [None] * self.world
        dist.all_gather_object(peers, me)
        self.slots = [int(p[0]) for p in peers]
        self.instances = [str(p[2]) for p in peers]
        self.instance = task.instance
        speeds: dict[str, float] = peers[0][3]
        # A slot's measured examples/s is its ranks' sum: each rank is credited its share.
        ranks_of = {s: self.slots.count(s) for s in self.slots}
        weights = initial_weights([int(p[1]) for p in peers],
                                  [speeds[str(s)] / ranks_of[s] if str(s) in speeds else None for s in self.slots])
        self._set_split(proportional_split(task.global_batch, weights))
        self.rebalancer = Rebalancer(task.resplit_every)
        self.resplit_cost_s = 0.0  # the extra seconds of the first step at the latest re-split's split
        self.resplit_timing: list[float] | None = None  # the first two steps' seconds after a re-split
        self.cpu_s = 0.0  # this rank's own compute seconds per step at its batch, from the latest probe
        self.cpu_s_step = -1  # the step of that probe
        self.compute_s: list[float] = []  # every rank's, from the latest probe
        model = resnet(task.hparam_set).to(self.device, memory_format=self.memory_format)
        # Batch-norm buffers are equal on every rank already (global statistics): no per-forward broadcast.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self.model = DDP(model, broadcast_buffers=False)
        hp = get_hparams(task.hparam_set)
        self.base_lr = hp.scaled_lr(task.global_batch)
        self.opt = torch.optim.SGD(param_groups(model, hp.weight_decay), lr=self.base_lr, momentum=hp.momentum,
                                   nesterov=hp.nesterov)
        self.metrics = MetricsWriter(task.storage / "metrics.jsonl") if self.rank == 0 else None
        self.notices = NoticeWatcher(task.storage / "notices")
        # A notice for a node of this world that came during the restart still counts: it must leave.
        self.notices.seen -= set(self.instances)
        self.stop_requested = False
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.stop_requested = True  # acted on at the next step, by every rank together (see _control)

    def run(self) -> None:
        task, t_start = self.task, time.monotonic()
        step = ckpt.restore(task.checkpoint_dir, self.model, self.opt)
        self._record_world(step, resumed=step > 0)
        self.rebalancer.start(step)
        # The whole training split on the device once (CIFAR-10: 0.6 GB): a step then gathers its slice there,
        # with no host-side gather and pageable copy while the GPU waits.
        x_all, y_all = (t.to(self.device) for t in to_tensors(*load_split(task.data_dir, "train")))
        window_t, window_steps, loss_sum = time.monotonic(), 0, self._zero_loss()
        self.model.train()
        while step < task.train_steps:
            self._control(step)
            idx = global_indices(task.seed, step, len(y_all), task.global_batch)[self.offset: self.offset + self.batch]
            idx_t = torch.from_numpy(idx).to(self.device)
            x, y = x_all[idx_t].contiguous(memory_format=self.memory_format), y_all[idx_t]
            if task.data_dir and step % 2:
                x = x.flip(3)  # the cheapest augmentation that keeps the step deterministic
            if self.rebalancer.due(step):
                self._probe_and_resplit(step, x, y)
                continue  # the step's slice changes with the split
            self._set_lr(step)
            t_step = self._time_resplit_step()
            loss = weighted_loss(self.model(x), y, task.global_batch, self.world)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self._emulate_device(step, x, y)
            self._timed_resplit_step(t_step)
            step += 1
            window_steps += 1
            loss_sum += loss.detach().double() / self.world  # stays on the device: no sync per step
            if step % task.checkpoint_every == 0:
                self._checkpoint(step, "periodic")
            if step % task.log_every == 0 or step == task.train_steps:
                self._log_step(step, loss_sum, window_steps, window_t)
                window_t, window_steps, loss_sum = time.monotonic(), 0, self._zero_loss()
        self._checkpoint(step, "final")
        if self.rank == 0:
            self._evaluate(step, time.monotonic() - t_start)
        dist.barrier()

    def _set_split(self, batches: list[int]) -> None:
        self.batches = batches
        self.batch = batches[self.rank]
        self.offset = offsets(batches)[self.rank]
        self.sleep_s = interpolate(self.task.sleep_table, self.batch)

    def _emulate_device(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Local provider: the emulated GPU's extra time for this rank's batch; a slowdown (provider.slowdowns)
        makes the whole device F times slower from its step on (the CPU work included, as of the last probe)."""
        factor = slowdown_factor(self.task.slowdowns, step)
        if factor != 1.0 and (self.cpu_s_step < 0 or step - self.cpu_s_step >= STALE_PROBE_STEPS):
            self._probe(x, y, step)  # its CPU share needs this rank's own compute, re-split or not (no collective)
        extra = self.sleep_s * factor + (factor - 1.0) * self.cpu_s
        if extra > 0:
            time.sleep(extra)

    def _time_resplit_step(self) -> float | None:
        """The start of one of the two steps timed after a re-split (device synced), else None."""
        if self.resplit_timing is None:
            return None
        self._sync_device()
        return time.perf_counter()

    def _timed_resplit_step(self, t0: float | None) -> None:
        """A re-split's cost: its first step (new shapes: cuDNN autotuning, new allocations) less the second."""
        if t0 is None or self.resplit_timing is None:
            return
        self._sync_device()
        self.resplit_timing.append(time.perf_counter() - t0)
        if len(self.resplit_timing) == 2:
            self.resplit_cost_s = max(0.0, self.resplit_timing[0] - self.resplit_timing[1])
            self.resplit_timing = None

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _probe(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float:
        """This rank's compute seconds per step at its batch: forward + backward of its slice with no collective
        (DDP's no_sync, batch norm's local statistics), device synced; batch-norm buffers and gradients are put
        back as they were. On the local provider the emulated GPU's time is added."""
        module = self.model.module
        saved = [b.detach().clone() for b in module.buffers()]
        self._sync_device()
        t0 = time.perf_counter()
        # The wrapped module, not DDP's forward: DDP's first forward after the first backward rebuilds its
        # gradient buckets with a collective, which a rank probing alone (a slowdown from step 0) would hang in.
        with self.model.no_sync(), local_statistics():
            weighted_loss(module(x), y, self.task.global_batch, self.world).backward()
        self._sync_device()
        self.cpu_s = time.perf_counter() - t0
        self.cpu_s_step = step
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for b, v in zip(module.buffers(), saved, strict=True):
                b.copy_(v)
        return self.cpu_s

    def _probe_and_resplit(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Every rank probes its compute, the ranks share the times, and all compute the same new split."""
        factor = slowdown_factor(self.task.slowdowns, step)
        mine = factor * (self._probe(x, y, step) + self.sleep_s)
        # Each rank's compute, then each rank's measure of the last re-split's cost: every rank decides on the
        # same numbers (the largest cost), so every rank computes the same split.
        times = torch.zeros(2 * self.world, dtype=torch.float64, device=self.device)
        times[self.rank] = mine
        times[self.world + self.rank] = self.resplit_cost_s
        dist.all_reduce(times)
        shared = [float(t) for t in times.tolist()]
        self.compute_s = shared[:self.world]
        self.rebalancer.cost_s = max(shared[self.world:])
        # TORCHJOB_RESPLIT_COST=off: re-split whatever it costs (bench/gpu/resplit_mps.py compares the two).
        left = None if os.environ.get("TORCHJOB_RESPLIT_COST") == "off" else self.task.train_steps - step
        new = self.rebalancer.record(step, self.compute_s, self.batches, steps_left=left)
        if self.rebalancer.declined is not None:
            d = self.rebalancer.declined
            log(f"re-split at step {step} declined: it would save {d['gain_s_per_step']:.4f} s a step over "
                f"{d['steps_left']:.0f} steps, the last one cost {d['cost_s']:.2f} s")
            if self.metrics is not None:
                self.metrics.write("resplit_declined", step=step, **{k: round(v, 5) for k, v in d.items()})
        speeds = self._by_slot([b / t if t > 0 else 0.0 for b, t in zip(self.batches, self.compute_s, strict=True)],
                               sum)
        speeds = {k: v for k, v in speeds.items() if v > 0}
        if self.metrics is not None:
            write_json_atomic(self.task.storage / SPEEDS_FILE, {"step": step, "examples_per_s": speeds})
        if new is None:
            return
        old = self.batches
        self._set_split(new)
        self.resplit_timing = []  # the next two steps are timed: the first at the new split pays its cost
        if self.metrics is not None:
            by_slot, before = self._by_slot(new, sum), self._by_slot(old, sum)
            compute = {k: round(t, 5) for k, t in self._by_slot(self.rebalancer.verdict, max).items()}
            self.metrics.write("resplit", step=step, batches=by_slot, previous=before, compute_s=compute)
            self._event("resplit", step=step, batches=by_slot, previous=before, compute_s=compute)
            log(f"re-split at step {step}: batches by slot {before} -> {by_slot} (compute s {compute})")

    def _by_slot(self, per_rank: list[T], combine: Callable[[list[T]], T]) -> dict[str, T]:
        """A per-rank figure per worker slot (a multi-GPU node's ranks share one slot): ``combine`` of its ranks'."""
        grouped: dict[str, list[T]] = {}
        for slot, value in zip(self.slots, per_rank, strict=True):
            grouped.setdefault(str(slot), []).append(value)
        return {slot: combine(values) for slot, values in grouped.items()}

    def _measured_speeds(self) -> dict[str, float]:
        """Examples/s of compute per slot this job measured before (a restart keeps what it learnt)."""
        try:
            raw = json.loads((self.task.storage / SPEEDS_FILE).read_text())["examples_per_s"]
            return {str(k): float(v) for k, v in raw.items() if float(v) > 0}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def _zero_loss(self) -> torch.Tensor:
        # On the collective's device: NCCL all-reduces CUDA tensors only.
        return torch.zeros(1, dtype=torch.float64, device=self.device)

    def _set_lr(self, step: int) -> None:
        lr = self.base_lr * 0.5 * (1 + math.cos(math.pi * step / self.task.train_steps))
        for group in self.opt.param_groups:
            group["lr"] = lr

    def _control(self, step: int) -> None:
        """Once a step, one all-reduce makes the ranks agree on what rank 0 or torchrun asked for.

        - A preemption notice (rank 0 polls them): every rank saves a checkpoint (DCP save is collective).
          Then the world re-forms at once instead of at the kill: the noticed node's rank takes its torchrun
          agent down with it, the others leave the worker group, and torchrun restarts it on the survivors,
          which resume from this checkpoint (no step lost between the notice and the kill).
        - SIGTERM from torchrun (a node is waiting to join: the world grows): save, then exit, so the grown
          world resumes from this very step.
        """
        flags = torch.zeros(2 + self.world, device=self.device)
        flags[1] = 1.0 if self.stop_requested else 0.0
        if self.rank == 0:
            noticed = set(self.notices.poll())
            if noticed:
                flags[0] = 1.0
                for r, name in enumerate(self.instances):
                    flags[2 + r] = 1.0 if name in noticed else 0.0
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        agreed = flags.tolist()  # one device sync per step, not one per flag
        if agreed[0] > 0:
            self._checkpoint(step, "notice")
            # a multi-GPU node's ranks share its instance name: once each
            leaving = list(dict.fromkeys(self.instances[r] for r in range(self.world) if agreed[2 + r] > 0))
            if leaving:
                dist.barrier()
                if self.instance in leaving:
                    log(f"{self.instance} was noticed: leaving the world after the checkpoint at step {step}")
                    leave_with_agent()
                raise WorldChange(f"{', '.join(leaving)} leave after a preemption notice; re-forming the world")
        if agreed[1] > 0:
            self._checkpoint(step, "rescale")
            raise WorldChange(f"torchrun stops the worker group at step {step} (a node joins)")

    def _checkpoint(self, step: int, reason: str) -> None:
        seconds = self._save(step)
        if seconds is not None and self.metrics is not None:
            self.metrics.write("checkpoint", step=step, reason=reason, seconds=round(seconds, 4),
                               world_size=self.world)
            if reason == "notice":
                self._event("ckpt_on_notice", step=step, seconds=round(seconds, 4), world_size=self.world)
            log(f"checkpoint at step {step} ({reason}) in {seconds:.3f}s")

    def _save(self, step: int) -> float | None:
        return ckpt.save(self.task.checkpoint_dir, self.model, self.opt, step)

    def _log_step(self, step: int, loss_sum: torch.Tensor, steps: int, window_t: float) -> None:
        dist.all_reduce(loss_sum)  # each rank's (loss share / world): the sum is the global-batch mean loss
        loss = float(loss_sum.item())  # waits for the device: the window below covers its steps' GPU work
        secs = max(time.monotonic() - window_t, 1e-9)
        if self.metrics is None:
            return
        extra: dict[str, Any] = {}
        if self.device.type == "cuda":
            extra["gpu_peak_gb"] = round(torch.cuda.max_memory_allocated(self.device) / 1e9, 3)
        compute = self._by_slot(self.compute_s, max) if len(self.compute_s) == self.world else {}
        gpus = self._by_slot([1] * self.world, sum)
        workers = {slot: {"steps": steps, "batch": b, "examples_per_s": round(b * steps / secs, 3),
                          "step_time_s": round(secs / steps, 5) if steps else None,
                          "compute_s": round(compute[slot], 5) if slot in compute else None, "gpus": gpus[slot]}
                   for slot, b in self._by_slot(self.batches, sum).items()}
        self.metrics.write("step", step=step, loss=round(loss / max(steps, 1), 5),
                           examples_per_s=round(self.task.global_batch * steps / secs, 3),
                           steps_per_s=round(steps / secs, 4), window_s=round(secs, 4), world_size=self.world,
                           workers=workers, runtime=RUNTIME, precision="fp32", **extra)

    def _record_world(self, step: int, resumed: bool) -> None:
        if self.metrics is None:
            return
        path = self.task.storage / WORLD_FILE
        try:
            previous = int(json.loads(path.read_text())["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            previous = 0
        batches = self._by_slot(self.batches, sum)
        self.metrics.write("start", step=step, resumed=resumed, mode="sync", framework="pytorch",
                           workers=self.world)
        self.metrics.write("world", step=step, world_size=self.world, previous=previous, batches=batches,
                           restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
        write_json_atomic(path, {"world_size": self.world, "step": step, "batches": batches})
        self._event("world", step=step, world_size=self.world, previous=previous, batches=batches)
        log(f"world {previous} -> {self.world} at step {step}; batches by slot {batches}")

    def _event(self, kind: str, **fields: Any) -> None:
        with open(self.task.storage / EVENTS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, "t": round(time.time(), 3), **fields}, separators=(",", ":")) + "\n")

    def _evaluate(self, step: int, train_seconds: float) -> None:
        x, y = to_tensors(*load_split(self.task.data_dir, "test"))
        module: nn.Module = self.model.module
        module.eval()
        correct, loss_sum = 0, 0.0
        with torch.no_grad():
            for i in range(0, len(y), 500):
                logits = module(x[i: i + 500].to(self.device))
                yb = y[i: i + 500].to(self.device)
                correct += int((logits.argmax(1) == yb).sum())
                loss_sum += float(torch.nn.functional.cross_entropy(logits, yb, reduction="sum"))
        n = len(y)
        acc = correct / max(n, 1)
        assert self.metrics is not None
        self.metrics.write("eval", step=step, accuracy=round(acc, 5), loss=round(loss_sum / max(n, 1), 5), examples=n)
        write_json_atomic(self.task.storage / "result.json", {
            "step": step, "accuracy": acc, "loss": loss_sum / max(n, 1), "eval_examples": n,
            "train_seconds": round(train_seconds, 3), "mode": "sync", "framework": "pytorch",
            "world_size": self.world})
        log(f"done: step {step}, accuracy {acc:.4f}")
