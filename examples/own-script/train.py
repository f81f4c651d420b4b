"""A plain PyTorch DDP training script: it imports nothing from the orchestrator.

Run it with torchrun anywhere (`torchrun --nproc-per-node=2 train.py`), or on spot instances with
`orchestrator launch examples/local-own-script.yaml`. What it uses from its environment:

- torchrun's RANK / WORLD_SIZE / MASTER_ADDR ... (init_process_group reads them);
- ORCHESTRATOR_LOCAL_BATCH_SIZE, ORCHESTRATOR_CHECKPOINT_DIR, ORCHESTRATOR_NOTICE_FILE when set
  (with defaults, so the script runs without the orchestrator too);
- LEARNING_RATE (the spec's env:) and DEMO_TOKEN (a secret: only its length is printed).

On rank 0 it prints one-line JSON metrics, `{"orchestrator_metric": 1, "step": ..., "loss": ...}`,
which the orchestrator stores in its DB.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def metric(**fields: object) -> None:
    if dist.get_rank() == 0:
        print(json.dumps({"orchestrator_metric": 1, **fields}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    batch = int(os.environ.get("ORCHESTRATOR_LOCAL_BATCH_SIZE", "32"))
    ckpt_dir = Path(os.environ.get("ORCHESTRATOR_CHECKPOINT_DIR", "checkpoints"))
    notice = os.environ.get("ORCHESTRATOR_NOTICE_FILE")
    lr = float(os.environ.get("LEARNING_RATE", "0.1"))
    if rank == 0:
        print(f"world {world}, batch {batch} per rank, lr {lr}, "
              f"secret DEMO_TOKEN: {len(os.environ.get('DEMO_TOKEN', ''))} chars", flush=True)

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = np.random.RandomState(0).permutation(len(y))
    test, train = order[:360], order[360:]

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    step = 0
    ckpt = ckpt_dir / "own-script.pt"
    if ckpt.exists():
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    rng = np.random.default_rng(rank)
    t0 = time.perf_counter()
    while step < args.steps:
        idx = torch.from_numpy(rng.choice(train, batch))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 20 == 0 or step == args.steps or (notice and os.path.exists(notice)):
            if rank == 0:
                ckpt_dir.mkdir(parents=True, exist_ok=True)
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
            metric(step=step, loss=round(float(loss), 4),
                   examples_per_s=round(batch * world * step / (time.perf_counter() - t0), 1))
    with torch.no_grad():
        accuracy = float((model.module(x[test]).argmax(1) == y[test]).float().mean())
    metric(kind="eval", step=step, accuracy=round(accuracy, 4))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
