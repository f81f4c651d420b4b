"""Per-worker batches and the spec's price book: what both slot expansion and the planner need.

Here, below both, so that ``costmodel.slots`` and ``costmodel.planner`` do not import each other.
"""

from __future__ import annotations

from orchestrator.costmodel.compute import DEFAULT_RUNTIME, TORCHJOB_RUNTIME, Calibration
from orchestrator.costmodel.emulation import REFERENCE_BATCH, emulated_step_s
from orchestrator.costmodel.memory import MemoryParams
from orchestrator.costmodel.split import SplitError, split_batch
from orchestrator.model.catalog import Catalog, PriceBook, load_catalog
from orchestrator.model.spec import JobSpec, TrainingMode
from orchestrator.model.spec.training import BuiltinTraining, CommandTraining, RunTraining, payload_framework
from orchestrator.model.task import proportional_split as proportional_split  # the payload's rule too

DEFAULT_BATCH = 128


def job_runtime(training: BuiltinTraining | CommandTraining | RunTraining) -> str:
    """The calibration runtime a job's steps are predicted under (its workers report the same label): the TF
    job's, the built-in PyTorch job's own, or eager PyTorch for a user's script."""
    if payload_framework(training) == "tensorflow":
        return DEFAULT_RUNTIME
    return TORCHJOB_RUNTIME if isinstance(training, BuiltinTraining) else "pytorch-eager"


def memory_params(spec: JobSpec) -> MemoryParams:
    """The memory model of the spec's optimizer (Adam keeps two slots a parameter, SGD with momentum one) and
    precision: 16-bit autocast keeps its activations in 16 bits, half of what the profile counts (as
    ``crossgpu.layer_memory_bytes``); the weights, gradients and slots stay FP32."""
    slots = 2 if getattr(spec.training, "optimizer", "sgd") == "adam" else 1
    half = job_precision(spec.training) in ("amp", "bf16")
    return MemoryParams(optimizer_slots=slots, activation_fraction=0.5 if half else 1.0)


def job_precision(training: BuiltinTraining | CommandTraining | RunTraining) -> str:
    """The precision a job's steps are predicted at: the spec's ``training.precision`` for a user's script; the
    built-in jobs train in FP32 (the PyTorch one with TF32 off)."""
    return str(getattr(training, "precision", "fp32"))


def price_book_for(spec: JobSpec, catalog: Catalog | None = None, book: str | None = None) -> PriceBook:
    cat = catalog or load_catalog()
    base = cat.price_book(book or spec.pricing.book)
    return base.with_overrides(
        {k: (v.on_demand, v.spot) for k, v in spec.pricing.overrides.items()}, set(cat.machine_types)
    )


def worker_batches(spec: JobSpec, catalog: Catalog | None = None, calibration: Calibration | None = None
                   ) -> list[int]:
    """Per-worker (per-instance) batch: the group's, the spec's per-worker batch, or the global batch split by
    speed (the speeds of ``calibration``, the one the job is planned with; None: the shipped one). An instance
    whose machine type carries k GPUs (a3-highgpu-2g) trains as k GPU-workers, so it gets k GPUs' shares."""
    cluster = spec.pinned
    training = spec.training
    explicit = [g.batch for g in cluster.workers for _ in range(g.count)]
    if training.global_batch is None:
        per = training.batch_per_worker or DEFAULT_BATCH
        return [b or per for b in explicit]
    cat = catalog or load_catalog()
    per_instance = [trained_gpus(spec, cat, g.machine_type or cat.gpu(g.gpu).default_machine_type)
                    if spec.provider.is_cloud else 1 for g in cluster.workers for _ in range(g.count)]
    gpus = [g.gpu for g in cluster.workers for _ in range(g.count)]
    per_gpu = [gpu for gpu, k in zip(gpus, per_instance, strict=True) for _ in range(k)]
    return _fold(_gpu_split(spec, per_gpu, calibration), per_instance)


def trained_gpus(spec: JobSpec, catalog: Catalog, machine_type: str) -> int:
    """How many of an instance's GPUs train: every GPU of an accelerator-optimized machine type (a3-highgpu-2g:
    2), the TensorFlow job's strategy mirroring over them and a PyTorch node running one rank per GPU
    (torchrun --nproc-per-node); one for a pipeline stage (``plan`` warns of its idle GPUs) and on an emulated
    (local) GPU."""
    if not spec.provider.is_cloud:
        return 1
    if payload_framework(spec.training) != "tensorflow" and getattr(spec.training, "parallelism", "data") == "pipeline":
        return 1
    return catalog.gpus_per_instance(machine_type)


def _gpu_split(spec: JobSpec, gpus: list[str], calibration: Calibration | None) -> list[int]:
    """The global batch split over GPU-workers: by speed for a sync job, else evenly."""
    training = spec.training
    total = int(training.global_batch or 0)
    if spec.mode == TrainingMode.SYNC:
        if spec.provider.emulates_gpus:
            # Emulated GPUs step at measured speeds (orchestrator.costmodel.emulation), not the cost model's: split
            # the global batch in proportion to those speeds (below one each: min_max_split's refusal).
            if len(gpus) > total:
                raise SplitError(f"global batch {total} is smaller than the {len(gpus)} workers; give each at least 1")
            speeds = [1.0 / emulated_step_s(g, REFERENCE_BATCH, 1.0) for g in gpus]
            return proportional_split(total, speeds)
        try:
            # fast GPUs get more
            return list(split_batch(training.profile_name, gpus, total, calibration,
                                    runtime=job_runtime(training), precision=job_precision(training)))
        except SplitError:
            # No worker holds the whole model: a job that may run as a pipeline (whose stages take the whole
            # global batch, in micro-batches) gets an even split for its records; data parallel refuses.
            if getattr(training, "parallelism", "data") == "data":
                raise
    return even_split(total, len(gpus))


def _fold(per_gpu: list[int], per_instance: list[int]) -> list[int]:
    """Per-GPU batches summed per instance (instance i holds the next ``per_instance[i]`` GPUs)."""
    out, at = [], 0
    for k in per_instance:
        out.append(sum(per_gpu[at:at + k]))
        at += k
    return out


def even_split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` integer shares that differ by at most one, the larger first."""
    share, rest = divmod(total, parts)
    return [share + (1 if i < rest else 0) for i in range(parts)]
