"""A DDP step with uneven per-rank batches over gloo equals one process on the same examples.

Three real processes (gloo on CPU) take slices of sizes 5, 2 and 9 of one global batch of 16; rank 0 writes
the gradients DDP left after its all-reduce. One process then runs the same model on all 16 examples.
The built-in job's loss weighting (``weighted_loss``) and its cross-rank batch norm must make them equal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

JOBS = Path(__file__).resolve().parents[2] / "jobs"
sys.path.insert(0, str(JOBS))

from torchjob.model import resnet, weighted_loss  # noqa: E402
from torchjob.split import offsets, proportional_split  # noqa: E402

BATCHES = [5, 2, 9]
GLOBAL = sum(BATCHES)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(GLOBAL, 3, 32, 32, generator=g, dtype=torch.float64), torch.randint(0, 10, (GLOBAL,),
                                                                                           generator=g)


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    return resnet("resnet_tiny").double().train()


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _rank(rank: int, world: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    x, y = _data()
    start = offsets(BATCHES)[rank]
    model = torch.nn.parallel.DistributedDataParallel(_model(), broadcast_buffers=False)
    loss = weighted_loss(model(x[start: start + BATCHES[rank]]), y[start: start + BATCHES[rank]], GLOBAL, world)
    loss.backward()
    if rank == 0:
        torch.save(_grads(model.module), out)
    dist.barrier()
    dist.destroy_process_group()


def test_uneven_ddp_step_equals_one_process(tmp_path: Path) -> None:
    out = tmp_path / "ddp_grads.pt"
    mp.spawn(_rank, args=(len(BATCHES), str(tmp_path / "store"), str(out)), nprocs=len(BATCHES), join=True)
    ddp = torch.load(out)

    x, y = _data()
    single = _model()
    torch.nn.functional.cross_entropy(single(x), y).backward()  # the plain global-batch mean
    ref = _grads(single)

    assert ddp.keys() == ref.keys() and len(ref) > 10
    worst = max(float((ddp[k] - ref[k]).abs().max()) for k in ref)
    print(f"worst gradient difference {worst:.3e}")
    assert worst < 1e-6, worst
    # and the per-rank batches above are what the planner's split gives for those weights
    assert proportional_split(GLOBAL, [5.0, 2.0, 9.0]) == BATCHES


def test_split_keeps_the_global_batch_after_a_shrink() -> None:
    planned = [20, 30, 46]  # the planner's batches for three GPU types (global 96)
    assert proportional_split(96, [float(b) for b in planned]) == planned
    survivors = proportional_split(96, [20.0, 46.0])  # the middle node was revoked
    assert sum(survivors) == 96 and survivors[0] < survivors[1]
