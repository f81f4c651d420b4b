"""Async-mode ps and worker tasks: a gRPC tf.distribute.Server that serves until killed."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import tensorflow as tf

from . import pipeline
from .common import log, server_config
from .task import Task


def wait_for_port(address: str, timeout_s: float = 300.0) -> None:
    """Block until this task's port is free.

    A replacement starts while the instance it replaces may still hold the slot's address (the
    preemption notice window); waiting here, with TensorFlow already imported, lets it bind the moment the
    old one dies instead of failing and paying the import again.
    """
    port = int(address.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("", port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # let the server report the conflict itself
        time.sleep(0.05)


def start_server(task: Task) -> tf.distribute.Server:
    """This ps / worker task's gRPC server, serving from now on (in the background)."""
    wait_for_port(task.cluster[task.role][task.index])
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
    return server


def run_server(task: Task) -> int:
    start_server(task).join()
    return 0
