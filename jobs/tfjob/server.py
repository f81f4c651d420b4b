"""Async-mode ps and worker tasks: a gRPC tf.distribute.Server that serves until killed."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from . import pipeline
from .common import log, server_config
from .task import Task


def run_server(task: Task) -> int:
    if task.role == "worker":
        # Per-worker files read in-graph by the dataset function the chief sends (see pipeline.py).
        pipeline.prepare_task_dir(Path.cwd(), task.training.data_dir, task.index, task.step_sleep_s)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(task.cluster),
        job_name=task.role,
        task_index=task.index,
        protocol="grpc",
        config=server_config(),
        start=True,
    )
    log(f"{task.role}:{task.index} serving at {task.cluster[task.role][task.index]} ({server.target})")
    server.join()
    return 0
