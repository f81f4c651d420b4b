"""Backends for machines reached over SSH: GCE VMs (or the Compute API emulator) and an SSH inventory."""

from __future__ import annotations

import os
import shlex
import sys

from orchestrator.control.backends import Backend
from orchestrator.providers.base import ObservedInstance
from orchestrator.spec import GceProvider as GceSpec
from orchestrator.spec import SshProvider as SshSpec
from orchestrator.storage.base import NOTICES, JobStorage
from orchestrator.transport.base import Endpoint
from orchestrator.transport.keys import job_key
from orchestrator.transport.ssh import SshTransport

NETWORK_TAG = "orchestrator-cluster"
TF_PORTS = "2222-2299"
PASSED_ENV = ("STORAGE_EMULATOR_HOST",)  # tests point the payload's storage sync at the emulator

# Runs in GCE's 30 s window between the preemption's soft-off and the hard off: report a notice into the
# job's storage so the chief checkpoints at once (and the controller learns of it without polling).
SHUTDOWN_SCRIPT = """#!/bin/bash
preempted=$(curl -s -H 'Metadata-Flavor: Google' \\
  http://metadata.google.internal/computeMetadata/v1/instance/preempted)
[ "$preempted" = "TRUE" ] || exit 0
python3 - <<'PY'
import time
from google.cloud import storage
storage.Client().bucket({bucket!r}).blob({blob!r}).upload_from_string(str(time.time()))
PY
"""


def _passed_env() -> dict[str, str]:
    return {k: os.environ[k] for k in PASSED_ENV if k in os.environ}


def gce_backend(key: str, spec: GceSpec) -> Backend:
    from orchestrator.providers.gce import GceProvider

    emulated = spec.api_endpoint is not None
    provider = GceProvider(spec.project, credentials=spec.credentials, api_endpoint=spec.api_endpoint,
                           image=spec.image, network=spec.network, network_tag=NETWORK_TAG,
                           termination_action=spec.termination_action)
    transport = SshTransport()

    def endpoint(observed: ObservedInstance) -> Endpoint:
        key_path, _ = job_key(observed.job_id)
        return Endpoint(workdir=observed.workdir or "orchestrator", host=observed.host or "127.0.0.1",
                        port=observed.ssh_port or 22, user=spec.ssh_user if not emulated else None,
                        key_path=str(key_path))

    def metadata(job_id: str, name: str, storage: JobStorage) -> dict[str, str]:
        _, public = job_key(job_id)
        items = {"ssh-keys": f"{spec.ssh_user}:{public}", "block-project-ssh-keys": "true"}
        if storage.uri.startswith("gs://"):
            bucket, _, prefix = storage.uri.removeprefix("gs://").partition("/")
            items["shutdown-script"] = SHUTDOWN_SCRIPT.format(bucket=bucket, blob=f"{prefix}/{NOTICES}/{name}")
        return items

    return Backend(
        key, provider, transport, local_ports=emulated, endpoint=endpoint, instance_metadata=metadata,
        python=sys.executable if emulated else "python3", task_env=_passed_env(),
        stable_addresses=emulated,  # emulated instances all live on 127.0.0.1 with one port per slot
        prepare_network=lambda: provider.ensure_cluster_firewall(NETWORK_TAG, TF_PORTS),
    )


def ssh_backend(key: str, spec: SshSpec) -> Backend:
    from orchestrator.providers.ssh import SshInventoryProvider

    provider = SshInventoryProvider(spec.inventory)
    return Backend(key, provider, provider.transport, local_ports=False, endpoint=provider.endpoint,
                   python="python3", task_env=_passed_env(), stable_addresses=False)


def quote(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
