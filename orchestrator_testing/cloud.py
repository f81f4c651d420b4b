"""An emulated cloud on this machine: the Compute API emulator, a real sshd and a GCS emulator, wired so
each emulated VM is a real host for the rest of the path.

The hooks play the parts GCE plays outside the API: the guest agent installs the ``ssh-keys`` metadata
when a VM starts; on a preemption the VM's shutdown script writes a notice into the job's bucket; when the
VM stops (hard off) or is deleted, everything running on it dies.
"""

from __future__ import annotations

import ast
import getpass
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.cloud import storage  # type: ignore[attr-defined,unused-ignore]

from orchestrator.transport.local import kill_all_in
from orchestrator_testing.gce_emulator import GceEmulator
from orchestrator_testing.gcs import GcsEmulator
from orchestrator_testing.sshd import Sshd


def _metadata(inst: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: i.get("value", "") for i in (inst.get("metadata") or {}).get("items", [])}


def provider_settings(url: str) -> dict[str, Any]:
    """A gce spec's provider fields for a Compute API emulator at ``url`` whose VMs are this machine: one
    address for all (so a port per task), the sshd runs as the current user with this interpreter, and SSH
    comes from this machine (no public address to learn)."""
    return {"api_endpoint": url, "ssh_user": getpass.getuser(), "python": sys.executable, "task_port": 0,
            "ssh_source_ranges": ["127.0.0.1/32"]}


def provider_yaml(url: str) -> str:
    """``provider_settings`` as YAML flow-mapping items, to splice into a spec's ``provider: {...}``."""
    return ", ".join(f"{k}: {json.dumps(v)}" for k, v in provider_settings(url).items())


class EmulatedCloud:
    def __init__(self, root: Path | None = None, *, bucket: str = "orchestrator-test",
                 config: dict[str, Any] | None = None, notice_window_s: float = 2.0) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="emulated-cloud-"))
        self.sshd = Sshd(self.root / "sshd")
        self.gcs = GcsEmulator(bucket=bucket)
        self.notice_window_s = notice_window_s
        self._config = config or {}
        self.compute: GceEmulator | None = None
        self.preempted_at: dict[str, float] = {}  # instance -> when the preemption began
        self.killed_at: dict[str, float] = {}  # instance -> when its processes died

    @property
    def url(self) -> str:
        assert self.compute is not None
        return self.compute.url

    def provider_settings(self) -> dict[str, Any]:
        """The gce provider settings that reach this cloud (``provider_settings``)."""
        return provider_settings(self.url)

    def start(self) -> EmulatedCloud:
        self.sshd.start()
        self.gcs.start()
        config = {"ssh_port": self.sshd.port, "workdir_root": str(self.root / "vms"), "boot_delay_s": 1.0,
                  "preempt_delay_s": self.notice_window_s, **self._config}
        self.compute = GceEmulator(config, on_running=self._running, on_preempted=self._preempted,
                                   on_terminated=self._gone, on_deleted=self._gone)
        self.compute.start()
        return self

    def stop(self) -> None:
        if self.compute is not None:
            self.compute.stop()
        self.gcs.stop()
        self.sshd.close()
        for vm in (self.root / "vms").glob("*"):
            kill_all_in(vm)

    def __enter__(self) -> EmulatedCloud:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the guest does

    def _running(self, inst: dict[str, Any]) -> None:
        keys = _metadata(inst).get("ssh-keys", "")
        for line in keys.splitlines():
            _, _, public = line.partition(":")
            if public.strip():
                self.sshd.authorize(public.strip())

    def _preempted(self, inst: dict[str, Any]) -> None:
        self.preempted_at[inst["name"]] = time.time()
        script = _metadata(inst).get("shutdown-script", "")
        # The shutdown script uploads a notice; run the same upload here (the script needs GCE's metadata
        # server to confirm the preemption, which this machine does not have).
        marker = "blob("
        if marker in script:
            blob = ast.literal_eval(script.split(marker, 1)[1].split(")", 1)[0])
            client = storage.Client(project="test", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
            client.bucket(self.gcs.bucket).blob(blob).upload_from_string(str(time.time()))

    def _gone(self, inst: dict[str, Any]) -> None:
        workdir = _metadata(inst).get("orchestrator-workdir")
        if workdir and Path(workdir).exists() and kill_all_in(Path(workdir)):
            self.killed_at.setdefault(inst["name"], time.time())

    def preempt_later(self, name: str, delay_s: float) -> threading.Timer:
        assert self.compute is not None
        timer = threading.Timer(delay_s, self.compute.preempt, args=(name,))
        timer.start()
        return timer
