"""A replica group for tests/jobs/test_torch_ft_kill.py: ``python ft_replica.py LIGHTHOUSE SLOT WEIGHT STEPS OUT``.

Trains the tiny ResNet on fixed random data through jobs/torchjob/ft_step.py and appends one JSON line per
committed step (step, world, wall time, pid, a weight) to OUT. ``FT_LATE_S`` makes this group compute that much
longer before each gradient all-reduce (a ``late`` line first): its peers then wait inside the all-reduce, where a
test kills it. ``FT_UNTIL_WORLD`` keeps it training past STEPS until a step had that many groups (a replacement
joined).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jobs"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torchjob import ft_step  # noqa: E402
from torchjob.model import resnet  # noqa: E402

GLOBAL = 12


def main() -> None:
    lighthouse, slot, weight, steps, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), \
        sys.argv[5]
    torch.set_num_threads(1)
    torch.manual_seed(3)
    model = resnet("resnet_tiny").train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(GLOBAL, 3, 32, 32, generator=g), torch.randint(0, 10, (GLOBAL,), generator=g)
    replica = ft_step.make_replica(model, opt, lighthouse=lighthouse, replica_id=f"slot{slot}", slot=slot,
                                   weight=weight, global_batch=GLOBAL)
    delay = float(os.environ.get("FT_LATE_S", "0"))
    until_world = int(os.environ.get("FT_UNTIL_WORLD", "1"))  # go on past STEPS until a step had this world
    world = 0
    stop = Path(os.environ["FT_STOP_FILE"]) if os.environ.get("FT_STOP_FILE") else None  # bench: ends a run

    def loss_of(offset: int, batch: int) -> torch.Tensor:
        if delay:  # this group comes late to the step's all-reduce: its peers wait inside it meanwhile
            f.write(json.dumps({"late": replica.manager.current_step(), "t": time.time()}) + "\n")
            f.flush()
            time.sleep(delay)
        return F.cross_entropy(model(x[offset:offset + batch]), y[offset:offset + batch], reduction="sum") / GLOBAL

    with open(out, "a", encoding="utf-8") as f:  # noqa: PTH123
        while (replica.manager.current_step() < steps or world < until_world) and not (stop and stop.exists()):
            info, loss = ft_step.step_once(replica, [0.0, 0.0], loss_of)
            if loss is None or info is None:
                f.write(json.dumps({"retry": True, "t": time.time(), "pid": os.getpid()}) + "\n")
                continue
            world = info.world
            f.write(json.dumps({"step": replica.manager.current_step(), "world": info.world, "t": time.time(),
                                "pid": os.getpid(), "healed_s": replica.healed_s, "loss": float(loss),
                                "w0": float(next(model.parameters()).flatten()[0])}) + "\n")
            f.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
