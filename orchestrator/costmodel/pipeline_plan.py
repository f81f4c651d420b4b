"""The pipeline a built-in PyTorch job runs (``training.parallelism: pipeline``): its stages, from the partitioner.

On real GPUs the partitioner sizes stages by the cost model's per-layer times; on a wall-clock step model (the local
provider's emulated GPUs) by its emulated step (``emulated_s``: measured curves, ``providers.local.emulation``) and
this host's CPU step (``data/local_host.csv``), each spread over the layers by FLOPs, so the stages fit the speeds
the run will really have. The stages' layer ranges are turned into the payload's module ranges
(jobs/torchjob/model.py's flat ResNet: stem conv, BN, ReLU; one module per block; pool, flatten, linear).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.costmodel.accounting import local_host
from orchestrator.costmodel.batches import job_precision, job_runtime, memory_params
from orchestrator.costmodel.compute import Calibration
from orchestrator.costmodel.partition import Partition, Partitioner, StageDevice, flop_shares, local_layer_s, units
from orchestrator.costmodel.profiles import get_profile
from orchestrator.costmodel.stepmodel import COST_STEPS, StepModel
from orchestrator.model.catalog import Catalog, load_catalog
from orchestrator.model.spec import JobSpec

BACKWARD_SHARE = 2.0 / 3.0  # of a layer's training time: backward is about twice the forward


@dataclass(frozen=True)
class PipelinePlan:
    stage_slots: tuple[int, ...]  # worker slot indices in stage order
    modules: tuple[tuple[int, int], ...]  # the payload's module range per stage
    micro_batches: int
    stage_sleep: tuple[tuple[float, float], ...]  # local: each stage's forward / backward sleep per micro-batch
    partition: Partition

    @property
    def step_s(self) -> float:
        return self.partition.step_s


def resnet_module_starts(model: str) -> list[int]:
    """The flat ResNet's first module of each profile unit: stem -> 0, block u -> 2 + u, pool -> 3n + 3,
    logits (with the loss) -> 3n + 5 (3n blocks; the stem is conv, BN, ReLU; pool and flatten are two modules)."""
    count = len(units_of(model))  # stem, the blocks, gap, logits
    blocks = count - 3
    return [0, *(2 + u for u in range(1, blocks + 1)), blocks + 3, blocks + 5]


def units_of(model: str) -> list[int]:
    return units(get_profile(model))


def partitioner_for(spec: JobSpec, calibration: Calibration | None = None, catalog: Catalog | None = None,
                    steps: StepModel | None = None) -> Partitioner:
    """The partitioner of the spec's model: the cost model's layer times, or on a wall-clock step model (the local
    provider's) its emulated GPUs' curves and this host's CPU step; memory with the spec's optimizer."""
    model = spec.training.profile_name
    chosen = steps or COST_STEPS
    layer_s = None
    if chosen.wall_clock:
        host = local_host(calibration)
        cpu_per_example = host["torch_cpu_step_s"] / host["torch_cpu_step_batch"]
        layer_s = local_layer_s(model, chosen.emulated_s, lambda b: cpu_per_example * b)
    return Partitioner(model, calibration, catalog or load_catalog(), memory_params(spec), layer_s=layer_s,
                       runtime=job_runtime(spec.training), precision=job_precision(spec.training))


def stage_devices(cat: Catalog, gpus: Sequence[str], machines: Sequence[str]) -> list[StageDevice]:
    return [StageDevice(gpu, machine, 1, _egress(cat, machine)) for gpu, machine in zip(gpus, machines, strict=True)]


def plan_pipeline(spec: JobSpec, workers: Sequence[tuple[int, str, str]], global_batch: int,
                  calibration: Calibration | None = None, catalog: Catalog | None = None,
                  steps: StepModel | None = None) -> PipelinePlan | None:
    """``workers``: (slot index, GPU, machine type) of each worker slot; ``steps``: the job's step model (an
    emulated GPU's stage sleeps its share of the emulated step). None when no order fits in memory."""
    model = spec.training.profile_name
    cat = catalog or load_catalog()
    chosen = steps or COST_STEPS
    part = partitioner_for(spec, calibration, cat, chosen)
    devices = stage_devices(cat, [g for _, g, _ in workers], [m for _, _, m in workers])
    if getattr(spec.training, "partition", "mini-max") == "equal-layers":
        found: Partition | None = part.equal_layers(devices, global_batch)
    else:
        found = part.best(devices, global_batch)
    if found is None:
        return None
    slot_of = {id(d): s for d, (s, _, _) in zip(devices, workers, strict=True)}
    starts = resnet_module_starts(model)
    unit_of_layer = {layer: u for u, layer in enumerate(part.cuts)}
    module_bounds = [starts[unit_of_layer[i]] for i in found.starts] + [starts[-1] + 1]
    shares = flop_shares(model)
    sleep = []
    for d, (i, j) in zip(found.devices, found.layer_ranges(), strict=True):
        s = chosen.emulated_s(d.gpu, found.micro_batch) * float(shares[i:j].sum())
        sleep.append((round(s * (1 - BACKWARD_SHARE), 5), round(s * BACKWARD_SHARE, 5)))
    return PipelinePlan(stage_slots=tuple(slot_of[id(d)] for d in found.devices),
                        modules=tuple(zip(module_bounds[:-1], module_bounds[1:], strict=True)),
                        micro_batches=found.micro_batches, stage_sleep=tuple(sleep), partition=found)


def _egress(cat: Catalog, machine: str) -> float:
    return cat.machine_type(machine).egress_gbps if machine in cat.machine_types else 16.0
