"""One accounting of a run's fixed costs, shared by the planner and the simulator.

A run without revocations takes

    boot (request -> instances up) + startup (up -> first step) + train_steps / rate
    + checkpoints x checkpoint pause + teardown (final checkpoint, evaluation, deletion)

and every instance is billed for all of it. The planner's failure-free time and the simulator's
``SimCluster`` delays both come from :func:`run_accounting`, so the two agree when nothing is revoked.

Cloud figures are ``decide.deadline``'s constants, read from ``data/cloud_facts.csv`` (ICAC'19: 70 s boot, 15 s
more for preemptible, 3.75 s + 0.02 s/MB a checkpoint), the same ones the daemon and the simulator use.
A job whose step model runs on the wall clock (the local provider's emulated GPUs,
``providers.local.step_model.EmulatedStep``) boots in ``boot / time_scale`` and its steps cost this host's CPU time
plus the emulated GPU's sleep (the step model's ``sleep_s``, measured curves); the host's figures are measured by
the project (``data/local_host.csv``, with the command that measured them).
"""

from __future__ import annotations

import csv
import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from orchestrator.costmodel.compute import Calibration, runtime_key
from orchestrator.costmodel.host_share import lockstep_steps, shared_steps
from orchestrator.costmodel.job_runtime import job_precision, job_runtime
from orchestrator.costmodel.measured import measured_at
from orchestrator.costmodel.profiles import get_profile
from orchestrator.costmodel.stepmodel import COST_STEPS, StepModel
from orchestrator.model import timings
from orchestrator.model.catalog import Catalog
from orchestrator.model.paths import data_dir
from orchestrator.model.spec import JobSpec, TrainingMode, validate_spec
from orchestrator.model.torch_spec import is_pytorch, replica_groups


@dataclass(frozen=True)
class RunAccounting:
    boot_s: float
    spot_extra_boot_s: float
    startup_s: float
    checkpoint_s: float
    teardown_s: float

    @staticmethod
    def checkpoints(train_steps: int, every: int) -> int:
        """Checkpoints written below the last step (the final one is in the teardown)."""
        return max(math.ceil(train_steps / max(every, 1)) - 1, 0)

    def failure_free_s(self, train_steps: int, every: int, rate: float, spot_critical: bool = False) -> float:
        if not rate > 0:
            return math.inf
        boot = self.boot_s + (self.spot_extra_boot_s if spot_critical else 0.0)
        pauses = self.checkpoints(train_steps, every) * self.checkpoint_s
        return boot + self.startup_s + train_steps / rate + pauses + self.teardown_s


@functools.cache
def _host_file() -> dict[str, float]:
    with (data_dir() / "local_host.csv").open(newline="") as fh:
        return {r["key"]: float(r["value"]) for r in csv.DictReader(fh)}


def local_host(calibration: Calibration | None = None) -> dict[str, float]:
    """This host's measured figures (data/local_host.csv: key,value,unit,source,method), refined by an
    emulated calibration fitted on earlier local jobs (``orchestrator model calibrate --from-db``)."""
    return {**_host_file(), **(dict(calibration.local_host) if calibration is not None else {})}


def checkpoint_mb(model: str) -> float:
    try:
        return float(get_profile(model).param_bytes) / 1e6
    except LookupError:
        return 2.0


def run_accounting(
    spec: JobSpec, catalog: Catalog | None = None, calibration: Calibration | None = None, as_cloud: bool = False,
    steps: StepModel | None = None,
) -> RunAccounting:
    """``steps``: the job's step model (a wall-clock one, the local provider's emulated GPUs: this host's figures);
    ``as_cloud``: such a job accounted as the cloud cluster it emulates. (``catalog`` is unused: the timings are
    ``decide.deadline``'s; kept for callers.)"""
    provider = spec.provider
    chosen = steps or COST_STEPS
    if chosen.wall_clock and not as_cloud:
        host = local_host(calibration)
        prefix = CPU_REFERENCE[cpu_framework(spec)][1]
        startup = host.get(f"{prefix}startup_s", host["startup_s"])
        checkpoint = host.get(f"{prefix}checkpoint_s", host["checkpoint_s"])
        return RunAccounting(timings.BOOT_S / chosen.time_scale, 0.0, startup, checkpoint, host["teardown_s"])
    ckpt = timings.checkpoint_s(checkpoint_mb(spec.training.profile_name))
    extra = timings.SPOT_EXTRA_BOOT_S if provider.is_cloud or as_cloud else 0.0
    # A gce VM's first boot also gets its driver and libraries from its image route (DLVM, installer, ...).
    return RunAccounting(timings.BOOT_S + timings.gce_boot_extra_s(spec), extra, 0.0, ckpt, 0.0)


def restore_s(spec: JobSpec, accounting: RunAccounting, wall_clock: bool) -> float:
    """What a change of a synchronous world costs every rank, for the planner and the simulator alike: a quorum's
    pause on torchft replica groups; else a restart, as measured on this host (``wall_clock``: emulated GPUs, run as
    the local run) or, in the cloud, a PyTorch world's start-up and warm-up (timings.TORCH_WORLD_RESTART_S)."""
    if replica_groups(spec):
        return timings.TORCHFT_PAUSE_S
    if wall_clock or not is_pytorch(spec):
        return accounting.startup_s
    return timings.TORCH_WORLD_RESTART_S


# The measured reference step of each framework's CPU payload (data/local_host.csv keys, prefixed): the
# TF job's ResNet-15 and the PyTorch job's ResNet-8 ("resnet_tiny"); a framework never measured falls
# back to TF's. PyTorch's CPU convolutions and gloo all-reduce cost several times TF's per FLOP here.
CPU_REFERENCE = {"tensorflow": ("resnet_cifar_15", ""), "pytorch": ("resnet_tiny", "torch_")}


def cpu_framework(spec: JobSpec) -> str:
    return "pytorch" if getattr(spec.training, "framework", "tensorflow") == "pytorch" else "tensorflow"


def local_cpu_step_s(model: str, batch: int, host: Mapping[str, float] | None = None,
                     framework: str = "tensorflow") -> float:
    """This host's CPU seconds of one worker step with the emulation off, scaled from the framework's
    measured model and batch by forward FLOPs x batch (plus the measured fixed part)."""
    h = host or local_host()
    ref_model, prefix = CPU_REFERENCE.get(framework, CPU_REFERENCE["tensorflow"])
    if f"{prefix}cpu_step_s" not in h:
        ref_model, prefix = CPU_REFERENCE["tensorflow"]
    step, fixed = h[f"{prefix}cpu_step_s"], h.get(f"{prefix}cpu_step_fixed_s", 0.0)
    ref = get_profile(ref_model).flops * h[f"{prefix}cpu_step_batch"]
    return fixed + (step - fixed) * get_profile(model).flops * batch / ref


def _host_steps(cpu: Sequence[float], naps: Sequence[float], cores: float, sync: bool,
                background: float = 0.0) -> list[float]:
    return lockstep_steps(cpu, naps, cores, background) if sync else shared_steps(cpu, naps, cores, background)


def local_worker_steps(
    spec: JobSpec, gpus: Sequence[str], batches: Sequence[int], calibration: Calibration | None = None, *,
    steps: StepModel,
) -> list[float]:
    """Seconds a step of each local worker takes: CPU work (shared by every worker on this host's
    cores, and with the host's other work: ``host_share``, in lockstep for synchronous training) plus the
    emulated GPU's sleep (``steps.sleep_s``: the job's step model, the local provider's emulation)."""
    host = local_host(calibration)
    sleep = steps.sleep_s
    model, framework = spec.training.profile_name, cpu_framework(spec)
    naps = [sleep(g, b) for g, b in zip(gpus, batches, strict=True)]
    cpu = [local_cpu_step_s(model, b, host, framework) for b in batches]
    # a probe of this point timed the worker alone on the host: its CPU part is the step less the emulated sleep
    rt = runtime_key(job_runtime(spec.training), job_precision(spec.training))
    probed = [measured_at(calibration, g, rt, model, b) for g, b in zip(gpus, batches, strict=True)]
    cpu = [c if p is None else max(0.0, p.step_s - n) for c, p, n in zip(cpu, probed, naps, strict=True)]
    # "background": other runnable processes on the host, measured at plan / launch time (planning/host_load.py)
    return _host_steps(cpu, naps, float(host.get("cores", os.cpu_count() or 1)), spec.mode == TrainingMode.SYNC,
                       host.get("background", 0.0))


def fit_local_host(runs: Sequence[Mapping[str, Any]], steps_for: Callable[[JobSpec], StepModel]
                   ) -> dict[str, float]:
    """This host's figures from finished local jobs (``store.queries.local_run_timings``): per framework,
    the CPU step (reference model and batch) that best explains the workers' measured steps given their
    emulated sleeps (``steps_for(spec)``: each job's step model, ``providers.local.step_model.step_model_for``),
    and the median start-up and teardown."""
    host = dict(_host_file())
    cases: dict[str, list[tuple[list[float], list[float], list[float], bool]]] = {}
    startups: dict[str, list[float]] = {}
    teardowns: list[float] = []
    for run in runs:
        spec = validate_spec(yaml.safe_load(run["spec_yaml"]))
        steps = steps_for(spec)
        sleep = steps.sleep_s
        ws, framework, sync = run["workers"], cpu_framework(spec), spec.mode == TrainingMode.SYNC
        prefix = CPU_REFERENCE[framework][1]
        unit_host = {**host, f"{prefix}cpu_step_s": 1.0, f"{prefix}cpu_step_fixed_s": 0.0,
                     f"{prefix}cpu_step_batch": host.get(f"{prefix}cpu_step_batch", 32.0)}
        unit = [local_cpu_step_s(spec.training.profile_name, w["batch"], unit_host, framework) for w in ws]
        naps = [sleep(w["gpu"], w["batch"]) for w in ws]
        measured = [w["step_time_s"] for w in ws]
        cases.setdefault(framework, []).append((unit, naps, measured, sync))
        rate = 1.0 / max(measured) if sync else sum(1.0 / t for t in measured)
        first_steps = 10.0 / rate  # the first logged step is step 10 (log_every)
        boot = timings.BOOT_S / steps.time_scale if steps.wall_clock else 0.0
        startups.setdefault(framework, []).append(run["first_step_at"] - run["created_at"] - boot - first_steps)
        teardowns.append(run["ended_at"] - run["last_step_at"])
    if not cases:
        raise ValueError("no finished local job with worker step times in the results DB")
    cores = host.get("cores", 1.0)
    out = {"teardown_s": float(np.median(teardowns)), "jobs": float(len(runs))}
    for framework, fcases in cases.items():
        prefix = CPU_REFERENCE[framework][1]
        out[f"{prefix}cpu_step_s"], out[f"{prefix}cpu_step_fixed_s"] = _fit_cpu_step(fcases, cores), 0.0
        out[f"{prefix}cpu_step_batch"] = host.get(f"{prefix}cpu_step_batch", 32.0)
        out[f"{prefix}startup_s"] = float(np.median(startups[framework]))
    return out


def _fit_cpu_step(cases: Sequence[tuple[list[float], list[float], list[float], bool]], cores: float) -> float:
    """The reference CPU step that makes the host model's steps closest (in log) to the measured ones; a
    synchronous step is compared as the cluster's step (its slowest worker)."""
    def loss(c_ref: float) -> float:
        total = 0.0
        for unit, naps, meas, sync in cases:
            pred = _host_steps([u * c_ref for u in unit], naps, cores, sync)
            pairs = [(max(pred), sum(meas) / len(meas))] if sync else list(zip(pred, meas, strict=True))
            total += sum(math.log(p / m) ** 2 for p, m in pairs)
        return total

    from scipy.optimize import minimize_scalar  # lazy: SciPy only for this fit, never to plan

    return float(minimize_scalar(loss, bounds=(1e-3, 10.0), method="bounded").x)


__all__ = [
    "CPU_REFERENCE", "RunAccounting", "cpu_framework", "fit_local_host", "local_cpu_step_s", "local_host",
    "local_worker_steps", "run_accounting",
]
