"""One rank of the built-in job: ResNet on CIFAR-10 / offline digits, synchronous DDP under torchrun.

Started by ``torchrun`` (see node.py) as ``python worker.py --task task.json``. Every (re)start of the worker
group reads the world from torchrun's environment, splits the fixed global batch over the ranks in the
planner's proportions, resumes from the newest checkpoint, and rank 0 records the world size (a ``world``
metrics line: the controller turns it into a shrink / grow event). A new preemption notice makes every rank
save a checkpoint at once (collective), recorded with the seconds it took.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # jobs/ (torchrun runs this file directly)

from torchjob import EXIT_BAD_TASK, EXIT_ERROR  # noqa: E402
from torchjob.runtime import backend, die_with_parent, log, use_cuda  # noqa: E402
from torchjob.task import TaskError, load  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worker.py")
    parser.add_argument("--task", required=True)
    args = parser.parse_args(argv)
    die_with_parent()
    try:
        task = load(args.task)
    except TaskError as e:
        log(str(e))
        return EXIT_BAD_TASK
    import torch.distributed as dist

    from torchjob.train import Trainer, WorldChange

    device_id = None
    if use_cuda():
        import torch

        # Before the process group: NCCL (its communicators, object collectives, barrier, DCP) uses the
        # current device; without this every rank of a multi-GPU host would take GPU 0. device_id binds the
        # group to it (and mutes barrier()'s "using the device under current context" warning).
        device_id = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device_id)
    dist.init_process_group(backend(), timeout=timedelta(seconds=float(os.environ.get("TORCHJOB_TIMEOUT_S", 120))),
                            device_id=device_id if backend() == "nccl" else None)
    try:
        if task.pipeline is not None:
            from torchjob.pipe import PipeTrainer  # a pipeline stage instead of a DDP replica

            PipeTrainer(task).run()
        else:
            Trainer(task).run()
    except WorldChange as e:
        log(str(e))
        _exit_now(EXIT_ERROR)
    except Exception:  # noqa: BLE001 - any failure: torchrun restarts the group (from the last checkpoint)
        traceback.print_exc()
        _exit_now(EXIT_ERROR)
    _exit_now(0)
    return 0


def _exit_now(code: int) -> None:
    """Exit without tearing the process group down: after a peer died, destroy_process_group can hang."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
