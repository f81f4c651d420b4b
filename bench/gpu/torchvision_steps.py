"""The 32 torchvision CNNs of ../shared/public-throughput/steptime_ryujaehun.csv, timed on this GPU by that table's
protocol, so that the lent GPU is a held-out GPU for bench/cross_gpu_torchvision.py (the table has no Hopper).

    python3 bench/gpu/torchvision_steps.py OUT.jsonl [--budget S] [--precisions fp32,fp16] [--models a,b]

The table's protocol (ryujaehun/pytorch-gpu-benchmark, benchmark_models.py): ``cudnn.benchmark``; a model of
torchvision.models built with random weights, ``.float()`` or ``.half()`` (pure fp16, no autocast), moved to the
GPU; batch 12 of random 224x224 images made on the host; each step times, between two device syncs, the copy of
the batch to the GPU, ``zero_grad``, forward, cross-entropy and backward (no optimizer step); 5 warm-up steps, then
50 timed; the median. Its A100 ran PyTorch of 2020-21, whose fp32 was TF32 in convolutions and matmuls: here
``allow_tf32`` is set for both (the table's fp32 is the predictor's ``tf32`` class). One JSON line per model x
precision: gpu, model (``tv-NAME``), precision (the table's label), median_ms, mean/min/max, n_iter.
--budget S stops before a model would start past S seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

MODELS = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "resnext101_32x8d",
          "wide_resnet50_2", "wide_resnet101_2", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19",
          "vgg19_bn", "densenet121", "densenet161", "densenet169", "densenet201", "mobilenet_v2", "mnasnet0_5",
          "mnasnet0_75", "mnasnet1_0", "mnasnet1_3", "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5",
          "shufflenet_v2_x2_0", "squeezenet1_0", "squeezenet1_1"]
LABELS = {"fp32": "fp32", "fp16": "fp16(pure .half())"}
BATCH, WARM, TIMED = 12, 5, 50


def time_model(name: str, precision: str) -> dict[str, object]:
    import torch
    import torchvision

    dtype = torch.float32 if precision == "fp32" else torch.float16
    model = getattr(torchvision.models, name)(weights=None).to(dtype=dtype).cuda()
    model.train()
    loss_fn = torch.nn.CrossEntropyLoss()
    target = torch.randint(0, 1000, (BATCH,), device="cuda")
    host = [torch.randn(BATCH, 3, 224, 224).to(dtype) for _ in range(4)]
    times = []
    for i in range(WARM + TIMED):
        img = host[i % len(host)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.zero_grad()
        out = model(img.to("cuda"))
        loss_fn(out, target).backward()
        torch.cuda.synchronize()
        if i >= WARM:
            times.append(1000 * (time.perf_counter() - t0))
    del model
    torch.cuda.empty_cache()
    return {"median_ms": round(statistics.median(times), 3), "mean_ms": round(statistics.fmean(times), 3),
            "min_ms": round(min(times), 3), "max_ms": round(max(times), 3), "n_iter": TIMED}


def time_training(name: str, batch: int, precision: str, steps: int = 40) -> dict[str, object]:
    """A full training step as a user's job runs it: channels_last, SGD with momentum, fp32 / tf32 (matmul and
    conv TF32) / amp (fp16 autocast + GradScaler) / bf16 (bf16 autocast); 10 warm-up steps, the median of
    ``steps`` steps each timed between device syncs, inputs already on the GPU."""
    import torch
    import torchvision

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision != "fp32"
    model = getattr(torchvision.models, name)(weights=None).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "amp")
    dtype = {"amp": torch.float16, "bf16": torch.bfloat16}.get(precision)
    x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    times = []
    torch.cuda.reset_peak_memory_stats()
    for i in range(10 + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.cuda.synchronize()
        if i >= 10:
            times.append(1000 * (time.perf_counter() - t0))
    peak = torch.cuda.max_memory_allocated() / 1e9
    del model, opt
    torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    return {"step_ms": round(statistics.median(times), 3), "min_ms": round(min(times), 3),
            "max_ms": round(max(times), 3), "n_iter": steps, "peak_gb": round(peak, 3)}


def main() -> int:
    p = argparse.ArgumentParser(prog="torchvision_steps.py")
    p.add_argument("out")
    p.add_argument("--budget", type=float, default=240.0)
    p.add_argument("--precisions", default="fp32,fp16")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--training", default="resnet50:128,vgg16:64,mobilenet_v2:128",
                   help="MODEL:BATCH,... timed as full training steps in fp32, tf32, amp and bf16 first ('' for none)")
    a = p.parse_args()
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    gpu = torch.cuda.get_device_name(0)
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "gpu": gpu}
    print(json.dumps({"environment": env}), flush=True)
    t_start, done = time.time(), 0
    with open(a.out, "a") as f:
        for item in filter(None, a.training.split(",")):
            name, batch = item.split(":")
            for precision in ("fp32", "tf32", "amp", "bf16"):
                try:
                    res = time_training(name, int(batch), precision)
                except Exception as e:  # noqa: BLE001 - recorded; the rest still runs
                    res = {"error": f"{type(e).__name__}: {e}"[:300]}
                row = {"gpu": gpu, "model": f"tv-{name}", "batch_per_gpu": int(batch), "precision": precision,
                       **res, "protocol": "training step: channels_last, SGD momentum, autocast", **env}
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(json.dumps({"model": name, "batch": batch, "precision": precision} | res), flush=True)
        for precision in a.precisions.split(","):
            for name in a.models.split(","):
                if time.time() - t_start > a.budget:
                    print(json.dumps({"skipped": f"{name} {precision}: past the budget"}), flush=True)
                    continue
                try:
                    res = time_model(name, precision)
                except Exception as e:  # noqa: BLE001 - one model's failure is recorded, the others still run
                    res = {"error": f"{type(e).__name__}: {e}"[:300]}
                row = {"gpu": gpu, "model": f"tv-{name}", "batch_per_gpu": BATCH, "precision": LABELS[precision],
                       **res, "protocol": "ryujaehun fwd+bwd, no optimizer step, tf32 allowed", **env}
                f.write(json.dumps(row) + "\n")
                f.flush()
                done += 1
                print(json.dumps({k: row[k] for k in ("model", "precision") if k in row} | res), flush=True)
    print(json.dumps({"done": done, "seconds": round(time.time() - t_start, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
