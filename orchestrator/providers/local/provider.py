"""The `local` provider: an instance is a work directory (its disk) plus an emulated-cloud process.

Spot instances are revoked at the time the controller drew for them (``InstanceRequest.revoke_after_s``):
the instance goes "stopping", a notice is written where the request's ``notice-file`` metadata says (as
GCE's shutdown script would), and after the notice window its processes are killed.

That time is measured on the job's *progress clock* when the request carries one (``progress-step-s``
metadata: nominal wall seconds per global training step, from the emulated GPUs' step times): the
instance is revoked when the job's ``metrics.jsonl`` reaches the step that lifetime stands for, not after
so many wall seconds. A loaded machine trains more slowly but is revoked at the same steps, so a seed gives
the same revocations run after run. A replacement's lifetime counts from the step its predecessor was
revoked at (a deterministic chain), not from when the controller got round to creating it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orchestrator
from orchestrator.clock import WALL, Clock
from orchestrator.costmodel.slots import DEFAULT_BATCH, Slot
from orchestrator.model import timings
from orchestrator.model.availability import AvailabilityTrace
from orchestrator.model.cloud_errors import CapacityError
from orchestrator.model.instances import (
    LABEL_JOB,
    REVOKE_AT_STEP,
    InstanceRequest,
    ObservedInstance,
    ObservedState,
    Role,
    instance_name,
)
from orchestrator.model.spec import JobSpec, RevocationMode, TrainingMode
from orchestrator.providers.base import Provider, SupportsSpotCapacity
from orchestrator.providers.local.processes import (
    all_processes,
    end,
    host_argv,
    host_dir,
    hosts_of,
    inside,
    is_host_of,
    running_in,
)
from orchestrator.providers.local.progress import max_step
from orchestrator.storage.base import METRICS
from orchestrator.transport.local import payload_base_env, spawn_detached

PROGRESS_STEP_S = "progress-step-s"
STATE, HOST_PID, CREATE_LOCK = "instance.json", "hypervisor.pid", ".create.lock"
SPAWN_GRACE_S = 30.0  # a state without a hypervisor after this long: its create died before starting one
NOTICE_MIN_S = 2.0  # wall seconds: a scaled 30 s window still leaves the chief time to checkpoint

_STATES = {"provisioning": ObservedState.PENDING, "running": ObservedState.RUNNING,
           "stopping": ObservedState.STOPPING, "terminated": ObservedState.TERMINATED}


class LocalProvider(Provider, SupportsSpotCapacity):
    name = "local"

    def __init__(self, root: Path, *, time_scale: float = 1.0, boot_delay_cloud_s: float = timings.BOOT_S,
                 notice_window_cloud_s: float = timings.NOTICE_WINDOW_S, availability: AvailabilityTrace | None = None,
                 start_tick: int = 0, zone_availability: Mapping[str, AvailabilityTrace] | None = None,
                 gpu_availability: Mapping[str, AvailabilityTrace] | None = None, clock: Clock = WALL,
                 hosts: ProcessHosts | None = None) -> None:
        self.clock = clock
        # How each instance's emulated host runs: a detached process (the default), or, on a virtual clock, a
        # thread that takes part in it (tests/fastforward.py).
        self.hosts = hosts or ProcessHosts()
        self.root = root.absolute() / "instances"  # absolute: a hypervisor's command line names its folder
        self.root.mkdir(parents=True, exist_ok=True)
        self._tombs = self.root.parent / "deleted"
        self._aside = self.root.parent / "deleting"  # folders a delete moved aside, until it removed them
        self.time_scale = time_scale
        # Replayed spot capacity, by zone (one trace: every zone's): stockouts and revocations at its ticks. The
        # traces share one tick length (spec validation), so the first one's is the replay's pace.
        self.traces = dict(zone_availability or {})
        self.availability = availability or next(iter(self.traces.values()), None)
        self.gpu_traces = dict(gpu_availability or {})  # another GPU type's instances replay its own (also_gpus)
        self.start_tick = start_tick
        self.boot_delay_s = boot_delay_cloud_s / time_scale
        self.notice_window_s = max(NOTICE_MIN_S, notice_window_cloud_s / time_scale)

    def _dir(self, name: str) -> Path:
        return self.root / name

    def create(self, request: InstanceRequest) -> None:
        """Crash-safe at every line: the folder and its state come first, so that a delete (of any process)
        finds the instance before its hypervisor can exist; the hypervisor's command line names the folder (its
        identity) and it exits once the folder is gone; and a create resent after its sender died finishes the
        first one's (its hypervisor started once, whoever started it)."""
        d = self._dir(request.name)
        if (d / HOST_PID).exists():
            return  # deterministic name: the instance exists already
        state = None if (d / STATE).exists() else self._new_state(request, d)  # a stockout refuses here
        for _ in range(3):  # the sweep may remove a folder a killed create left without a state as we fill it
            if state is not None:
                (d / "disk").mkdir(parents=True, exist_ok=True)
            try:
                with _create_lock(d):
                    if not (d / STATE).exists():
                        if state is None:
                            return  # deleted since we looked: the delete wins
                        _write_atomic(d / STATE, state)  # before the hypervisor can exist
                    elif self.hosts.started(d):
                        return  # an earlier create started it (maybe one that died before writing its pid)
                    pid = self.hosts.start(d)
                    (d / HOST_PID).write_text(str(pid))
                    return
            except FileNotFoundError:
                if state is None:
                    return  # deleted as we finished its create: the delete wins (a hypervisor started exits)

    def _new_state(self, request: InstanceRequest, d: Path) -> dict[str, Any]:
        now = self.clock.time()
        trace_revoke_at = self._trace_revoke_at(request, now)
        state: dict[str, Any] = {
            "name": request.name, "labels": request.all_labels(), "role": request.role.value,
            "index": request.index, "generation": request.generation, "zone": request.zone,
            "gpu": request.gpu, "spot": request.spot, "machine_type": request.machine_type,
            "created_at": now, "boot_delay_s": self.boot_delay_s, "notice_window_s": self.notice_window_s,
            "revoke_at": None if request.revoke_after_s is None or not request.spot else now + request.revoke_after_s,
            "notice_files": [request.metadata["notice-file"]] if "notice-file" in request.metadata else [],
            "state": "provisioning", "preempted": False, "workdir": str(d / "disk"),
        }
        if state["revoke_at"] is not None:
            state.update(self._progress_clock(request))
        state.update(self._scheduled_step(request))
        if trace_revoke_at is not None:
            state["revoke_at"], state["spot_rank"] = trace_revoke_at
        return state

    def _tick(self, job_id: str, now: float) -> int:
        """The replayed trace's tick now: from the job's first create or capacity probe, gap / time_scale."""
        assert self.availability is not None
        origin_file = self.root.parent / "availability" / job_id
        try:
            origin = float(origin_file.read_text())
        except (OSError, ValueError):
            origin_file.parent.mkdir(parents=True, exist_ok=True)
            origin_file.write_text(repr(now))
            origin = now
        return self.start_tick + int((now - origin) * self.time_scale / self.availability.gap_s)

    def _tick_at(self, job_id: str, tick: int) -> float:
        assert self.availability is not None
        origin = float((self.root.parent / "availability" / job_id).read_text())
        return origin + (tick - self.start_tick) * self.availability.gap_s / self.time_scale

    def _trace(self, zone: str, gpu: str | None) -> AvailabilityTrace | None:
        """The trace replayed for ``gpu`` in ``zone``: the GPU type's own where it has one, else the zone's where
        each zone has one, else the one trace."""
        if gpu is not None and gpu in self.gpu_traces:
            return self.gpu_traces[gpu]
        return self.traces.get(zone) if self.traces else self.availability

    def spot_capacity(self, job_id: str, slots: Sequence[Slot] = ()) -> bool | None:
        """Whether a spot VM of ``slots`` could be had now (in any zone, where each replays its own trace; the
        trace of their GPU type where it has one); None without a trace (unknown)."""
        gpu = next((s.gpu for s in slots if s.gpu in self.gpu_traces), None)
        if gpu is not None:
            return self.gpu_traces[gpu].count_at(self._tick(job_id, self.clock.time())) >= 1
        by_zone = self.spot_capacity_by_zone(job_id, slots)
        if by_zone is not None:
            return any(by_zone.values())
        if self.availability is None:
            return None
        return self.availability.count_at(self._tick(job_id, self.clock.time())) >= 1

    def spot_capacity_by_zone(self, job_id: str, slots: Sequence[Slot] = ()) -> dict[str, bool] | None:
        """Each zone's replayed trace now (``provider.zone_availability_traces``); None with one trace or none."""
        if not self.traces:
            return None
        tick = self._tick(job_id, self.clock.time())
        return {zone: trace.count_at(tick) >= 1 for zone, trace in self.traces.items()}

    def spot_capacity_count(self, job_id: str, slots: Sequence[Slot] = ()) -> int | None:
        """How many spot VMs could be had now, where one trace is replayed for every zone and the slots' GPU type
        (a 16-node trace counts up to 16); None where zones or GPU types replay traces of their own."""
        if self.availability is None or self.traces or any(s.gpu in self.gpu_traces for s in slots):
            return None
        return self.availability.count_at(self._tick(job_id, self.clock.time()))

    def _trace_revoke_at(self, request: InstanceRequest, now: float) -> tuple[float, int] | None:
        """A spot create in a stockout of the replayed trace (of its zone) is refused; else when the trace revokes
        it, and its rank. The job's spot VMs on one trace hold ranks 1, 2, ...: a new one takes the lowest free
        rank, is refused while the trace has fewer VMs than that, and is revoked once it has (a 16-node trace's
        drop from 3 to 1 revokes the VMs of ranks 2 and 3)."""
        trace = self._trace(request.zone, request.gpu)
        if trace is None or not request.spot:
            return None
        tick = self._tick(request.job_id, now)
        taken = self._ranks_taken(request.job_id, trace, now)
        rank = next(r for r in range(1, len(taken) + 2) if r not in taken)
        if trace.count_at(tick) < rank:
            raise CapacityError(f"no spot capacity (availability trace {trace.name}, tick {tick}: "
                                f"{trace.count_at(tick)} spot VMs, {len(taken)} held by the job)",
                                zone=request.zone, resource=request.gpu or "cpu")
        drop = trace.next_drop(tick, rank)
        return self._tick_at(request.job_id, drop if drop is not None else len(trace.counts)), rank

    def _ranks_taken(self, job_id: str, trace: AvailabilityTrace, now: float) -> set[int]:
        """The ranks of the job's spot VMs on ``trace`` that are not revoked by ``now``."""
        taken = set()
        for path in self.root.glob("*/instance.json"):
            try:
                st = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if (st["labels"].get(LABEL_JOB) == job_id and st.get("spot_rank") and not st.get("preempted")
                    and st["state"] != "terminated" and (st["revoke_at"] is None or st["revoke_at"] > now)
                    and self._trace(st["zone"], st.get("gpu")) is trace):
                taken.add(int(st["spot_rank"]))
        return taken

    def _progress_clock(self, request: InstanceRequest) -> dict[str, Any]:
        """The step at which to revoke (see the module doc), or {} to stay on the wall clock."""
        step_s = float(request.metadata.get(PROGRESS_STEP_S, 0) or 0)
        notice = request.metadata.get("notice-file")
        if step_s <= 0 or not notice or request.revoke_after_s is None:
            return {}
        metrics = _metrics_file(notice)
        base = progress_step(metrics)
        if request.generation > 0:
            prev = self.history(instance_name(request.job_id, request.role, request.index, request.generation - 1))
            if prev is not None and prev.get("revoke_at_step") is not None:
                base = int(prev["revoke_at_step"])
        return {"metrics_file": str(metrics), "progress_step_s": step_s, "base_step": base,
                "revoke_at_step": base + max(1, round(request.revoke_after_s / step_s))}

    @staticmethod
    def _scheduled_step(request: InstanceRequest) -> dict[str, Any]:
        """A schedule's ``at_step``: revoked when the job's metrics reach that step (however slow the host)."""
        step = request.metadata.get(REVOKE_AT_STEP)
        notice = request.metadata.get("notice-file")
        if step is None or not notice or not request.spot:
            return {}
        return {"metrics_file": str(_metrics_file(notice)), "revoke_at_step": int(step)}

    def delete(self, name: str, zone: str) -> None:
        """Record the deletion (the tombstone), move the folder aside (its hypervisor, seeing it gone, exits by
        itself, and nothing new starts in it), end every process of the instance, then remove the folder.
        A delete killed half-way is finished by the next delete of the name or by ``sweep_strays``."""
        d = self._dir(name)
        for aside in sorted(self._aside.glob(f"{name}.*")):
            self.hosts.end_and_remove(aside, None)  # an earlier delete of it that was killed half-way
        if not d.exists():
            return  # not found is success
        state = self._state(d)
        if state is not None:  # kept for benchmarks and post-mortems (notice, kill and deletion times)
            state["deleted_at"] = self.clock.time()
            self._tombs.mkdir(exist_ok=True)
            _write_atomic(self._tombs / f"{name}.json", state)
        recorded = self.hosts.recorded(d, state)
        self._aside.mkdir(exist_ok=True)
        aside = self._aside / f"{name}.{uuid.uuid4().hex[:8]}"
        try:
            d.rename(aside)
        except FileNotFoundError:
            return  # another delete moved it first
        self.hosts.end_and_remove(aside, (d, recorded))

    @staticmethod
    def _state(d: Path) -> dict[str, Any] | None:
        try:
            state: dict[str, Any] = json.loads((d / STATE).read_text())
            return state
        except (OSError, json.JSONDecodeError):
            return None

    def sweep_strays(self, min_age_s: float = SPAWN_GRACE_S) -> list[str]:
        """End what a crash left where no listing shows it; one line per thing ended. Hypervisors whose
        folder is gone (one that did not exit by itself: stopped, or of an older version), processes running
        in a removed instance folder, folders a delete moved aside and never removed, and folders a create
        left before writing the instance's state (older than ``min_age_s``: not one being created now)."""
        done: list[str] = []
        procs = all_processes()
        root, aside_root = os.path.realpath(self.root), os.path.realpath(self._aside)
        strays = []
        for p in procs:
            folder = host_dir(p)
            if folder is not None and os.path.realpath(folder.parent) == root and not (folder / STATE).exists():
                strays.append(p)
                done.append(f"pid {p.pid}: the hypervisor of {folder.name}, whose folder is gone")
            elif (p.removed and inside(p, root)) or inside(p, aside_root):
                strays.append(p)
                done.append(f"pid {p.pid}: {' '.join(p.argv)[:80]}, running in the removed folder {p.cwd}")
        end([p.pid for p in strays])
        for aside in sorted(self._aside.glob("*")) if self._aside.is_dir() else []:
            self.hosts.end_and_remove(aside, None)
            done.append(f"{aside.name}: the folder of a delete that did not finish, removed")
        for d in sorted(self.root.iterdir()):
            with contextlib.suppress(OSError):
                if not (d / STATE).exists() and self.clock.time() - d.stat().st_mtime > min_age_s:
                    self.hosts.end_and_remove(d, None)
                    done.append(f"{d.name}: the folder of a create that did not finish, removed")
        return done

    def list(self, job_ids: Collection[str] | None = None) -> list[ObservedInstance]:
        wanted = set(job_ids) if job_ids is not None else None
        out: list[ObservedInstance] = []
        for path in self.root.glob("*/instance.json"):
            try:
                st = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # being written or deleted right now
            labels = st["labels"]
            if wanted is not None and labels.get(LABEL_JOB) not in wanted:
                continue
            state = _STATES[st["state"]]
            alive = self.hosts.alive(path.parent, st, self.clock.time())
            if state in (ObservedState.PENDING, ObservedState.RUNNING) and not alive:
                state = ObservedState.TERMINATED  # the emulated host died under us
            out.append(ObservedInstance(
                name=st["name"], job_id=labels[LABEL_JOB], role=Role(st["role"]), index=st["index"],
                generation=st["generation"], zone=st["zone"], state=state, provider_id=str(path.parent),
                host="127.0.0.1", workdir=st["workdir"], preempted=bool(st.get("preempted")), gpu=st.get("gpu"),
                spot=bool(st["spot"]), labels=dict(labels),
            ))
        return out

    def history(self, name: str) -> dict[str, Any] | None:
        """The emulated cloud's record of an instance, live or deleted: created, notice, kill times."""
        for path in (self._dir(name) / STATE, self._tombs / f"{name}.json"):
            try:
                record: dict[str, Any] = json.loads(path.read_text())
                return record
            except (OSError, json.JSONDecodeError):
                continue
        return None


def progress_step(metrics: Path) -> int:
    """The job's training step so far, from its metrics.jsonl (0 before the first line)."""
    try:
        return max_step(metrics.read_bytes())
    except OSError:
        return 0


def _metrics_file(notice_file: str) -> Path:
    """The job's metrics, from where its notices go: <storage>/notices/<name> -> <storage>/metrics.jsonl."""
    return Path(notice_file).parent.parent / METRICS


def progress_clock_for(spec: JobSpec, slots: Sequence[Slot], step_sleep: Callable[[str | None, int], float]
                       ) -> dict[str, str]:
    """Create-request metadata that puts a local job's drawn (``model``) revocations on its progress clock.

    ``progress-step-s``: nominal wall seconds per global step, from the workers' emulated step times
    (async: their rates add up; sync: the slowest sets the pace). An explicit ``schedule`` stays in wall
    seconds after the job's start, as the spec says; without GPU emulation there is no nominal pace.
    """
    local = spec.provider.as_local()
    if local is None or local.revocations != RevocationMode.MODEL:
        return {}
    times = [step_sleep(s.gpu, s.batch or DEFAULT_BATCH) for s in slots if s.role == Role.WORKER]
    times = [t for t in times if t > 0]
    if not times:
        return {}
    step_s = max(times) if spec.mode == TrainingMode.SYNC else 1.0 / sum(1.0 / t for t in times)
    return {PROGRESS_STEP_S: f"{step_s:.6f}"}


def _recorded_host_pids(d: Path, state: dict[str, Any] | None) -> list[int]:
    """The hypervisor's pid as recorded: by its create (``hypervisor.pid``), and by itself (``instance.json``)."""
    pids = []
    with contextlib.suppress(OSError, ValueError):
        pids.append(int((d / HOST_PID).read_text()))
    if state is not None and isinstance(state.get("hypervisor_pid"), int):
        pids.append(int(state["hypervisor_pid"]))
    return pids


class ProcessHosts:
    """Each instance's emulated host as a detached process (``python -m orchestrator.providers.local.host DIR``),
    found again through /proc by its command line and working directory."""

    def start(self, d: Path) -> int:
        return spawn_detached(host_argv(d), d, _env_with_package())

    def started(self, d: Path) -> bool:
        return _host_started(d)

    def alive(self, d: Path, state: dict[str, Any], now: float) -> bool:
        return _hypervisor_alive(d, state, now)

    def recorded(self, d: Path, state: dict[str, Any] | None) -> list[int]:
        """The recorded hypervisor pids of ``d`` that are still its hypervisor's (checked in /proc)."""
        return [pid for pid in _recorded_host_pids(d, state) if is_host_of(pid, d)]

    def end_and_remove(self, folder: Path, host: tuple[Path, list[int]] | None) -> None:
        _end_and_remove(folder, host)


def _host_started(d: Path) -> bool:
    """Was this instance's hypervisor ever started (by any create)? Recorded, or running without a record."""
    if (d / HOST_PID).exists():
        return True
    try:
        state = json.loads((d / STATE).read_text())
    except (OSError, json.JSONDecodeError):
        state = None
    return bool(_recorded_host_pids(d, state)) or bool(hosts_of(d))


def _hypervisor_alive(d: Path, state: dict[str, Any], now: float) -> bool:
    recorded = _recorded_host_pids(d, state)
    if not recorded:  # its create died before starting it (a resend starts it), or is starting it right now
        return now - float(state["created_at"]) < SPAWN_GRACE_S or bool(hosts_of(d))
    return any(is_host_of(pid, d) for pid in recorded)


def _end_and_remove(folder: Path, host: tuple[Path, list[int]] | None) -> None:
    """End what runs in an instance's folder (moved aside by a delete), then remove it. ``host``: the folder
    as its hypervisor knows it (its command line), with the pids recorded for it (checked already)."""
    procs = all_processes()
    pids = running_in(folder, procs)  # the hypervisor (it runs in the folder) and the job's processes
    if host is not None:
        pids += host[1] + hosts_of(host[0], procs)  # one whose start was under way as we looked
    end(sorted(set(pids)))
    shutil.rmtree(folder, ignore_errors=True)


def _write_atomic(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


@contextlib.contextmanager
def _create_lock(d: Path) -> Iterator[None]:
    """One create of an instance at a time (two resends of one create start one hypervisor); released by
    the kernel when its holder dies."""
    with (d / CREATE_LOCK).open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _env_with_package() -> dict[str, str]:
    """The emulated host's environment: built like a payload's (never the controller's DB URL or cloud
    credentials: a host is not the controller), plus this package on the path."""
    env = payload_base_env()
    root = str(Path(orchestrator.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
