"""How fast the local provider's emulated GPUs step: MEASURED curves, never the cost model.

A local worker of GPU ``g`` at per-worker batch ``b`` sleeps, each step, on top of its real CPU work:

    sleep(g, b) = k80_s * R(g) * C(k(g) 128 b / reference) / C(k(g) 128)

* ``R(g)``: the GPU's measured ResNet-32 (batch 128) step time relative to a K80's, from
  ``data/measurements``: the ICAC'19 study's TensorFlow runs on GCE for K80 / P100 / V100, the H100
  measured in PyTorch eager (../shared/measurements). A GPU type with no measurement uses its datasheet
  FP32 ratio to the V100 (``data/gpus.csv``) and is flagged as such (:func:`reference_step_s`).
* ``C``: the measured H100 batch curve of ResNet-32 (eager PyTorch, FP32, batch 32 to 2048),
  interpolated log-log between measured batches and extrapolated linearly in the batch beyond them:
  flat while per-step overhead dominates (~13 ms up to batch 512), then growing with the work.
* ``k(g)``: how many times more work an H100 does in the GPU's measured step at batch 128, read off the
  same curve (:func:`equivalent_batch`; 1 for a GPU as fast as the H100's overhead floor). A K80 (216 ms),
  P100 (80 ms) or V100 (65 ms) at batch 128 is far above that 13 ms floor, so it is bound by its compute,
  and its step grows with its batch as the H100's does at the batch of the same work; at a small batch it
  falls to the same per-step overhead. (Borrowing the H100's overhead-bound shape at batch 128 for a K80
  made every emulated GPU flat in batch, so a re-split could not speed up a slow rank.)
* the job's ``batch_per_worker`` (or global batch / workers) stands for the study's batch of 128; the
  spec's ``emulation_k80_step_s`` is the K80's sleep at that batch (the time scale of the emulation).
  At that batch ``k(g)`` cancels: every GPU sleeps ``k80_s * R(g)``.

Because none of this comes from ``orchestrator.costmodel``, fitting or testing the cost model on local
runs compares it with measured behaviour, not with itself (an import contract in pyproject.toml keeps it so).
The planner, the simulator and the controller reach it through the local provider's step model
(``providers.local.step_model.EmulatedStep``), handed to the cost model as any other step model.
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.model.catalog import load_catalog
from orchestrator.model.paths import data_dir
from orchestrator.model.spec import JobSpec

REFERENCE_MODEL, REFERENCE_BATCH = "resnet_cifar_32", 128  # the 2019 study's workload and batch
CURVE = ("h100", "pytorch-eager", "fp32")  # the measured batch curve
CLUSTER_COLUMNS = ("ps_count", "workers", "steps_per_s")  # a row with all three is a cluster's rate


@dataclass(frozen=True)
class Reference:
    step_s: float  # measured (or derived) ResNet-32 step time at batch 128
    source: str


@functools.cache
def _rows() -> tuple[tuple[str, str, str, str, int, float, str], ...]:
    """(gpu, runtime, precision, model, batch, step seconds, source) of every single-GPU step time in
    data/measurements. Read here, not through the cost model's reader: the emulation must not depend on the
    model it is there to test."""
    out = []
    for path in sorted((data_dir() / "measurements").glob("*.csv")):
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                step_ms = (row.get("step_ms") or "").strip()
                cluster = all(float((row.get(k) or "").strip() or 0) > 0 for k in CLUSTER_COLUMNS)
                if not step_ms or float(step_ms) <= 0 or cluster:
                    continue  # a cluster's rate (steps/s with parameter servers), not one GPU's step
                out.append((row["gpu"].strip().lower(), (row.get("runtime") or "").strip(),
                            (row.get("precision") or "").strip() or "fp32", row["model"].strip(),
                            int(float(row["batch"])), float(step_ms) / 1e3, (row.get("source") or "").strip()))
    return tuple(out)


@functools.cache
def _curve_source() -> str:
    """The measuring session with the most batches of the curve: one session's points, since sessions
    differ by up to ~15% at small batch and a curve mixing them would zigzag."""
    batches: dict[str, set[int]] = {}
    for g, rt, p, model, b, _, src in _rows():
        if (g, rt, p) == CURVE and model == REFERENCE_MODEL:
            batches.setdefault(src, set()).add(b)
    return max(batches, key=lambda src: len(batches[src])) if batches else ""


@functools.cache
def batch_curve() -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(batches, seconds) of the measured curve, sorted by batch."""
    pts = sorted({(b, t) for g, rt, p, model, b, t, src in _rows()
                  if (g, rt, p) == CURVE and model == REFERENCE_MODEL and src == _curve_source()})
    if len(pts) < 2:
        raise RuntimeError("data/measurements lacks the H100 ResNet-32 batch curve the emulation follows")
    return tuple(b for b, _ in pts), tuple(t for _, t in pts)


def curve_s(batch: float) -> float:
    """The measured curve at any batch (log-log interpolation; linear in the batch past the ends)."""
    bs, ts = batch_curve()
    b = max(1.0, float(batch))
    if b <= bs[0]:
        return ts[0]  # below the smallest batch the overhead plateau holds
    if b >= bs[-1]:
        slope = (ts[-1] - ts[-2]) / (bs[-1] - bs[-2])
        return ts[-1] + slope * (b - bs[-1])
    i = bisect.bisect_right(bs, b) - 1
    f = (math.log(b) - math.log(bs[i])) / (math.log(bs[i + 1]) - math.log(bs[i]))
    return math.exp(math.log(ts[i]) + f * (math.log(ts[i + 1]) - math.log(ts[i])))


@functools.cache
def reference_step_s(gpu: str) -> Reference:
    """The GPU's ResNet-32 batch-128 step time: measured where data/measurements has it (TF 2019 runs
    preferred, the study's framework), else the V100's scaled by the datasheet FP32 ratio."""
    key = gpu.lower()
    found = [(rt != "tf1-graph", src != _curve_source(), t, src) for g, rt, p, model, b, t, src in _rows()
             if g == key and model == REFERENCE_MODEL and b == REFERENCE_BATCH and p == "fp32"]
    if found:
        *_, t, src = min(found)
        return Reference(t, src.split(" ")[0] if "://" in src else src.split(":")[0])  # the URL, or the measurer
    cat = load_catalog()
    v100 = reference_step_s("v100")
    ratio = cat.gpu("v100").fp32_tflops / cat.gpu(key).fp32_tflops
    return Reference(v100.step_s * ratio, f"no measurement: V100 x datasheet FP32 ratio {ratio:.2f}")


@functools.cache
def equivalent_batch(gpu: str) -> float:
    """The batch at which the measured H100 curve takes the GPU's measured step at batch 128: the inverse of
    :func:`curve_s` on its rising part (the reference batch itself for a GPU at or under the H100's floor)."""
    t = reference_step_s(gpu).step_s
    if t <= curve_s(REFERENCE_BATCH) * (1 + 1e-9):  # the H100 itself (the curve's own point), or faster
        return float(REFERENCE_BATCH)
    bs, ts = batch_curve()
    i = max(j for j, tj in enumerate(ts) if tj <= t)  # the curve stays above t past this measured batch
    if i == len(bs) - 1:
        slope = (ts[-1] - ts[-2]) / (bs[-1] - bs[-2])
        return bs[-1] + (t - ts[-1]) / slope
    f = (math.log(t) - math.log(ts[i])) / (math.log(ts[i + 1]) - math.log(ts[i]))
    return math.exp(math.log(bs[i]) + f * (math.log(bs[i + 1]) - math.log(bs[i])))


def emulated_step_s(gpu: str, batch: float, k80_s: float, reference_batch: float = REFERENCE_BATCH) -> float:
    """Seconds a local worker of ``gpu`` sleeps a step at ``batch`` (see the module docstring)."""
    ratio = reference_step_s(gpu).step_s / reference_step_s("k80").step_s
    work = equivalent_batch(gpu) / REFERENCE_BATCH  # k(g)
    shape = curve_s(work * REFERENCE_BATCH * batch / reference_batch) / curve_s(work * REFERENCE_BATCH)
    return k80_s * ratio * shape


def reference_batch(spec: JobSpec) -> float:
    """The per-worker batch that stands for the study's batch of 128."""
    training = spec.training
    if training.batch:
        return float(training.batch)
    if training.global_batch and spec.worker_count:
        return training.global_batch / spec.worker_count
    # Every group pins its batch: their mean, as the same split written as a global batch would give (else a
    # pinned split of batch 96 would emulate other GPUs than the planner's split of the same 96).
    pinned = [g.batch for g in (spec.cluster.workers if spec.cluster else []) for _ in range(g.count)]
    if pinned and all(pinned):
        return sum(b or 0 for b in pinned) / len(pinned)
    return float(REFERENCE_BATCH)


def emulation_sleep(spec: JobSpec) -> Callable[[str | None, int], float]:
    """(gpu, batch) -> extra seconds per step of a local worker (0 for other providers and CPU roles)."""
    provider = spec.provider.as_local()
    if provider is None or provider.emulation_k80_step_s == 0:
        return lambda gpu, batch: 0.0
    ref = reference_batch(spec)
    k80_s = provider.emulation_k80_step_s

    def sleep_s(gpu: str | None, batch: int) -> float:
        return 0.0 if gpu is None else round(emulated_step_s(gpu, batch, k80_s, ref), 4)

    return sleep_s
