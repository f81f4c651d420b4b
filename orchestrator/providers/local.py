"""The `local` provider: an instance is a work directory (its disk) plus an emulated-cloud process.

Spot instances are revoked at the time the controller drew for them (``InstanceRequest.revoke_after_s``):
the instance goes "stopping", a notice is written where the request's ``notice-file`` metadata says (as
GCE's shutdown script would), and after the notice window its processes are killed.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from orchestrator.providers.base import (
    LABEL_JOB,
    InstanceRequest,
    ObservedInstance,
    ObservedState,
    Provider,
    Role,
)
from orchestrator.transport.local import kill_all_in, kill_group, pid_alive, spawn_detached

NOTICE_MIN_S = 2.0  # wall seconds: a scaled 30 s window still leaves the chief time to checkpoint

_STATES = {"provisioning": ObservedState.PENDING, "running": ObservedState.RUNNING,
           "stopping": ObservedState.STOPPING, "terminated": ObservedState.TERMINATED}


class LocalProvider(Provider):
    name = "local"

    def __init__(self, root: Path, *, time_scale: float = 1.0, boot_delay_cloud_s: float = 70.0,
                 notice_window_cloud_s: float = 30.0) -> None:
        self.root = root / "instances"
        self.root.mkdir(parents=True, exist_ok=True)
        self.boot_delay_s = boot_delay_cloud_s / time_scale
        self.notice_window_s = max(NOTICE_MIN_S, notice_window_cloud_s / time_scale)

    def _dir(self, name: str) -> Path:
        return self.root / name

    def create(self, request: InstanceRequest) -> None:
        d = self._dir(request.name)
        if (d / "instance.json").exists():
            return  # deterministic name: the instance exists already
        (d / "disk").mkdir(parents=True, exist_ok=True)
        now = time.time()
        state: dict[str, Any] = {
            "name": request.name, "labels": request.all_labels(), "role": request.role.value,
            "index": request.index, "generation": request.generation, "zone": request.zone,
            "gpu": request.gpu, "spot": request.spot, "machine_type": request.machine_type,
            "created_at": now, "boot_delay_s": self.boot_delay_s, "notice_window_s": self.notice_window_s,
            "revoke_at": None if request.revoke_after_s is None or not request.spot else now + request.revoke_after_s,
            "notice_files": [request.metadata["notice-file"]] if "notice-file" in request.metadata else [],
            "state": "provisioning", "preempted": False, "workdir": str(d / "disk"),
        }
        tmp = d / ".instance.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(d / "instance.json")
        pid = spawn_detached([sys.executable, "-m", "orchestrator.providers.local_host", str(d)], d,
                             _env_with_package())
        (d / "hypervisor.pid").write_text(str(pid))

    def delete(self, name: str, zone: str) -> None:
        d = self._dir(name)
        if not d.exists():
            return  # not found is success
        with contextlib.suppress(FileNotFoundError, ValueError):
            kill_group(int((d / "hypervisor.pid").read_text()))
        kill_all_in(d / "disk")
        # Keep a tombstone (notice and kill times) for benchmarks and post-mortems; the disk goes.
        tomb = self.root.parent / "deleted"
        tomb.mkdir(exist_ok=True)
        try:
            state = json.loads((d / "instance.json").read_text())
            state["deleted_at"] = time.time()
            (tomb / f"{name}.json").write_text(json.dumps(state))
        except (OSError, json.JSONDecodeError):
            pass
        shutil.rmtree(d, ignore_errors=True)

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
            if state in (ObservedState.PENDING, ObservedState.RUNNING) and not _hypervisor_alive(path.parent):
                state = ObservedState.TERMINATED  # the emulated host died under us
            out.append(ObservedInstance(
                name=st["name"], job_id=labels[LABEL_JOB], role=Role(st["role"]), index=st["index"],
                generation=st["generation"], zone=st["zone"], state=state, provider_id=str(path.parent),
                host="127.0.0.1", workdir=st["workdir"], preempted=bool(st.get("preempted")), gpu=st.get("gpu"),
                spot=bool(st["spot"]),
            ))
        return out

    def history(self, name: str) -> dict[str, Any] | None:
        """The emulated cloud's record of an instance, live or deleted: created, notice, kill times."""
        for path in (self._dir(name) / "instance.json", self.root.parent / "deleted" / f"{name}.json"):
            try:
                record: dict[str, Any] = json.loads(path.read_text())
                return record
            except (OSError, json.JSONDecodeError):
                continue
        return None


def _hypervisor_alive(d: Path) -> bool:
    try:
        return pid_alive(int((d / "hypervisor.pid").read_text()))
    except (FileNotFoundError, ValueError):
        return True  # created a moment ago; the pid file follows the state file


def _env_with_package() -> dict[str, str]:
    import os

    import orchestrator

    root = str(Path(orchestrator.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
