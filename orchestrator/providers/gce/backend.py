"""The gce provider's backend: Compute Engine VMs (or any endpoint that speaks its API), reached over SSH."""

from __future__ import annotations

import hashlib
from functools import partial
from typing import TYPE_CHECKING

from orchestrator.clock import WALL, Clock
from orchestrator.model.instances import ObservedInstance
from orchestrator.model.paths import jobs_dir
from orchestrator.model.spec import GceProvider as GceSpec
from orchestrator.model.timings import FLEX_START_REQUEST_VALID_S
from orchestrator.providers.base import Backend
from orchestrator.providers.passed_env import passed_env
from orchestrator.storage.base import NOTICES, JobStorage
from orchestrator.transport.base import Endpoint
from orchestrator.transport.keys import job_key
from orchestrator.transport.ssh import SshTransport

if TYPE_CHECKING:
    from orchestrator.providers.gce.requests import GceRequestSettings

NETWORK_TAG = "orch-{job}"
# The tasks' interpreter on a VM that installs its framework at first boot: waits for that set-up (pushed
# with the job's files), then runs the framework's python3.
BOOT_PYTHON = "jobs/boot_python.sh"  # = providers.gce.network.JOB_TAG: each job's VMs carry their own tag
BOOT_WAIT = "boot_wait.sh"  # in jobs/: the one copy of the wait, which boot_python.sh execs through
TF_PORTS = "2222-2299"
# A PyTorch job's VMs reach each other on ports chosen at run time: torchrun's c10d store, gloo's pair sockets, and on
# torchft replica groups each group's manager, store and weight server for a healing peer. Only between the job's
# tagged VMs (network.job_rules); its Lighthouse is reached through SSH (control/lighthouse.reach), opening nothing.
TORCH_PORTS = "1024-65535"

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


def cache_key(spec: GceSpec, framework: str | None = None) -> str:
    """Jobs share a Backend only when it would be built the same (zones are chosen per instance): a job
    whose VMs differ in image, framework (which picks the default image), network, user, interpreter or
    task port gets its own."""
    shape = hashlib.sha256(spec.model_dump_json(exclude={"zones"}).encode()).hexdigest()[:12]
    return f"gce:{spec.project}:{spec.api_endpoint or ''}:{shape}:{framework or ''}"


def shutdown_script(storage_uri: str, name: str) -> str | None:
    """The shutdown script that reports instance ``name``'s preemption into ``gs://`` storage (else None)."""
    if not storage_uri.startswith("gs://"):
        return None
    bucket, _, prefix = storage_uri.removeprefix("gs://").partition("/")
    return SHUTDOWN_SCRIPT.format(bucket=bucket, blob=f"{prefix}/{NOTICES}/{name}")


def request_settings(spec: GceSpec, framework: str | None = None) -> GceRequestSettings:
    """The request settings of every VM of this provider spec and a job of ``framework``
    (model.torch_spec.payload_framework): the real create and the dry run use these."""
    from orchestrator.providers.gce.requests import (  # lazy: the request builder loads google-cloud-compute
        GceRequestSettings,
        bundled_machine_types,
    )

    account = spec.service_account or "default"  # the project's default account, with the storage scope only
    return GceRequestSettings(
        project=spec.project, image=spec.image, framework=framework,
        gpu_driver_installer=spec.gpu_driver == "installer",
        network=spec.network, network_tag=NETWORK_TAG, disk_type=spec.boot_disk_type,
        service_account_email=None if account == "none" else account,
        preemption_notice_s=spec.preemption_notice_s, flex_request_valid_s=int(FLEX_START_REQUEST_VALID_S),
        termination_action=spec.termination_action, bundled=bundled_machine_types())


def instance_metadata(ssh_user: str, public_key: str, storage_uri: str, name: str) -> dict[str, str]:
    """The metadata of instance ``name``: the real create and the dry run send exactly these items."""
    from orchestrator.providers.gce.network import GUEST_ATTRIBUTES_KEY  # google-cloud-compute, gce jobs only

    items = {"ssh-keys": f"{ssh_user}:{public_key}", "block-project-ssh-keys": "true",
             GUEST_ATTRIBUTES_KEY: "TRUE"}  # the guest agent publishes the SSH host keys we pin
    if (script := shutdown_script(storage_uri, name)) is not None:
        items["shutdown-script"] = script
    return items


def firewall_ports(spec: GceSpec, framework: str | None = None) -> str:
    """The cluster ports the firewall opens between the job's VMs: TORCH_PORTS for a PyTorch job, else TF_PORTS,
    plus a task port outside it and the port after it (where a chief co-located with worker 0 listens)."""
    if framework == "pytorch":
        return TORCH_PORTS
    low, high = (int(p) for p in TF_PORTS.split("-"))
    if spec.task_port == 0 or low <= spec.task_port < high:
        return TF_PORTS
    return f"{TF_PORTS},{spec.task_port}-{spec.task_port + 1}"


def task_python(spec: GceSpec, settings: GceRequestSettings) -> str:
    """``provider.python``, or BOOT_PYTHON where the VMs install their framework at first boot (the default
    python3 would start a task before its framework is there)."""
    return BOOT_PYTHON if spec.python == "python3" and settings.boot_setup(None) else spec.python


def command_prefix(python: str) -> tuple[str, ...]:
    """What a ``job: command`` task runs behind where the tasks' interpreter is BOOT_PYTHON: the same wait
    (jobs/boot_wait.sh), then ``exec "$@"`` of the command's argv, which stays a list. A command job is not
    pushed jobs/, so the script's text goes to sh as its ``-c`` argument; it is fixed, never built from the
    spec."""
    if python != BOOT_PYTHON:
        return ()
    return ("/bin/sh", "-c", (jobs_dir() / BOOT_WAIT).read_text(), "boot_wait")  # "boot_wait": its $0


def build(key: str, spec: GceSpec, framework: str | None = None, clock: Clock = WALL) -> Backend:
    """Everything that differs from one Compute endpoint to another comes from the spec's settings
    (``ssh_user``, ``python``, ``task_port``) or from what the endpoint reports about each VM (address,
    ssh port and work directory metadata): a Compute API on loopback is reached like GCE itself."""
    from orchestrator.providers.gce.network import (  # gce jobs only
        IsolatedGceProvider,
    )
    from orchestrator.providers.gce.requests import cloud_max_run_s  # google-cloud-compute, as above

    # Per-job tags and firewall rules, SSH from this controller only (providers/gce/network.py).
    settings = request_settings(spec, framework)
    provider = IsolatedGceProvider(
        spec.project, ports=firewall_ports(spec, framework), ssh_ranges=spec.ssh_source_ranges,
        allow_open_network=spec.allow_open_network,
        credentials=spec.credentials, api_endpoint=spec.api_endpoint, network=spec.network,
        termination_action=spec.termination_action, settings=settings)
    provider.clock = clock

    def endpoint(observed: ObservedInstance) -> Endpoint:
        key_path, _ = job_key(observed.job_id)
        return Endpoint(workdir=observed.workdir or "orchestrator", host=observed.host or "127.0.0.1",
                        port=observed.ssh_port or 22, user=spec.ssh_user, key_path=str(key_path),
                        # Pinned: the keys the VM's guest agent published through the Compute API.
                        host_key_source=partial(provider.host_keys, observed.name, observed.zone))

    def metadata(job_id: str, name: str, storage: JobStorage) -> dict[str, str]:
        _, public = job_key(job_id)
        return instance_metadata(spec.ssh_user, public, storage.uri, name)

    python = task_python(spec, settings)
    shared_address = spec.task_port == 0  # all VMs answer at one address, each task on its own port
    return Backend(
        key, provider, SshTransport(), fixed_task_port=None if shared_address else spec.task_port,
        endpoint=endpoint, instance_metadata=metadata, python=python, command_prefix=command_prefix(python),
        task_env=passed_env(),
        # One address with a port kept per slot: a replacement is where its predecessor was. A VM of its
        # own gets a new IP, so an async chief must restart to reach it.
        stable_addresses=shared_address, cloud_deadline=cloud_max_run_s, clock=clock,
        # The job's firewall rules are made by provider.create before its first VM (IsolatedGceProvider).
    )

