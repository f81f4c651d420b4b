"""One accounting of a run's fixed costs, shared by the planner and the simulator.

A run without revocations takes

    boot (request -> instances up) + startup (up -> first step) + train_steps / rate
    + checkpoints x checkpoint pause + teardown (final checkpoint, evaluation, deletion)

and every instance is billed for all of it. The planner's failure-free time and the simulator's
``SimCluster`` delays both come from :func:`run_accounting`, so the two agree when nothing is revoked.

Cloud figures are ``core.policy``'s constants, read from ``data/cloud_facts.csv`` (ICAC'19: 70 s boot, 15 s
more for preemptible, 3.75 s + 0.02 s/MB a checkpoint), the same ones the daemon and the simulator use.
The local provider boots in ``boot / time_scale`` and its steps cost this host's CPU time plus the
emulated GPU's sleep (``orchestrator.core.emulation``, measured curves); the host's figures are measured
by the project (``data/local_host.csv``, with the command that measured them).
"""

from __future__ import annotations

import csv
import functools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from orchestrator.core import policy
from orchestrator.core.catalog import Catalog
from orchestrator.core.costmodel.compute import Calibration
from orchestrator.core.costmodel.host_share import shared_steps
from orchestrator.core.costmodel.profiles import get_profile
from orchestrator.core.emulation import emulation_sleep
from orchestrator.core.paths import data_dir
from orchestrator.core.spec import JobSpec, validate_spec


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
    spec: JobSpec, catalog: Catalog | None = None, calibration: Calibration | None = None, as_cloud: bool = False
) -> RunAccounting:
    """``as_cloud``: a local spec accounted as the cloud cluster it emulates. (``catalog`` is unused: the
    timings are ``core.policy``'s; kept for callers.)"""
    provider = spec.provider
    if provider.emulates_gpus and not as_cloud:
        host = local_host(calibration)
        return RunAccounting(policy.BOOT_S / provider.time_scale, 0.0, host["startup_s"], host["checkpoint_s"],
                             host["teardown_s"])
    ckpt = policy.checkpoint_s(checkpoint_mb(spec.training.profile_name))
    extra = policy.SPOT_EXTRA_BOOT_S if provider.is_cloud or as_cloud else 0.0
    return RunAccounting(policy.BOOT_S, extra, 0.0, ckpt, 0.0)


def local_cpu_step_s(model: str, batch: int, host: Mapping[str, float] | None = None) -> float:
    """This host's CPU seconds of one worker step with the emulation off, scaled from the measured
    model and batch by forward FLOPs x batch (plus the measured fixed part)."""
    h = host or local_host()
    ref = get_profile("resnet_cifar_15").flops * h["cpu_step_batch"]
    work = get_profile(model).flops * batch
    return h["cpu_step_fixed_s"] + (h["cpu_step_s"] - h["cpu_step_fixed_s"]) * work / ref


def local_worker_steps(
    spec: JobSpec, gpus: Sequence[str], batches: Sequence[int], calibration: Calibration | None = None
) -> list[float]:
    """Seconds a step of each local worker takes: CPU work (shared by every worker on this host's
    cores: ``host_share``) plus the emulated GPU's sleep."""
    host = local_host(calibration)
    sleep = emulation_sleep(spec)
    model = spec.training.profile_name
    cpu = [local_cpu_step_s(model, b, host) for b in batches]
    naps = [sleep(g, b) for g, b in zip(gpus, batches, strict=True)]
    return shared_steps(cpu, naps, float(host.get("cores", os.cpu_count() or 1)))


def fit_local_host(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """This host's figures from finished local jobs (``store.queries.local_run_timings``): the CPU step
    (reference model and batch) that best explains the workers' measured steps given their emulated
    sleeps, and the median start-up and teardown."""
    host = dict(_host_file())
    cases = []
    startups, teardowns = [], []
    for run in runs:
        spec = validate_spec(yaml.safe_load(run["spec_yaml"]))
        sleep = emulation_sleep(spec)
        ws = run["workers"]
        unit = [local_cpu_step_s(spec.training.profile_name, w["batch"], {**host, "cpu_step_s": 1.0,
                                                                           "cpu_step_fixed_s": 0.0}) for w in ws]
        naps = [sleep(w["gpu"], w["batch"]) for w in ws]
        cases.append((unit, naps, [w["step_time_s"] for w in ws]))
        rate = sum(1.0 / w["step_time_s"] for w in ws)
        first_steps = 10.0 / rate  # the first logged step is step 10 (log_every)
        boot = policy.BOOT_S / spec.provider.time_scale if spec.provider.emulates_gpus else 0.0
        startups.append(run["first_step_at"] - run["created_at"] - boot - first_steps)
        teardowns.append(run["ended_at"] - run["last_step_at"])
    if not cases:
        raise ValueError("no finished local job with worker step times in the results DB")
    cores = host.get("cores", 1.0)

    def loss(c_ref: float) -> float:
        return sum(math.log(p / m) ** 2 for unit, naps, meas in cases
                   for p, m in zip(shared_steps([u * c_ref for u in unit], naps, cores), meas, strict=True))

    from scipy.optimize import minimize_scalar  # lazy: SciPy only for this fit, never to plan

    best = minimize_scalar(loss, bounds=(1e-3, 10.0), method="bounded")
    return {"cpu_step_s": float(best.x), "cpu_step_fixed_s": 0.0, "startup_s": float(np.median(startups)),
            "teardown_s": float(np.median(teardowns)), "jobs": float(len(cases))}


__all__ = ["RunAccounting", "fit_local_host", "local_cpu_step_s", "local_host", "local_worker_steps", "run_accounting"]
