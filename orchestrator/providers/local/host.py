"""The emulated cloud behind one local instance: boot, then (for a revoked spot instance) notice and kill.

Run as ``python -m orchestrator.providers.local.host DIR``; it is its own session leader, so a killed
controller leaves it (like a VM) running. It is the only writer of ``DIR/instance.json`` after creation.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.providers.local.progress import first_step_at_least
from orchestrator.transport.local import kill_all_in


def write_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def wait_for_step(metrics: Path, target: int, poll_s: float = 0.1) -> int:
    """Block until the job's metrics reach step ``target`` (its progress clock); returns the first logged step
    at or past it."""
    offset = 0
    while True:
        time.sleep(poll_s)
        try:
            with metrics.open("rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            continue  # no metrics yet: training has not started, the clock stands
        end = data.rfind(b"\n")  # whole lines only: the chief may be half-way through one
        if end >= 0:
            found = first_step_at_least(data[: end + 1], target)
            if found is not None:
                return found
            offset += end + 1


def run(instance_dir: Path) -> None:
    state_path = instance_dir / "instance.json"
    state: dict[str, Any] = json.loads(state_path.read_text())
    state["hypervisor_pid"] = os.getpid()
    boot_done = state["created_at"] + state["boot_delay_s"]
    time.sleep(max(0.0, boot_done - time.time()))
    state["state"] = "running"
    state["running_at"] = time.time()
    write_state(state_path, state)
    revoke_at = state.get("revoke_at")
    if state.get("revoke_at_step") is not None:  # the progress clock: drawn, or a schedule's at_step
        state["notice_step"] = wait_for_step(Path(state["metrics_file"]), int(state["revoke_at_step"]))
    elif revoke_at is not None:
        time.sleep(max(0.0, revoke_at - time.time()))
    else:
        while True:  # lives until the provider deletes the instance
            time.sleep(3600)
    # Like GCE: ACPI soft-off, the shutdown script reports a notice, hard off after the window.
    state["state"] = "stopping"
    state["preempted"] = True
    state["notice_at"] = time.time()
    write_state(state_path, state)
    for notice in state.get("notice_files", []):
        try:
            Path(notice).parent.mkdir(parents=True, exist_ok=True)
            Path(notice).write_text(json.dumps({"instance": state["name"], "at": state["notice_at"],
                                                "window_s": state["notice_window_s"]}))
        except OSError:
            pass  # a shutdown script that cannot write does not stop the preemption
    time.sleep(state["notice_window_s"])
    state["killed_at"] = time.time()
    kill_all_in(instance_dir / "disk")
    state["state"] = "terminated"
    write_state(state_path, state)


if __name__ == "__main__":
    run(Path(sys.argv[1]))
