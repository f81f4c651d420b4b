"""Sync mode: MultiWorkerMirroredStrategy custom loop with unequal per-worker batches (HetSeq-style).

Worker i consumes ``batch_per_worker[i]`` examples per step; its loss is sum(per-example CE) / global
batch (plus weight decay / num_workers), and gradients are all-reduced with SUM, so each update equals
single-machine training on the concatenated global batch. Worker 0 does the job's I/O; the other workers
save their (required) checkpoints into ``./tfjob_scratch_ckpt`` in their own cwd. A notice seen by worker 0
is broadcast to all workers inside the next step's all-reduce so that every worker saves at the same step.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import tensorflow as tf

from . import data, pipeline
from .common import evaluate, log, make_optimizer, weight_decay_loss, weighted_loss
from .hparams import get_hparams
from .models import build_model
from .reporting import MetricsWriter, NoticeWatcher, WindowStats, write_json_atomic
from .task import Task

# A collective waiting longer than this fails (peer hung). A dead peer is detected sooner (~2 s on localhost)
# by the coordination service's heartbeats, which abort the collectives.
COLLECTIVE_TIMEOUT_S = float(os.environ.get("TFJOB_COLLECTIVE_TIMEOUT_S", "300"))
SCRATCH_CKPT_DIR = "tfjob_scratch_ckpt"


def _make_strategy(task: Task) -> tf.distribute.Strategy:
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": task.cluster, "task": {"type": "worker", "index": task.index}}
    )
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=COLLECTIVE_TIMEOUT_S,
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def run_sync(task: Task) -> int:
    t_start = time.monotonic()
    tr, hp = task.training, get_hparams(task.training.hparam_set)
    cwd = Path.cwd()
    pipeline.prepare_task_dir(cwd, tr.data_dir, task.index, task.step_sleep_s)
    strategy = _make_strategy(task)
    bpw = tr.batch_per_worker
    global_batch, n_workers, chief = sum(bpw), task.num_workers, task.is_chief
    with strategy.scope():
        model = build_model(tr.hparam_set, data.IMAGE_SHAPE, data.NUM_CLASSES)
        optimizer = make_optimizer(hp, global_batch, tr.train_steps)
        optimizer.build(model.trainable_variables)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    ckpt_dir = task.storage / "checkpoints" if chief else cwd / SCRATCH_CKPT_DIR
    manager = tf.train.CheckpointManager(ckpt, str(ckpt_dir), max_to_keep=3 if chief else 1)
    latest = tf.train.latest_checkpoint(
        str(task.storage / "checkpoints")
    )  # every worker restores the same one
    step = 0
    if latest:
        ckpt.restore(latest)
        step = int(step_var.numpy())
        log(f"worker {task.index}: restored {latest} at step {step}")
    optimizer.iterations.assign(step)
    seed = (tr.seed * 1_000_003 + step) * 1009 + task.index  # per worker; a resumed run reshuffles
    ds = pipeline.train_dataset(
        bpw[task.index], seed, augment=bool(tr.data_dir), record_file=str(cwd / pipeline.RECORD_FILE)
    )
    it = iter(ds)
    wd = hp.weight_decay

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(x: tf.Tensor, y: tf.Tensor, control: tf.Tensor) -> Any:
        def replica_fn(x: tf.Tensor, y: tf.Tensor, control: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = weighted_loss(y, logits, global_batch) + weight_decay_loss(model, wd) / n_workers
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(
                zip(grads, model.trainable_variables, strict=True)
            )  # all-reduce SUM inside
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.concat([tf.reshape(loss, [1]), control], 0))

        return strategy.run(replica_fn, args=(x, y, control))

    metrics = MetricsWriter(task.storage / "metrics.jsonl") if chief else None
    notices = NoticeWatcher(task.storage / "notices") if chief else None
    eval_x = eval_y = None
    if chief:
        eval_x, eval_y = data.load_split(tr.data_dir, "test")
        eval_x = data.normalize(eval_x)

    def save(at: int, reason: str) -> None:
        t0 = time.monotonic()
        step_var.assign(at)
        manager.save(checkpoint_number=at)
        log(f"worker {task.index}: saved checkpoint at step {at} ({reason})")
        if metrics:
            metrics.write("checkpoint", step=at, reason=reason, seconds=round(time.monotonic() - t0, 4))

    def run_eval(at: int) -> dict[str, Any]:
        assert metrics is not None and eval_x is not None and eval_y is not None
        acc, loss, n = evaluate(model, eval_x, eval_y)
        return metrics.write("eval", step=at, accuracy=round(acc, 5), loss=round(loss, 5), examples=n)

    if metrics:
        metrics.write(
            "start",
            step=step,
            resumed=step > 0,
            mode="sync",
            workers=n_workers,
            setup_s=round(time.monotonic() - t_start, 3),
        )
    log(
        f"worker {task.index}: starting at step {step}/{tr.train_steps}"
        f" (batch {bpw[task.index]} of {global_batch})"
    )
    train_t0 = time.monotonic()
    window = WindowStats()
    while step < tr.train_steps:
        notice = 1.0 if (notices and notices.poll()) else 0.0
        if task.step_sleep_s > 0:
            time.sleep(task.step_sleep_s)
        x, y = next(it)
        out = strategy.experimental_local_results(train_step(x, y, tf.constant([notice])))[0].numpy()
        step += 1
        if chief:
            for w in range(n_workers):  # synchronous: every worker did this step
                window.add(w, float(out[0]) if w == 0 else float("nan"))
        if metrics and (step % tr.log_every == 0 or step == tr.train_steps):
            metrics.write("step", **window.record(step, bpw))
            window = WindowStats()
        if out[1] > 0 and step < tr.train_steps:
            save(step, "notice")
        elif step < tr.train_steps and tr.checkpoint_every > 0 and step % tr.checkpoint_every == 0:
            save(step, "periodic")
        if chief and step < tr.train_steps and tr.eval_every > 0 and step % tr.eval_every == 0:
            run_eval(step)
    train_seconds = time.monotonic() - train_t0
    save(step, "final")
    if chief:
        ev = run_eval(step)
        write_json_atomic(
            task.storage / "result.json",
            {
                "step": step,
                "accuracy": ev["accuracy"],
                "loss": ev["loss"],
                "eval_examples": ev["examples"],
                "train_seconds": round(train_seconds, 3),
                "mode": "sync",
            },
        )
        log(f"done: step {step} accuracy {ev['accuracy']}")
    return 0
