"""The local provider's backend: instances are work directories on this machine, reached without SSH."""

from __future__ import annotations

from orchestrator.clock import WALL, Clock
from orchestrator.model.availability import load_trace
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import LocalProvider as LocalSpec
from orchestrator.providers.base import Backend
from orchestrator.providers.local.provider import LocalProvider, progress_clock_for
from orchestrator.transport.local import LocalTransport


def cache_key(spec: LocalSpec, framework: str = "") -> str:
    # ``framework`` does not matter here: the payload runs with this machine's own libraries.
    traces = ",".join(f"{zone}={path}" for zone, path in sorted({**spec.traces, **{
        f"gpu {g}": p for g, p in spec.gpu_availability_traces.items()}}.items()))
    return f"local:{user_dir()}:{spec.time_scale}:{traces}:{spec.availability_start_tick}"


def build(key: str, spec: LocalSpec, framework: str = "", clock: Clock = WALL) -> Backend:
    # Every instance is this machine: one free port per slot, and a replacement keeps its slot's address.
    trace = None if spec.availability_trace is None else load_trace(spec.availability_trace)
    zones = {zone: load_trace(path) for zone, path in spec.zone_availability_traces.items()}
    gpus = {gpu: load_trace(path) for gpu, path in spec.gpu_availability_traces.items()}
    provider = LocalProvider(user_dir() / "local", time_scale=spec.time_scale, availability=trace,
                             start_tick=spec.availability_start_tick, zone_availability=zones, gpu_availability=gpus,
                             clock=clock)
    return Backend(key, provider, LocalTransport(clock),
                   fixed_task_port=None, request_metadata=progress_clock_for, clock=clock)
