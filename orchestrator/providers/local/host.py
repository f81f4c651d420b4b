"""The emulated cloud behind one local instance: boot, then (for a revoked spot instance) notice and kill.

Run as ``python -m orchestrator.providers.local.host DIR``; it is its own session leader, so a killed
controller leaves it (like a VM) running. Its create wrote ``DIR/instance.json`` before starting it; from then
on it is the only writer of that file, and it writes its pid there first thing.

It lives only while its folder does: the folder gone (deleted, or moved aside by a delete, maybe by a
controller that never knew this process's pid), it kills what runs in the folder (the job's processes) and
exits, within ``WATCH_S``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from orchestrator.clock import WALL, Clock
from orchestrator.providers.local.processes import end, running_in
from orchestrator.providers.local.progress import first_step_at_least
from orchestrator.transport.local import kill_all_in

WATCH_S = 0.5  # how often the host looks for its folder: a deleted instance's processes end within this


class FolderGone(Exception):
    """The instance's folder was deleted under this host."""


def write_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(state))
        tmp.replace(path)
    except FileNotFoundError as exc:
        raise FolderGone from exc


def _check(state_path: Path) -> None:
    if not state_path.exists():  # written before this process started, replaced atomically since
        raise FolderGone


def sleep_until(state_path: Path, until: float, clock: Clock = WALL) -> None:
    """Sleep to ``until`` (the clock's unix time), looking for the folder every WATCH_S."""
    while True:
        _check(state_path)
        left = until - clock.time()
        if left <= 0:
            return
        clock.sleep(min(WATCH_S, left))


def wait_for_step(metrics: Path, target: int, state_path: Path, poll_s: float = 0.1, clock: Clock = WALL) -> int:
    """Block until the job's metrics reach step ``target`` (its progress clock); returns the first logged step
    at or past it."""
    offset = 0
    while True:
        clock.sleep(poll_s)
        _check(state_path)
        try:
            with metrics.open("rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            continue  # no metrics yet: training has not started, the clock stands
        end_at = data.rfind(b"\n")  # whole lines only: the chief may be half-way through one
        if end_at >= 0:
            found = first_step_at_least(data[: end_at + 1], target)
            if found is not None:
                return found
            offset += end_at + 1


def run(instance_dir: Path, clock: Clock = WALL) -> None:
    state_path = instance_dir / "instance.json"
    try:
        state: dict[str, Any] = json.loads(state_path.read_text())
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise FolderGone from exc  # deleted before this process got going
    state["hypervisor_pid"] = os.getpid()  # what a delete falls back to without hypervisor.pid
    write_state(state_path, state)
    sleep_until(state_path, state["created_at"] + state["boot_delay_s"], clock)
    state["state"] = "running"
    state["running_at"] = clock.time()
    write_state(state_path, state)
    revoke_at = state.get("revoke_at")
    if state.get("revoke_at_step") is not None:  # the progress clock: drawn, or a schedule's at_step
        state["notice_step"] = wait_for_step(Path(state["metrics_file"]), int(state["revoke_at_step"]), state_path,
                                            clock=clock)
    else:  # without a revocation: lives until the provider deletes the instance
        sleep_until(state_path, float("inf") if revoke_at is None else revoke_at, clock)
    # Like GCE: ACPI soft-off, the shutdown script reports a notice, hard off after the window.
    state["state"] = "stopping"
    state["preempted"] = True
    state["notice_at"] = clock.time()
    write_state(state_path, state)
    for notice in state.get("notice_files", []):
        try:
            Path(notice).parent.mkdir(parents=True, exist_ok=True)
            Path(notice).write_text(json.dumps({"instance": state["name"], "at": state["notice_at"],
                                                "window_s": state["notice_window_s"]}))
        except OSError:
            pass  # a shutdown script that cannot write does not stop the preemption
    sleep_until(state_path, state["notice_at"] + state["notice_window_s"], clock)
    state["killed_at"] = clock.time()
    kill_all_in(instance_dir / "disk")
    state["state"] = "terminated"
    write_state(state_path, state)


def main(instance_dir: Path) -> None:
    try:
        run(instance_dir)
    except FolderGone:
        # Our own working directory is the instance's folder wherever it went (removed or moved aside):
        # what runs in it or below is this instance's.
        end(running_in(os.readlink("/proc/self/cwd").removesuffix(" (deleted)")))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
