"""The built-in job as a pipeline: each node holds a contiguous run of the ResNet's layers (a stage), chosen by the
controller's partitioner (orchestrator/costmodel/partition.py), and the global batch flows through the
stages in micro-batches under torch.distributed.pipelining's 1F1B schedule (gloo on CPU, NCCL on GPUs).

- Stage order: ``task.pipeline.stage_slots`` lists the worker slots in stage order; ranks come from torchrun in
  any order, so every rank learns the others' slots and the schedule maps each stage to its rank.
- Checkpoints: torch.distributed.checkpoint, as the data-parallel job, of each stage's layers under their place
  in the whole model (``layers.<i>.…``): a checkpoint written by one partition loads into any other.
- Preemption notice: as the data-parallel job (train.py's ``_control``), every rank saves, the noticed node
  leaves, and the world (min = max = the number of stages) waits for the replacement, then resumes; or, where the
  controller re-partitions over the survivors (``policy.stage_loss``), it restarts them on a pipeline of fewer
  stages, which resumes from that checkpoint.
- Emulated GPUs (local provider): a stage sleeps its share of its GPU's emulated step in each micro-batch's
  forward (a third) and backward (two thirds).
- Evaluation: the last stage's rank loads the final checkpoint into a whole model (no_dist) and evaluates it.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from tfjob.data import load_split
from tfjob.hparams import get_hparams
from tfjob.reporting import MetricsWriter, NoticeWatcher
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from torchjob import ckpt
from torchjob.model import param_groups, resnet
from torchjob.task import TorchTask
from torchjob.train import Trainer, global_indices, to_tensors


class _SleepInBackward(torch.autograd.Function):
    """Identity forward; sleeps ``seconds`` in backward (an emulated GPU's backward time)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.seconds > 0:
            time.sleep(ctx.seconds)
        return grad, None


class Stage(nn.Module):
    """Layers ``lo..hi-1`` of the whole model, named by their place in it."""

    def __init__(self, whole: nn.Sequential, lo: int, hi: int, fwd_s: float = 0.0, bwd_s: float = 0.0) -> None:
        super().__init__()
        children = list(whole.children())
        self.layers = nn.ModuleDict({str(i): children[i] for i in range(lo, hi)})
        self.fwd_s, self.bwd_s = fwd_s, bwd_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.bwd_s > 0:
            x = _SleepInBackward.apply(x, self.bwd_s)
        for layer in self.layers.values():
            x = layer(x)
        if self.training and self.fwd_s > 0:
            time.sleep(self.fwd_s)
        return x


class PipeTrainer(Trainer):
    """One stage's rank. Shares the data-parallel trainer's notice handling, checkpoints and events."""

    def __init__(self, task: TorchTask) -> None:  # noqa: D107 - Trainer's state, built for a pipeline stage
        assert task.pipeline is not None
        p = task.pipeline
        self.task = task
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cpu") if dist.get_backend() != "nccl" else torch.device("cuda", 0)
        if task.threads:
            torch.set_num_threads(task.threads)
        torch.manual_seed(task.seed)  # every rank builds the same whole model, then keeps its stage
        peers: list[Any] = [None] * self.world
        dist.all_gather_object(peers, (task.slot_index, task.instance))
        self.slots = [int(s) for s, _ in peers]
        self.instances = [str(i) for _, i in peers]
        self.instance = task.instance
        if sorted(self.slots) != sorted(p.stage_slots):
            raise RuntimeError(f"world of slots {self.slots} is not the pipeline's {list(p.stage_slots)}")
        self.stage_index = p.stage_slots.index(task.slot_index)
        self.stages = len(p.stage_slots)
        lo, hi = p.modules[self.stage_index]
        fwd, bwd = p.stage_sleep[self.stage_index] if p.stage_sleep else (0.0, 0.0)
        whole = resnet(task.hparam_set, norm=nn.BatchNorm2d)
        inputs, outputs = _boundary_examples(whole, task.global_batch // p.micro_batches, lo, hi)
        self.model = Stage(whole, lo, hi, fwd, bwd).to(self.device)
        # The stage's input and output shapes given: no shape-inference forward, whose made-up tensors would
        # reach batch norm's running statistics (an inf there never decays).
        stage = PipelineStage(self.model, self.stage_index, self.stages, self.device,
                              input_args=inputs.to(self.device), output_args=outputs.to(self.device))
        stage.stage_index_to_group_rank = {k: self.slots.index(s) for k, s in enumerate(p.stage_slots)}
        self.schedule = Schedule1F1B(stage, n_microbatches=p.micro_batches,
                                     loss_fn=lambda out, y: nn.functional.cross_entropy(out, y))
        hp = get_hparams(task.hparam_set)
        self.base_lr = hp.scaled_lr(task.global_batch)
        self.opt = torch.optim.SGD(param_groups(self.model, hp.weight_decay), lr=self.base_lr, momentum=hp.momentum,
                                   nesterov=hp.nesterov)
        self.last = self.stage_index == self.stages - 1
        self.metrics = MetricsWriter(task.storage / "metrics.jsonl") if self.last else None
        self.notices = NoticeWatcher(task.storage / "notices")
        self.notices.seen -= set(self.instances)
        self.stop_requested = False
        self.batches = [task.global_batch] * self.world  # every stage sees every example of the step

    def run(self) -> None:
        task, t_start = self.task, time.monotonic()
        step = self._restore()
        self._record_world(step, resumed=step > 0)
        x_all, y_all = to_tensors(*load_split(task.data_dir, "train"))
        window_t, window_steps, losses = time.monotonic(), 0, []
        self.model.train()
        while step < task.train_steps:
            self._control(step)
            idx = torch.from_numpy(global_indices(task.seed, step, len(y_all), task.global_batch))
            self._set_lr(step)
            self.opt.zero_grad(set_to_none=True)
            if self.stage_index == 0:
                self.schedule.step(x_all[idx].to(self.device))
            elif self.last:
                out: list[torch.Tensor] = []
                self.schedule.step(target=y_all[idx].to(self.device), losses=out)
                losses.append(float(torch.stack([t.detach() for t in out]).mean()))
            else:
                self.schedule.step()
            self.opt.step()
            step += 1
            window_steps += 1
            if step % task.checkpoint_every == 0:
                self._checkpoint(step, "periodic")
            if step % task.log_every == 0 or step == task.train_steps:
                self._log_window(step, losses, window_steps, window_t)
                window_t, window_steps, losses = time.monotonic(), 0, []
        self._checkpoint(step, "final")
        dist.barrier()
        if self.last:
            self._evaluate_whole(step, time.monotonic() - t_start)
        dist.barrier()

    def _state(self) -> dict[str, object]:
        """This stage's weights and SGD momentum, named by their place in the whole model: loadable by any
        partition (plain tensors, not torch's optimizer state dict, whose groups differ per stage)."""
        momentum = {}
        for name, p in self.model.named_parameters():
            buf = self.opt.state.get(p, {}).get("momentum_buffer")
            momentum[name] = buf if buf is not None else torch.zeros_like(p)
        return {"model": self.model.state_dict(), "momentum": momentum}

    def _save(self, step: int) -> float | None:
        return ckpt.save_state(self.task.checkpoint_dir, self._state(), step)

    def _restore(self) -> int:
        state = self._state()
        step = ckpt.load_state(self.task.checkpoint_dir, state)
        if step:
            self.model.load_state_dict(state["model"])  # type: ignore[arg-type]
            momentum: dict[str, torch.Tensor] = state["momentum"]  # type: ignore[assignment]
            for name, p in self.model.named_parameters():
                self.opt.state[p]["momentum_buffer"] = momentum[name].clone()
        return step

    def _log_window(self, step: int, losses: list[float], steps: int, window_t: float) -> None:
        if self.metrics is None:
            return
        secs = max(time.monotonic() - window_t, 1e-9)
        g = self.task.global_batch
        workers = {str(s): {"steps": steps, "batch": g, "examples_per_s": round(g * steps / secs, 3),
                            "step_time_s": round(secs / steps, 5) if steps else None} for s in self.slots}
        self.metrics.write("step", step=step, loss=round(sum(losses) / max(len(losses), 1), 5),
                           examples_per_s=round(g * steps / secs, 3), steps_per_s=round(steps / secs, 4),
                           window_s=round(secs, 4), world_size=self.world, workers=workers, strategy="pipeline",
                           stages=self.stages, micro_batches=self.task.pipeline.micro_batches
                           if self.task.pipeline else None)

    def _evaluate_whole(self, step: int, train_seconds: float) -> None:
        """The whole model from the final checkpoint (every stage's part), evaluated on this rank alone."""
        full = resnet(self.task.hparam_set, norm=nn.BatchNorm2d)
        whole = Stage(full, 0, len(list(full.children())))
        state = {"model": whole.state_dict()}
        found = ckpt.complete(self.task.checkpoint_dir)
        dcp.load(state, checkpoint_id=str(found[-1]), no_dist=True)
        whole.load_state_dict(state["model"])
        saved = self.model
        self.model = _Unwrapped(whole)
        try:
            self._evaluate(step, train_seconds)
        finally:
            self.model = saved


def _boundary_examples(whole: nn.Sequential, micro: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensors shaped like a micro-batch entering module ``lo`` and leaving module ``hi - 1`` (eval mode, no
    gradient: nothing is updated)."""
    x = torch.zeros(micro, 3, 32, 32)
    was_training = whole.training
    whole.eval()
    seen = [x]
    with torch.no_grad():
        for module in whole.children():
            x = module(x)
            seen.append(x)
    whole.train(was_training)
    # requires_grad as in training: activations carry gradients back across every cut (not the data itself)
    return (torch.empty_like(seen[lo]).requires_grad_(lo > 0), torch.empty_like(seen[hi]).requires_grad_(True))


class _Unwrapped(nn.Module):
    """Gives the whole model the ``.module`` the data-parallel trainer's evaluation reads."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


__all__ = ["PipeTrainer", "Stage"]
