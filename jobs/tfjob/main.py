"""Dispatch on the task's mode and role; map failures to exit codes."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from . import EXIT_BAD_TASK, EXIT_CLUSTER, EXIT_ERROR
from .task import TaskError, load_task


def _is_cluster_error(e: BaseException) -> bool:
    import tensorflow as tf

    from .async_chief import PSLostError

    if isinstance(e, (tf.errors.OpError, PSLostError, ConnectionError)):
        return True
    # coordinator wrappers (ClosureInputError, ClosureAbortedError, ...) and anything caused by an OpError
    cause = e.__cause__ or e.__context__ or getattr(e, "original_exception", None)
    return cause is not None and cause is not e and _is_cluster_error(cause)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="train.py", description=__doc__)
    parser.add_argument("--task", required=True, help="path to task.json")
    args = parser.parse_args(argv)
    try:
        task = load_task(args.task)
    except TaskError as e:
        print(f"[tfjob] {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_TASK

    from .common import configure_local_threads, log

    log(
        f"{task.instance}: mode={task.mode} role={task.role}:{task.index} pid={os.getpid()} cwd={os.getcwd()}"
    )
    try:
        if task.hosts_chief:  # cluster.chief.on_worker0: this worker's process runs the chief too
            configure_local_threads()
            from .async_chief import run_worker_with_chief

            return run_worker_with_chief(task)
        if task.mode == "async" and task.role in ("ps", "worker"):
            from .server import run_server

            return run_server(task)
        configure_local_threads()
        if task.mode == "async":
            from .async_chief import run_chief

            return run_chief(task)
        from .sync_worker import run_sync

        return run_sync(task)
    except KeyboardInterrupt:
        return 130
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        code = EXIT_CLUSTER if _is_cluster_error(e) else EXIT_ERROR
        log(f"{task.instance}: exiting with code {code}: {type(e).__name__}: {str(e)[:500]}")
        return code


def run() -> None:
    """Exit without interpreter teardown: TF's coordinator / collective threads can hang it."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
