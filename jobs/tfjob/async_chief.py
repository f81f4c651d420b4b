"""Async mode chief: ParameterServerStrategy + ClusterCoordinator custom training loop.

Steps are scheduled as closures; the coordinator hands each one to whichever worker is free, re-queues
closures of a lost worker and reconnects (re-creating the per-worker datasets) when a replacement server
comes back at the same address. Steps are counted here, on the chief, as closures that returned
(Keras 3's ``optimizer.iterations`` loses increments under PSS; the chief re-syncs it at every log line).
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import replace
from typing import Any

import tensorflow as tf

from . import data, pipeline
from .common import (
    address_up,
    evaluate,
    log,
    make_optimizer,
    wait_for_addresses,
    weight_decay_loss,
    weighted_loss,
)
from .hparams import get_hparams
from .models import build_model
from .reporting import MetricsWriter, NoticeWatcher, WindowStats, write_json_atomic
from .task import Task, chief_address

CONNECT_TIMEOUT_S = float(os.environ.get("TFJOB_CONNECT_TIMEOUT_S", "600"))
PS_CHECK_EVERY_S = 2.0  # while no step completes, probe the PS ports this often


class PSLostError(RuntimeError):
    """A parameter server stopped accepting connections."""


def _ready(rv: Any) -> bool:
    ev = getattr(rv, "_status_available_event", None)  # private, TF 2.21: set once the closure finished
    return bool(ev is not None and ev.is_set())


class AsyncChief:
    def __init__(self, task: Task) -> None:
        self.task = task
        self.tr = task.training
        self.hp = get_hparams(self.tr.hparam_set)
        self.storage = task.storage
        self.metrics = MetricsWriter(self.storage / "metrics.jsonl")
        self.notices = NoticeWatcher(self.storage / "notices")
        self.ps_addresses = list(task.cluster["ps"])

    # -- setup ---------------------------------------------------------------------------------------
    def connect(self) -> None:
        addrs = self.ps_addresses + list(self.task.cluster["worker"])
        down = wait_for_addresses(addrs, CONNECT_TIMEOUT_S)
        if down:
            raise ConnectionError(f"cluster tasks unreachable after {CONNECT_TIMEOUT_S:.0f}s: {down}")
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.task.cluster), task_type="chief", task_id=0, rpc_layer="grpc"
        )
        self.strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)

    def build(self) -> None:
        bpw = self.tr.batch_per_worker
        with self.strategy.scope():
            self.model = build_model(self.tr.hparam_set, data.IMAGE_SHAPE, data.NUM_CLASSES)
            self.optimizer = make_optimizer(self.hp, sum(bpw) / len(bpw), self.tr.train_steps)
            self.optimizer.build(self.model.trainable_variables)
        self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")  # on the chief
        self.ckpt = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step_var)
        self.manager = tf.train.CheckpointManager(self.ckpt, str(self.storage / "checkpoints"), max_to_keep=3)
        self.eval_x, self.eval_y = data.load_split(self.tr.data_dir, "test")
        self.eval_x = data.normalize(self.eval_x)

        model, optimizer, strategy, wd = self.model, self.optimizer, self.strategy, self.hp.weight_decay

        @tf.function  # type: ignore[untyped-decorator]
        def train_step(iterator: Any) -> tuple[tf.Tensor, tf.Tensor]:
            def replica_fn(x: tf.Tensor, y: tf.Tensor, widx: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                with tf.GradientTape() as tape:
                    logits = model(x, training=True)
                    loss = weighted_loss(y, logits, tf.shape(y)[0]) + weight_decay_loss(model, wd)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
                return loss, widx

            x, y, widx = next(iterator)
            loss, w = strategy.run(replica_fn, args=(x, y, widx))
            return (
                strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),
                strategy.reduce(tf.distribute.ReduceOp.SUM, w, axis=None),
            )

        self.train_step = train_step

    def make_dataset(self, step: int) -> None:
        seed = self.tr.seed * 1_000_003 + step  # a resumed run does not replay the same data order
        self.per_worker_iter = iter(
            self.coordinator.create_per_worker_dataset(
                pipeline.worker_dataset_fn(self.tr.batch_per_worker, seed, augment=bool(self.tr.data_dir))
            )
        )

    def restore(self) -> int:
        latest = self.manager.latest_checkpoint
        if not latest:
            return 0
        self.ckpt.restore(latest)
        step = int(self.step_var.numpy())
        log(f"restored {latest} at step {step}")
        return step

    # -- actions -------------------------------------------------------------------------------------
    def save(self, step: int, reason: str) -> None:
        t0 = time.monotonic()
        self.step_var.assign(step)
        self.manager.save(checkpoint_number=step)
        self.metrics.write("checkpoint", step=step, reason=reason, seconds=round(time.monotonic() - t0, 4))

    def run_eval(self, step: int) -> dict[str, Any]:
        acc, loss, n = evaluate(self.model, self.eval_x, self.eval_y)
        return self.metrics.write("eval", step=step, accuracy=round(acc, 5), loss=round(loss, 5), examples=n)

    def _check_ps(self) -> None:
        down = [a for a in self.ps_addresses if not address_up(a)]
        if down:
            raise PSLostError(f"parameter server(s) down: {down}")

    # -- loop ----------------------------------------------------------------------------------------
    def train(self) -> int:
        t_start = time.monotonic()
        self.connect()
        self.build()
        step = self.restore()
        resumed = step > 0
        self.make_dataset(step)
        total = self.tr.train_steps
        self.optimizer.iterations.assign(step)
        self.metrics.write(
            "start",
            step=step,
            resumed=resumed,
            mode="async",
            workers=self.task.num_workers,
            setup_s=round(time.monotonic() - t_start, 3),
        )
        log(f"chief starting at step {step}/{total}")
        train_t0 = time.monotonic()
        max_inflight = 2 * self.task.num_workers + 2
        inflight: deque[Any] = deque()
        scheduled = done = step
        window = WindowStats()
        last_progress = time.monotonic()
        last_ps_check = 0.0
        while done < total:
            while scheduled < total and len(inflight) < max_inflight:
                inflight.append(self.coordinator.schedule(self.train_step, args=(self.per_worker_iter,)))
                scheduled += 1
            ready = [rv for rv in inflight if _ready(rv)]
            if not ready:
                ev = getattr(inflight[0], "_status_available_event", None)
                if ev is None:  # fallback: block on the oldest closure
                    ready = [inflight[0]]
                else:
                    ev.wait(0.01)
            for rv in ready:
                inflight.remove(rv)
                loss, widx = self._fetch(rv)
                done += 1
                last_progress = time.monotonic()
                window.add(widx, loss)
                if done % self.tr.log_every == 0 or done == total:
                    self.metrics.write("step", **window.record(done, self.tr.batch_per_worker))
                    self.optimizer.iterations.assign(done)
                    window = WindowStats()
                if done < total and self.tr.checkpoint_every > 0 and done % self.tr.checkpoint_every == 0:
                    self.save(done, "periodic")
                if done < total and self.tr.eval_every > 0 and done % self.tr.eval_every == 0:
                    self.run_eval(done)
            if self.notices.poll():
                self.save(done, "notice")
            now = time.monotonic()
            if now - last_progress > PS_CHECK_EVERY_S and now - last_ps_check > PS_CHECK_EVERY_S:
                last_ps_check = now
                self._check_ps()
        self.coordinator.join()
        train_seconds = time.monotonic() - train_t0
        self.save(done, "final")
        ev = self.run_eval(done)
        write_json_atomic(
            self.storage / "result.json",
            {
                "step": done,
                "accuracy": ev["accuracy"],
                "loss": ev["loss"],
                "eval_examples": ev["examples"],
                "train_seconds": round(train_seconds, 3),
                "mode": "async",
            },
        )
        log(f"done: step {done} accuracy {ev['accuracy']}")
        return 0

    def _fetch(self, rv: Any) -> tuple[float, int]:
        try:
            loss, widx = rv.fetch()
            return float(loss), int(widx)
        except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as e:
            if "/job:ps" in str(e):
                raise
            # the closure ran, but its worker vanished before we copied the outputs back
            log(f"could not fetch a finished step's outputs (worker lost?): {type(e).__name__}")
            return float("nan"), -1


def run_chief(task: Task) -> int:
    task.storage.mkdir(parents=True, exist_ok=True)
    return AsyncChief(task).train()


def run_worker_with_chief(task: Task) -> int:
    """cluster.chief.on_worker0 (the ICAC'19 setup): worker 0's process serves its worker task and runs the
    chief beside it, as TensorFlow's in-process clusters do, so the job needs no VM for its chief. The
    chief's exit (its result written, or a failure) is this process's, and ends the server with it."""
    from .server import start_server

    server = start_server(task)
    address = chief_address(task.cluster)
    log(f"worker:0 runs the chief at {address}")
    chief = replace(task, role="chief", index=0, cluster={**task.cluster, "chief": [address]})
    code = run_chief(chief)
    del server  # served until the chief was done; the process exits next
    return code
