"""Checkpoints with torch.distributed.checkpoint (DCP) in ``<storage>/checkpoints/step-<N>/``.

DCP writes ``.metadata`` last, so a directory holding it is complete; the newest complete one is resumed
from, by any world size (the DDP state is replicated, so DCP keeps one copy of each tensor).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

KEEP = 3


def _dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def complete(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.name.startswith("step-") and (p / ".metadata").exists())
    except FileNotFoundError:
        return []


def save(root: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> float | None:
    """Collective: every rank calls it. Returns the seconds it took, or None if that step is saved already."""
    if (_dir(root, step) / ".metadata").exists():
        return None
    msd, osd = get_state_dict(model, opt)
    return save_state(root, {"model": msd, "optim": osd}, step)


def save_state(root: Path, state: dict[str, object], step: int) -> float | None:
    """Collective: a state dict (each rank its own keys, or the same replicated ones) as the step's checkpoint."""
    path = _dir(root, step)
    if (path / ".metadata").exists():
        return None
    t0 = time.perf_counter()
    dcp.save({**state, "step": torch.tensor(step)}, checkpoint_id=str(path))
    seconds = time.perf_counter() - t0
    if not dist.is_initialized() or dist.get_rank() == 0:  # torchft's rank 0 saves alone, with no group
        for old in complete(root)[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    return seconds


def load_state(root: Path, state: dict[str, object]) -> int:
    """Fill ``state`` (its keys only) from the newest complete checkpoint; its step, 0 if there is none."""
    found = complete(root)
    if not found:
        return 0
    full = {**state, "step": torch.tensor(0)}
    dcp.load(full, checkpoint_id=str(found[-1]))
    state.update({k: v for k, v in full.items() if k != "step"})
    return int(full["step"])  # type: ignore[call-overload]


def restore(root: Path, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Load the newest complete checkpoint into model and optimizer; returns its step (0 if none)."""
    found = complete(root)
    if not found:
        return 0
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(found[-1]))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"])
