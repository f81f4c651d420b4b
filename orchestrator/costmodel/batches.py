"""Per-worker batches and the spec's price book: what both slot expansion and the planner need.

Here, below both, so that ``costmodel.slots`` and ``costmodel.planner`` do not import each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.costmodel.compute import Calibration, FloatArray
from orchestrator.costmodel.job_runtime import job_precision as job_precision
from orchestrator.costmodel.job_runtime import job_runtime as job_runtime
from orchestrator.costmodel.memory import MemoryParams, max_batch
from orchestrator.costmodel.split import SplitError, min_max_split
from orchestrator.costmodel.stepmodel import COST_STEPS, StepModel, step_fn
from orchestrator.model.catalog import Catalog, PriceBook, load_catalog
from orchestrator.model.spec import JobSpec, TrainingMode
from orchestrator.model.spec.training import DEFAULT_BATCH as DEFAULT_BATCH  # the one default, the spec's
from orchestrator.model.spec.training import payload_framework
from orchestrator.model.task import proportional_split as proportional_split  # the payload's rule too
from orchestrator.model.torch_spec import replica_groups

TableFn = Callable[[str, int], FloatArray]  # (gpu, longest batch wanted) -> step times of batches 1..its cap


def memory_params(spec: JobSpec) -> MemoryParams:
    """The memory model of the spec's optimizer (Adam keeps two slots a parameter, SGD with momentum one) and
    precision: 16-bit autocast keeps its activations in 16 bits, half of what the profile counts (as
    ``crossgpu.layer_memory_bytes``); the weights, gradients and slots stay FP32."""
    slots = 2 if getattr(spec.training, "optimizer", "sgd") == "adam" else 1
    half = job_precision(spec.training) in ("amp", "bf16")
    return MemoryParams(optimizer_slots=slots, activation_fraction=0.5 if half else 1.0)


def price_book_for(spec: JobSpec, catalog: Catalog | None = None, book: str | None = None) -> PriceBook:
    cat = catalog or load_catalog()
    base = cat.price_book(book or spec.pricing.book)
    return base.with_overrides(
        {k: (v.on_demand, v.spot) for k, v in spec.pricing.overrides.items()}, set(cat.machine_types)
    )


def worker_batches(spec: JobSpec, catalog: Catalog | None = None, calibration: Calibration | None = None,
                   steps: StepModel | None = None) -> list[int]:
    """Per-worker (per-instance) batches of a pinned cluster by :func:`gpu_batches` (the speeds of
    ``calibration``, the one the job is planned with; None: the shipped one; ``steps``: the job's step model,
    which may split by speeds of its own). An instance whose machine type
    carries k GPUs (a3-highgpu-2g) trains as k GPU-workers: a split total gives it k GPUs' shares; a batch
    given per worker is its GPUs' batch. A pipeline-capable job whose model no worker holds whole gets an even
    split for its records (its stages take the whole global batch in micro-batches); data parallel refuses."""
    cluster = spec.pinned
    gpus = [g.gpu for g in cluster.workers for _ in range(g.count)]
    if planned_total(spec) is None:  # each instance its own batch, which each of its GPUs trains
        return gpu_batches(spec, gpus, fixed=[g.batch for g in cluster.workers for _ in range(g.count)])
    cat = catalog or load_catalog()
    per_instance = [trained_gpus(spec, cat, g.machine_type or cat.gpu(g.gpu).default_machine_type)
                    if spec.provider.is_cloud else 1 for g in cluster.workers for _ in range(g.count)]
    per_gpu = [gpu for gpu, k in zip(gpus, per_instance, strict=True) for _ in range(k)]
    try:
        split = gpu_batches(spec, per_gpu, calibration, cat, steps=steps)
    except SplitError:
        if getattr(spec.training, "parallelism", "data") == "data":
            raise
        split = even_split(int(spec.training.global_batch or 0), len(per_gpu))
    return _fold(split, per_instance)


def trained_gpus(spec: JobSpec, catalog: Catalog, machine_type: str) -> int:
    """How many of an instance's GPUs train: every GPU of an accelerator-optimized machine type (a3-highgpu-2g:
    2), the TensorFlow job's strategy mirroring over them and a PyTorch node running one rank per GPU
    (torchrun --nproc-per-node); one for a pipeline stage and a torchft replica group (one process a VM: ``plan``
    warns of the idle GPUs) and on an emulated (local) GPU."""
    if not spec.provider.is_cloud:
        return 1
    if payload_framework(spec.training) != "tensorflow" and (
            getattr(spec.training, "parallelism", "data") == "pipeline" or replica_groups(spec)):
        return 1
    return catalog.gpus_per_instance(machine_type)


def gpu_batches(spec: JobSpec, gpus: Sequence[str], calibration: Calibration | None = None,
                catalog: Catalog | None = None, fixed: Sequence[int | None] | None = None,
                tables: TableFn | None = None, steps: StepModel | None = None) -> list[int]:
    """The one batch rule, for a pinned cluster (``worker_batches``) and a searched one (the planner's
    ``Evaluator``): each GPU-worker's batch. The total of :func:`planned_total` is split by
    :func:`split_total`; without one, each worker trains its own batch (``fixed[i]``, a worker group's), the
    spec's ``batch_per_worker``, or ``DEFAULT_BATCH``. Raises SplitError where the total cannot be split."""
    total = planned_total(spec)
    if total is None:
        given = list(fixed) if fixed is not None else [None] * len(gpus)
        return [b or spec.training.batch or DEFAULT_BATCH for b in given]
    return split_total(spec, gpus, total, calibration, catalog, tables, steps)


def planned_total(spec: JobSpec) -> int | None:
    """The batch the rule splits over the workers: the spec's ``global_batch``; None: each worker trains its own
    batch (``batch_per_worker`` means each worker's, in both modes, as the payload's ORCHESTRATOR_LOCAL_BATCH_SIZE
    reads it: a split by speed is asked with ``global_batch``)."""
    return None if spec.training.global_batch is None else int(spec.training.global_batch)


def split_total(spec: JobSpec, gpus: Sequence[str], total: int, calibration: Calibration | None = None,
                catalog: Catalog | None = None, tables: TableFn | None = None, steps: StepModel | None = None
                ) -> list[int]:
    """``total`` split over GPU-workers: for a sync job by speed (fast GPUs get more), the slowest step made
    fastest under each GPU's memory cap (split.min_max_split over ``tables(gpu, longest)``: step times of
    batches 1..cap), or in proportion to the step model's own speeds where it has them (``split_speeds``: the
    local provider's emulated GPUs); an async job's workers do not wait for each other: evenly."""
    if spec.mode != TrainingMode.SYNC:
        return even_split(total, len(gpus))
    if len(gpus) > total:
        raise SplitError(f"global batch {total} is smaller than the {len(gpus)} workers; give each at least 1")
    speeds = (steps or COST_STEPS).split_speeds(gpus)
    if speeds is not None:  # e.g. emulated GPUs step at measured speeds, not the cost model's
        return proportional_split(total, speeds)
    table = tables or step_tables(spec, calibration, catalog or load_catalog())
    longest = max(1, total - len(gpus) + 1)
    by_gpu = {g: table(g, longest) for g in dict.fromkeys(gpus)}  # one array per GPU type: grouped in the split
    return min_max_split([by_gpu[g] for g in gpus], total)


def step_tables(spec: JobSpec, calibration: Calibration | None, catalog: Catalog) -> TableFn:
    """Step times of batches 1..min(memory cap, longest) on a GPU, for ``split_total``."""
    model, runtime, precision = spec.training.profile_name, job_runtime(spec.training), job_precision(spec.training)
    memory = memory_params(spec)

    def table(gpu: str, longest: int) -> FloatArray:
        cap = max_batch(model, gpu, catalog, memory)
        return step_fn(model, gpu, calibration, catalog, runtime, precision).table(max(0, min(cap, longest)))

    return table


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
