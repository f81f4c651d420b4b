"""Process helpers shared by the entry points (no torch import)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1


def use_cuda() -> bool:
    """This rank computes on its GPU: CUDA is there and TORCHJOB_DEVICE is not ``cpu``."""
    import torch

    return torch.cuda.is_available() and os.environ.get("TORCHJOB_DEVICE", "") != "cpu"


def backend() -> str:
    """NCCL on a GPU, gloo on the CPU. TORCHJOB_BACKEND=gloo keeps gloo on a GPU: several ranks sharing one
    GPU (MPS shares, bench/gpu/resplit_mps.py), which NCCL refuses; the tensors stay on the GPU
    (data-parallel ranks only: a pipeline stage on gloo stays on the CPU)."""
    return os.environ.get("TORCHJOB_BACKEND", "") or ("nccl" if use_cuda() else "gloo")


def log(msg: str) -> None:
    print(f"[torchjob {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux).

    torchrun starts each worker in a session of its own, so killing the agent's process group (a revoked
    instance, a stopped task) would leave the workers running; with this they go with the agent.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def leave_with_agent() -> None:
    """Kill this rank's torchrun agent, then exit: the node leaves the elastic world now, not at the kill."""
    os.kill(os.getppid(), signal.SIGKILL)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
