"""The Compute API request bodies of a gce launch, built in one place (no client, no credentials).

``GceProvider`` sends exactly these bodies, and ``orchestrator launch --dry-run`` prints them, so a dry
run shows what a real launch would send. Spot VMs are ``provisioningModel=SPOT`` with
``instanceTerminationAction=DELETE`` by default, and every VM carries ``scheduling.maxRunDuration``: GCE
itself ends it at that limit, so spend stays bounded even if every controller is dead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.model.catalog import load_catalog
from orchestrator.model.cloud_errors import InvalidRequestError
from orchestrator.model.gce_rules import ROUTE_INSTALLER, ImageRoute, load_gce_rules
from orchestrator.model.instances import InstanceRequest
from orchestrator.providers.gce.recipes import WORKER_RECIPE, recipe_path

# The controller's own credentials (credentials.py); a VM never gets this scope (see STORAGE_SCOPE).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# What a job's VMs need: read the data and write checkpoints and preemption notices in gs:// storage.
STORAGE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
# A stock OS image with no NVIDIA driver: CPU-only VMs (image baking's base) and provider.gpu_driver: installer.
DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
# Google's flex-start request shape: never consume a reservation (https://cloud.google.com/compute/docs/instances/flex-start-vms).
NO_RESERVATION = "NO_RESERVATION"
# Google's driver installer, run at every boot until the driver answers: it reboots the VM mid-install,
# and GCE runs the startup script again after each reboot, which completes the install.
INSTALLER_SCRIPT = """#!/bin/bash
if ! nvidia-smi >/dev/null 2>&1; then
  mkdir -p /opt/google/cuda-installer && cd /opt/google/cuda-installer || exit 1
  [ -f cuda_installer.pyz ] || curl -fsSL -o cuda_installer.pyz \\
    https://storage.googleapis.com/compute-gpu-installation-us/installer/latest/cuda_installer.pyz
  python3 cuda_installer.pyz install_driver --installation-mode=repo --installation-branch=prod || exit 1
  nvidia-smi >/dev/null 2>&1 || exit 0  # the installer reboots; this script runs again after it
fi
"""
# The payload's framework and packages at first boot (images/gpu-worker.sh, idempotent), on an image with
# Google's driver but not the payload; then the marker that jobs/boot_python.sh (the tasks' interpreter on
# such VMs) waits for, so no task starts before its framework is there.
BOOT_DIR = "/var/lib/orchestrator"
PAYLOAD_SETUP = """#!/bin/bash
cd / && mkdir -p {dir} || exit 1
[ -f {dir}/boot-ready ] && exit 0
rm -f {dir}/boot-failed
cat > {dir}/gpu-worker.sh <<'ORCHESTRATOR_RECIPE'
{recipe}ORCHESTRATOR_RECIPE
if FRAMEWORK={framework} GPU={gpu} SKIP_GPU_CHECK={skip} KEEP_IMAGE_FRAMEWORK=1 \\
    bash {dir}/gpu-worker.sh >{dir}/boot.log 2>&1; then
  touch {dir}/boot-ready
else
  touch {dir}/boot-failed
fi
"""
Body = dict[str, Any]  # a request body as the API's JSON (camelCase names, int64 as strings)
PORTS_RE = re.compile(r"^\d{1,5}(-\d{1,5})?$")
# Cloud-side deadline bounds (seconds): GCE accepts maxRunDuration from 30 s; flex-start VMs run at
# most 7 days. Without a deadline or budget a VM still gets DEFAULT_MAX_RUN_S.
MIN_RUN_S = 60
DEFAULT_MAX_RUN_S = 7 * 86400
FLEX_START_MAX_RUN_S = 7 * 86400
DEADLINE_GRACE_S = 600  # the controller tears down at the deadline; GCE's backstop fires a little later

# Catalog GPU key -> GCE accelerator type (data/gpus.csv).
GPU_ACCELERATORS: dict[str, str] = {g.key: g.gce_accelerator for g in load_catalog().gpus.values()}


def accelerator_type(gpu: str) -> str:
    """Catalog key (``l4``) -> GCE accelerator type; full GCE names pass through."""
    if gpu in GPU_ACCELERATORS:
        return GPU_ACCELERATORS[gpu]
    if gpu.startswith("nvidia-"):
        return gpu
    raise InvalidRequestError(f"unknown GPU {gpu!r}; known: {', '.join(sorted(GPU_ACCELERATORS))}")


def image_url(project: str, image: str) -> str:
    if image.startswith(("projects/", "https://", "global/")):
        return image
    return f"projects/{project}/global/images/{image.removeprefix('images/')}"


def cloud_max_run_s(
    *,
    deadline_s: float | None,
    elapsed_s: float,
    budget_usd: float | None,
    spent_usd: float,
    cluster_usd_per_hour: float,
    flex_start: bool = False,
) -> int:
    """The VM's ``maxRunDuration``: what is left of the job's deadline (plus a teardown grace) and
    the hours the remaining budget buys for the whole cluster, so that even if every instance runs
    to its limit with no controller alive the job spends at most its budget."""
    limits = [float(FLEX_START_MAX_RUN_S if flex_start else DEFAULT_MAX_RUN_S)]
    if deadline_s is not None:
        limits.append(deadline_s - elapsed_s + DEADLINE_GRACE_S)
    if budget_usd is not None and cluster_usd_per_hour > 0:
        limits.append((budget_usd - spent_usd) / cluster_usd_per_hour * 3600.0)
    return int(max(MIN_RUN_S, min(limits)))


@dataclass(frozen=True)
class GceRequestSettings:
    """Everything about a VM that comes from the provider's configuration rather than the slot."""

    project: str
    image: str | None = None  # None: Google's image with a driver for the VM's GPU (data/gce_images.csv)
    # The job's framework (model.torch_spec.payload_framework): picks the default image and what the VMs install
    # at first boot; None (image baking, bare providers): no first-boot set-up.
    framework: str | None = None
    gpu_driver_installer: bool = False  # a stock image gets INSTALLER_SCRIPT at boot
    network: str = "global/networks/default"
    subnetwork: str | None = None
    network_tag: str | None = "orchestrator"
    external_ip: bool = True
    disk_size_gb: int = 50
    disk_type: str | None = None  # None: the machine family's default (data/gce_rules.csv)
    service_account_email: str | None = None  # None: the VM has no service account
    scopes: Sequence[str] = (STORAGE_SCOPE,)
    preemption_notice_s: int = 0  # 120: scheduling.preemptionNoticeDuration on Spot VMs (Preview)
    flex_request_valid_s: int = 1800  # requestValidForDuration of a Flex-start request
    ssh_source_ranges: Sequence[str] = ("0.0.0.0/0",)
    termination_action: str = "DELETE"  # of spot and time-limited VMs: DELETE or STOP (keeps the disk, billed)
    bundled: dict[str, int] = field(default_factory=dict)  # machine type -> GPUs GCE attaches itself

    @property
    def image_url(self) -> str:
        """The image of a VM without a GPU (the GPU's route image when the spec names none)."""
        return self.image_for(None)

    def image_for(self, gpu: str | None) -> str:
        if self.image is not None:
            return image_url(self.project, self.image)
        return load_gce_rules().default_image(_catalog_key(gpu), self.framework)

    def route_for(self, gpu: str | None) -> ImageRoute:
        """How a VM with ``gpu`` gets its driver (and framework): its image's row of data/gce_images.csv."""
        return load_gce_rules().image_route(self.image_for(gpu), self.project, installer=self.gpu_driver_installer)

    def boot_setup(self, gpu: str | None) -> bool:
        """The VM installs the job's framework and packages at first boot (PAYLOAD_SETUP)."""
        return self.framework is not None and self.route_for(gpu).boot_setup

    def disk_for(self, machine_type: str) -> str:
        return load_gce_rules().boot_disk(machine_type, self.disk_type)

    def installs_driver(self, gpu: str | None) -> bool:
        """The VM runs Google's driver installer at boot (a GPU VM on a stock image, by the spec's choice)."""
        if gpu is None or not self.gpu_driver_installer:
            return False
        return load_gce_rules().image_route(self.image_for(gpu), self.project, installer=True).route == ROUTE_INSTALLER


def _catalog_key(gpu: str | None) -> str | None:
    """``nvidia-l4`` -> ``l4`` (requests may carry either)."""
    if gpu is None:
        return None
    return next((key for key, accel in GPU_ACCELERATORS.items() if gpu in (key, accel)), gpu)


def bundled_machine_types() -> dict[str, int]:
    """Accelerator-optimized machine types (GPUs attached by GCE, no guestAccelerators) from the catalog."""
    return {m.name: m.gpu_count for m in load_catalog().machine_types.values() if m.bundled}


def _scheduling(request: InstanceRequest, settings: GceRequestSettings) -> Body:
    scheduling: Body = {}
    if request.gpu or request.spot or request.flex_start:
        scheduling["onHostMaintenance"] = "TERMINATE"  # GPUs cannot live-migrate; spot cannot either
    max_run_s = request.max_run_s
    if request.spot:
        scheduling["provisioningModel"] = "SPOT"
        scheduling["automaticRestart"] = False
        if settings.preemption_notice_s:
            scheduling["preemptionNoticeDuration"] = duration(settings.preemption_notice_s)
    elif request.flex_start:
        scheduling["provisioningModel"] = "FLEX_START"
        scheduling["automaticRestart"] = False
        # Flex-start VMs run 10 min .. 7 days (data/cloud_facts.csv); GCE refuses a limit outside that.
        max_run_s = load_gce_rules().flex_run_s(max_run_s if max_run_s is not None else FLEX_START_MAX_RUN_S)
    else:
        scheduling["automaticRestart"] = True
    if max_run_s is not None:
        scheduling["maxRunDuration"] = duration(max_run_s)
    if request.spot or request.flex_start or request.max_run_s is not None:
        # Flex-start VMs are always deleted at their limit; GCE asks for DELETE with FLEX_START.
        scheduling["instanceTerminationAction"] = "DELETE" if request.flex_start else settings.termination_action
    return scheduling


def duration(seconds: float) -> Body:
    """A ``Duration`` in the API's JSON: int64 seconds travel as a string."""
    return {"seconds": str(int(seconds))}


def _nic(settings: GceRequestSettings) -> Body:
    # gVNIC: required on A3 Ultra / A4, and what gives any GPU VM more than 50 Gbps (data/gce_rules.csv).
    nic: Body = {"network": settings.network, "nicType": "GVNIC"}
    if settings.subnetwork:
        nic["subnetwork"] = settings.subnetwork
    if settings.external_ip:
        nic["accessConfigs"] = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    return nic


def instance_resource(request: InstanceRequest, settings: GceRequestSettings) -> Body:
    """The ``instances.insert`` body for one slot's instance, as the API's JSON (``compute_v1.Instance``)."""
    zone = request.zone
    if bool(request.gpu) != (request.gpu_count > 0):
        raise InvalidRequestError(f"{request.name}: gpu={request.gpu!r} with gpu_count={request.gpu_count}", zone=zone)
    instance: Body = {
        "name": request.name,
        "machineType": f"zones/{zone}/machineTypes/{request.machine_type}",
        "labels": request.all_labels(),
        "scheduling": _scheduling(request, settings),
        "networkInterfaces": [_nic(settings)],
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
            "sourceImage": settings.image_for(request.gpu),
            "diskSizeGb": str(settings.disk_size_gb),  # int64: a string in the API's JSON
            "diskType": f"zones/{zone}/diskTypes/{settings.disk_for(request.machine_type)}"}}],
        "metadata": {"items": [{"key": k, "value": v} for k, v in sorted(_metadata(request, settings).items())]},
    }
    if request.flex_start:
        instance["reservationAffinity"] = {"consumeReservationType": NO_RESERVATION}
        # How long the request waits for capacity: v1 carries it in the instance's params (InstanceParams, "relevant
        # only for Instances.Insert"), not in scheduling (https://cloud.google.com/compute/docs/reference/rest/v1/instances).
        instance["params"] = {"requestValidForDuration": duration(settings.flex_request_valid_s)}
    if request.gpu and request.machine_type not in settings.bundled:
        # N1: attach the GPUs. A2/A3/A4/G2/G4 types come with theirs (GCE refuses guestAccelerators there).
        instance["guestAccelerators"] = [{
            "acceleratorType": f"zones/{zone}/acceleratorTypes/{accelerator_type(request.gpu)}",
            "acceleratorCount": request.gpu_count}]
    if settings.network_tag:
        # "{job}": one tag per job, so that firewall rules can tell the jobs apart (providers/gce/network.py).
        instance["tags"] = {"items": [settings.network_tag.replace("{job}", request.job_id)]}
    if settings.service_account_email:
        instance["serviceAccounts"] = [{"email": settings.service_account_email, "scopes": list(settings.scopes)}]
    return instance


def _metadata(request: InstanceRequest, settings: GceRequestSettings) -> dict[str, str]:
    items = dict(request.metadata)
    if script := startup_script(settings, request.gpu):
        items["startup-script"] = script
    return items


def startup_script(settings: GceRequestSettings, gpu: str | None) -> str | None:
    """The VM's startup script: Google's driver installer (provider.gpu_driver: installer), then the payload's
    framework and packages (an image with a driver but not the payload); None when it needs neither."""
    parts = [INSTALLER_SCRIPT] if settings.installs_driver(gpu) else []
    if settings.boot_setup(gpu) and settings.framework is not None:
        recipe = recipe_path(WORKER_RECIPE).read_text()
        parts.append(PAYLOAD_SETUP.format(dir=BOOT_DIR, recipe=recipe, framework=settings.framework,
                                          gpu=_catalog_key(gpu) or '""', skip=0 if gpu else 1))
    if not parts:
        return None
    return "#!/bin/bash\n" + "".join(p.removeprefix("#!/bin/bash\n") for p in parts)


def firewall_rules(settings: GceRequestSettings, network_tag: str, ports: str) -> list[Body]:
    """Open ``ports`` (e.g. ``"2222-2230,8470"``) only between VMs carrying ``network_tag`` (the TF gRPC
    ports have no authentication), and ssh from ``ssh_source_ranges``. Two rules, because sourceTags and
    sourceRanges in one rule are OR-ed by GCE."""
    port_list = [p.strip().removeprefix("tcp:") for p in ports.split(",") if p.strip()]
    if not port_list or not all(PORTS_RE.match(p) for p in port_list):
        raise InvalidRequestError(f"bad port list {ports!r}; expected e.g. '2222-2230,8470'")
    internal = firewall(f"{network_tag[:54]}-internal", settings.network,
                        "orchestrator: cluster ports, only between the cluster's VMs (no authentication)",
                        port_list, target_tag=network_tag, source_tags=[network_tag])
    ssh = firewall(f"{network_tag[:58]}-ssh", settings.network, "orchestrator: ssh to the cluster's VMs", ["22"],
                   target_tag=network_tag, source_ranges=list(settings.ssh_source_ranges))
    return [internal, ssh]


def firewall(name: str, network: str, description: str, tcp_ports: Sequence[str], *, target_tag: str,
             source_tags: Sequence[str] = (), source_ranges: Sequence[str] = ()) -> Body:
    """One INGRESS rule as the API's JSON (``compute_v1.Firewall``): tcp ``tcp_ports`` to ``target_tag``'s VMs."""
    rule: Body = {"name": name, "network": network, "direction": "INGRESS", "priority": 1000,
                  "description": description, "allowed": [{"IPProtocol": "tcp", "ports": list(tcp_ports)}],
                  "targetTags": [target_tag]}
    if source_tags:
        rule["sourceTags"] = list(source_tags)
    if source_ranges:
        rule["sourceRanges"] = list(source_ranges)
    return rule
