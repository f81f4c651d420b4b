"""Mini-max pipeline partitions against equal-layers partitions, as the cost model predicts them.

For each model and cluster: the predicted step time of the partitioner's mini-max plan (every GPU order,
contiguous unit-aligned cuts, memory per stage) and of the heterogeneity-blind baseline (as many units per stage,
in the order the GPUs are listed), and the data-parallel step where the whole model fits a GPU.

These are PREDICTIONS of one cost model compared with each other: they show what the partitioner gains by its
own account, not that the account is right. No pipeline job runs yet (issue 24, item 1), so no step time here
is measured; the measured check of the partitioner's prediction comes with that job.

    python bench/pipeline_partition.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.costmodel.memory import MemoryParams, fits  # noqa: E402
from orchestrator.costmodel.partition import Partitioner, StageDevice  # noqa: E402
from orchestrator.costmodel.stepmodel import step_time  # noqa: E402
from orchestrator.model.catalog import load_catalog  # noqa: E402

CASES = [  # model, optimizer slots, global batch, GPUs
    ("resnet_cifar_32", 1, 128, ["v100", "p100", "k80"]),
    ("resnet_cifar_56", 1, 256, ["a100", "l4", "t4"]),
    ("vgg16", 1, 64, ["v100", "t4", "t4"]),
    ("transformer_base", 2, 64, ["a100", "l4", "t4", "t4"]),
    ("gpt_1_5b", 2, 16, ["t4", "t4", "l4", "l4"]),
    ("gpt_1_5b", 2, 16, ["a100", "l4", "t4", "t4"]),
]


def main() -> None:
    cat = load_catalog()
    print(f"{'model':<18}{'GPUs':<22}{'mini-max s':>11}{'equal s':>9}{'gain':>7}{'data s':>9}  mini-max stages")
    for model, slots, batch, gpus in CASES:
        mem = MemoryParams(optimizer_slots=slots)
        part = Partitioner(model, catalog=cat, memory=mem)
        devices = [StageDevice(g, cat.gpu(g).default_machine_type) for g in gpus]
        best = part.best(devices, batch)
        equal = part.equal_layers(devices, batch)
        per = max(1, batch // len(gpus))
        whole = all(fits(model, g, per, cat, mem) for g in gpus)
        data = max(step_time(model, g, per, catalog=cat) for g in gpus) if whole else float("nan")
        if best is None:
            print(f"{model:<18}{'+'.join(gpus):<22}{'no fit':>11}")
            continue
        eq = f"{equal.step_s:9.3f}" if equal.fits else f"{'(no fit)':>9}"
        gain = f"{equal.step_s / best.step_s:6.2f}x" if equal.fits else f"{'—':>7}"
        stages = ", ".join(f"{d.gpu}:{j - i}" for d, (i, j) in zip(best.devices, best.layer_ranges(), strict=True))
        print(f"{model:<18}{'+'.join(gpus):<22}{best.step_s:11.3f}{eq}{gain}{data:9.3f}  {stages}")
    print("\nAll figures are the cost model's predictions (seconds per training step); 'data s' is the slowest "
          "worker's compute at an equal split, 'nan' where the whole model does not fit every GPU.")


if __name__ == "__main__":
    main()
