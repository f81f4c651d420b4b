"""Data model of the GCE emulator: config, errors, records, and the pure builders of REST bodies.

Builders validate request bodies the way GCE does (HTTP 400 ``invalid`` with the field named) and
return the resource's REST representation; all mutable state lives in ``gce_emulator_state``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

API_ROOT = "https://www.googleapis.com/compute/v1"
PROJECT_NUMBER = "123456789012"
DEFAULT_ZONES = [
    "us-central1-a",
    "us-central1-b",
    "us-central1-c",
    "us-central1-f",
    "us-east1-b",
    "us-east1-c",
    "us-east1-d",
    "us-west1-a",
    "us-west1-b",
    "us-east4-a",
    "us-east4-b",
    "us-east4-c",
    "us-east5-a",
    "us-east5-b",
    "us-south1-b",
    "us-west3-b",
    "us-west4-a",
    "europe-west1-b",
    "europe-west1-c",
    "europe-west4-a",
    "europe-west4-b",
    "europe-west4-c",
    "asia-east1-a",
    "asia-northeast1-a",
    "asia-northeast1-b",
    "asia-south1-b",
    "asia-southeast1-a",
    "asia-southeast1-b",
    "asia-southeast1-c",
]
# What GCE sells in 2026 (K80 retired 2024-05-01, P100 2026-09-15); configure `accelerators` for older zones.
DEFAULT_ACCELERATORS = [
    "nvidia-tesla-v100",
    "nvidia-tesla-t4",
    "nvidia-l4",
    "nvidia-rtx-pro-6000",
    "nvidia-tesla-a100",
    "nvidia-a100-80gb",
    "nvidia-h100-80gb",
    "nvidia-h100-mega-80gb",
    "nvidia-h200-141gb",
    "nvidia-b200",
]
# Accelerator-optimized series: GCE attaches the GPUs itself (model per series, count per type).
# series -> (accelerator type, vCPUs per GPU)
ACCELERATOR_SERIES: dict[str, tuple[str, int]] = {
    "a2-highgpu": ("nvidia-tesla-a100", 12),
    "a2-megagpu": ("nvidia-tesla-a100", 6),
    "a2-ultragpu": ("nvidia-a100-80gb", 12),
    "a3-highgpu": ("nvidia-h100-80gb", 26),
    "a3-edgegpu": ("nvidia-h100-80gb", 26),
    "a3-megagpu": ("nvidia-h100-mega-80gb", 26),
    "a3-ultragpu": ("nvidia-h200-141gb", 28),
    "a4-highgpu": ("nvidia-b200", 28),
}
# G2 / G4 name their vCPUs; the GPU count follows from the size.
_G_SERIES = {"g2-standard": "nvidia-l4", "g4-standard": "nvidia-rtx-pro-6000"}
_G_COUNTS = {
    "g2-standard": {4: 1, 8: 1, 12: 1, 16: 1, 24: 2, 32: 1, 48: 4, 96: 8},
    "g4-standard": {48: 1, 96: 2, 192: 4, 384: 8},
}
FLEX_START_SERIES = ("a2", "a3", "a4")
HOOK_EVENTS = ("running", "preempted", "terminated", "deleted")
Hook = Callable[[dict[str, Any]], None]

# Statuses in which an instance holds CPU/GPU quota (a TERMINATED VM only keeps its disk).
QUOTA_STATUSES = {"PROVISIONING", "STAGING", "RUNNING", "STOPPING"}
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_MACHINE_RE = re.compile(r"^(?P<family>[a-z][a-z0-9]*)-[a-z]+-(?P<n>\d+)(?P<g>g?)$")
_CUSTOM_RE = re.compile(r"^(?:[a-z][a-z0-9]*-)?custom-(?P<n>\d+)-\d+(?:-ext)?$")
_SHARED_CORE = {"e2-micro": 2, "e2-small": 2, "e2-medium": 2, "f1-micro": 1, "g1-small": 1}
_URL_PREFIX = r"^(?:https?://[^/]+/compute/(?:v1|beta|alpha)/)?"
IMAGE_RE = re.compile(
    _URL_PREFIX + r"(?:projects/(?P<project>[^/]+)/)?global/images/(?P<family>family/)?(?P<name>[^/]+)$"
)
DISK_RE = re.compile(
    _URL_PREFIX + r"(?:projects/(?P<project>[^/]+)/)?zones/(?P<zone>[^/]+)/disks/(?P<name>[^/]+)$"
)
HTTP_PHRASES = {
    400: "BAD REQUEST",
    403: "FORBIDDEN",
    404: "NOT FOUND",
    409: "CONFLICT",
    503: "SERVICE UNAVAILABLE",
}


class ApiError(Exception):
    """An HTTP error answered synchronously, in the JSON shape GCE uses."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
            }
        }


def not_found(resource: str) -> ApiError:
    return ApiError(404, "notFound", f"The resource '{resource}' was not found")


def invalid(field_name: str, value: Any, detail: str = "") -> ApiError:
    message = f"Invalid value for field '{field_name}': '{value}'. {detail}".rstrip()
    return ApiError(400, "invalid", message)


def not_ready(resource: str) -> ApiError:
    return ApiError(400, "resourceNotReady", f"The resource '{resource}' is not ready")


def default_fault_message(status: int, endpoint: str, project: str) -> tuple[str, str]:
    """(reason, message) GCE sends for this status."""
    if status == 401:
        return "required", (
            "Request is missing required authentication credential. Expected OAuth 2 access token, "
            "login cookie or other valid authentication credential."
        )
    if status == 403:
        return "forbidden", f"Required 'compute.{endpoint}' permission for 'projects/{project}'"
    if status == 429:
        return "rateLimitExceeded", "Rate Limit Exceeded"
    if status == 503:
        return "backendError", "The service is currently unavailable."
    return "backendError", "Internal error. Please try again or contact Google Support."


def link(project: str, rest: str) -> str:
    return f"{API_ROOT}/projects/{project}/{rest}"


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def gpu_quota_metric(accelerator: str, preemptible: bool = False) -> str:
    """``nvidia-tesla-k80`` -> ``NVIDIA_K80_GPUS`` (``PREEMPTIBLE_NVIDIA_K80_GPUS`` for spot)."""
    core = accelerator.removeprefix("nvidia-").removeprefix("tesla-")
    core = {"h100-80gb": "H100", "a100-80gb": "A100_80GB"}.get(core, core.upper().replace("-", "_"))
    metric = f"NVIDIA_{core}_GPUS"
    return f"PREEMPTIBLE_{metric}" if preemptible else metric


def bundled_gpus(machine_type: str) -> tuple[str, int] | None:
    """(accelerator type, count) GCE attaches to an accelerator-optimized machine type, else None."""
    series, _, size = machine_type.rpartition("-")
    if series in ACCELERATOR_SERIES and size.endswith("g") and size[:-1].isdigit():
        return ACCELERATOR_SERIES[series][0], int(size[:-1])
    if series in _G_SERIES and size.isdigit() and int(size) in _G_COUNTS[series]:
        return _G_SERIES[series], _G_COUNTS[series][int(size)]
    return None


def machine_vcpus(machine_type: str) -> int | None:
    series, _, size = machine_type.rpartition("-")
    if series in ACCELERATOR_SERIES and size.endswith("g") and size[:-1].isdigit():
        return int(size[:-1]) * ACCELERATOR_SERIES[series][1]
    if machine_type in _SHARED_CORE:
        return _SHARED_CORE[machine_type]
    if m := _CUSTOM_RE.match(machine_type):
        return int(m["n"])
    if m := _MACHINE_RE.match(machine_type):
        n = int(m["n"])
        if m["g"]:  # accelerator-optimized, e.g. a2-highgpu-2g: vCPUs scale with the GPU count
            return n * (26 if m["family"] == "a3" else 12)
        return n
    return None


def fingerprint(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


@dataclass
class Fault:
    """Make the next ``count`` calls of ``endpoint`` (glob, e.g. ``instances.*``) misbehave.

    ``status`` 0 means no error: the call is served normally but its answer is held back ``delay_s``
    (a timeout as the client sees it, after the server did the work, as with a real lost response).
    """

    endpoint: str = "*"
    status: int = 503
    count: int | None = 1  # None: forever
    delay_s: float = 0.0
    reason: str = ""
    message: str = ""


@dataclass
class EmulatorConfig:
    """Every knob; all durations are emulated seconds (``time_scale`` emulated seconds pass per real one)."""

    zones: list[str] = field(default_factory=lambda: list(DEFAULT_ZONES))
    default_accelerators: list[str] = field(default_factory=lambda: list(DEFAULT_ACCELERATORS))
    accelerators: dict[str, list[str]] = field(default_factory=dict)  # zone -> types; else the default
    # Each: {"zone": z or "*", "gpu": accelerator type or "*", "provisioning": "spot"|"standard"|"*",
    # "code": "ZONE_RESOURCE_POOL_EXHAUSTED" (or ..._WITH_DETAILS)}
    stockouts: list[dict[str, str]] = field(default_factory=list)
    quotas: dict[str, dict[str, float]] = field(
        default_factory=dict
    )  # region (or "global") -> metric -> limit
    quota_errors_as_http: bool = False  # True: a synchronous 403 quotaExceeded instead of an operation error
    boot_delay_s: float = 0.2  # PROVISIONING -> STAGING at half, RUNNING at the end
    stop_delay_s: float = 0.1
    delete_delay_s: float = 0.1
    preempt_delay_s: float = 0.1  # STOPPING -> TERMINATED after a preemption (real GCE: up to 30 s)
    op_delay_s: float = 0.05  # how long failing / trivial operations stay RUNNING
    image_delay_s: float = 0.1
    preemptible_max_runtime_s: float = 86400.0  # legacy preemptible VMs stop after 24 h
    time_scale: float = 1.0
    operation_wait_max_s: float = 120.0  # operations.wait returns by then even if not DONE, as GCE does
    latency_s: dict[str, float] = field(default_factory=dict)  # endpoint glob -> seconds added
    faults: list[dict[str, Any]] = field(default_factory=list)  # initial Fault(**item) list
    unreachable_zones: list[str] = field(default_factory=list)
    ssh_port: int | None = None
    workdir_root: str | None = None
    remove_workdir_on_delete: bool = False
    network_ip: str = "127.0.0.1"
    nat_ip: str = "127.0.0.1"
    max_results_limit: int = 500

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EmulatorConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown emulator config keys: {sorted(unknown)}")
        config = cls(**dict(data))
        if config.time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        return config


class Clock:
    """Emulated seconds since start: real time times ``scale`` plus whatever ``advance`` added."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self._t0 = time.monotonic()
        self._epoch = time.time()
        self._offset = 0.0

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.scale + self._offset

    def advance(self, seconds: float) -> None:
        self._offset += seconds

    def timestamp(self) -> str:
        when = datetime.fromtimestamp(self._epoch + self.now(), tz=UTC)
        return when.isoformat(timespec="milliseconds")


@dataclass
class InstanceRecord:
    project: str
    zone: str
    name: str
    body: dict[str, Any]
    spot: bool
    legacy_preemptible: bool
    termination_action: str
    gpu: str | None
    gpu_count: int
    cpus: int
    max_run_s: float | None = None  # GCE ends the VM itself this long after it starts running
    busy_op: str | None = None  # insert/start/stop/delete in progress: other mutations get resourceNotReady
    boots: int = 0  # bumped at every boot and stop so stale timers recognise themselves
    deleting: bool = False

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instances/{self.name}"

    @property
    def status(self) -> str:
        return str(self.body["status"])


@dataclass
class OperationRecord:
    project: str
    scope: str  # "zones/<zone>" or "global"
    body: dict[str, Any]


def build_instance(
    config: EmulatorConfig, project: str, zone: str, req: dict[str, Any], inst_id: str, stamp: str
) -> InstanceRecord:
    """Validate an instances.insert body (400s like GCE) and build the instance's REST representation."""
    name = str(req.get("name", ""))
    if not NAME_RE.match(name):
        raise invalid(
            "resource.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
        )
    machine_url = str(req.get("machineType", ""))
    machine = last_segment(machine_url)
    cpus = machine_vcpus(machine)
    if cpus is None or (f"zones/{zone}/" not in machine_url and "/" in machine_url):
        raise invalid(
            "resource.machineType",
            machine_url,
            f"Machine type with name '{machine}' does not exist in zone '{zone}'.",
        )
    labels = dict(req.get("labels") or {})
    for key, value in labels.items():
        if not _LABEL_KEY_RE.match(key) or not _LABEL_VALUE_RE.match(str(value)):
            raise invalid(
                "labels",
                f"{key}={value}",
                "Label keys and values must be lowercase letters, "
                "digits, '-' or '_' (at most 63 characters).",
            )
    gpu, gpu_count, accelerators = _accelerators(config, project, zone, req.get("guestAccelerators") or [])
    if (bundled := bundled_gpus(machine)) is not None:
        if accelerators:
            raise invalid(
                "resource.guestAccelerators",
                accelerators[0]["acceleratorType"],
                f"Machine type {machine} comes with its GPUs attached; do not specify guestAccelerators.",
            )
        if bundled[0] not in config.accelerators.get(zone, config.default_accelerators):
            raise invalid(
                "resource.machineType",
                machine_url,
                f"Machine type with name '{machine}' does not exist in zone '{zone}'.",
            )
        gpu, gpu_count = bundled
    scheduling = _scheduling(req.get("scheduling") or {}, gpu is not None, machine)
    spot = scheduling["provisioningModel"] == "SPOT"
    disks = _disks(project, zone, name, req.get("disks") or [])
    self_link = link(project, f"zones/{zone}/instances/{name}")
    metadata_items = [dict(item) for item in (req.get("metadata") or {}).get("items") or []]
    if config.ssh_port is not None:
        metadata_items.append({"key": "emulator-ssh-port", "value": str(config.ssh_port)})
    if config.workdir_root:
        workdir = str(Path(config.workdir_root) / name)
        metadata_items.append({"key": "emulator-workdir", "value": workdir})
    tags = list((req.get("tags") or {}).get("items") or [])
    body: dict[str, Any] = {
        "kind": "compute#instance",
        "id": inst_id,
        "creationTimestamp": stamp,
        "name": name,
        "description": req.get("description", ""),
        "tags": {"items": tags, "fingerprint": fingerprint(tags)},
        "machineType": link(project, f"zones/{zone}/machineTypes/{machine}"),
        "status": "PROVISIONING",
        "zone": link(project, f"zones/{zone}"),
        "canIpForward": bool(req.get("canIpForward", False)),
        "networkInterfaces": _nics(config, project, zone, req.get("networkInterfaces") or [{}]),
        "disks": disks,
        "metadata": {
            "kind": "compute#metadata",
            "fingerprint": fingerprint(metadata_items),
            "items": metadata_items,
        },
        "serviceAccounts": [
            {
                "email": f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
                if sa.get("email") == "default"
                else sa.get("email"),
                "scopes": list(sa.get("scopes") or []),
            }
            for sa in req.get("serviceAccounts") or []
        ],
        "selfLink": self_link,
        "scheduling": scheduling,
        "cpuPlatform": "Unknown CPU Platform",
        "labels": labels,
        "labelFingerprint": fingerprint(sorted(labels.items())),
        "startRestricted": False,
        "deletionProtection": bool(req.get("deletionProtection", False)),
        "fingerprint": fingerprint((name, inst_id)),
    }
    if accelerators:
        body["guestAccelerators"] = accelerators
    return InstanceRecord(
        project,
        zone,
        name,
        body,
        max_run_s=_max_run_s(scheduling, stamp),
        spot=spot,
        legacy_preemptible=bool(scheduling["preemptible"]) and not spot,
        termination_action=scheduling.get("instanceTerminationAction", "STOP"),
        gpu=gpu,
        gpu_count=gpu_count,
        cpus=cpus,
    )


def _accelerators(
    config: EmulatorConfig,
    project: str,
    zone: str,
    requested: list[dict[str, Any]],
) -> tuple[str | None, int, list[dict[str, Any]]]:
    available = config.accelerators.get(zone, config.default_accelerators)
    out: list[dict[str, Any]] = []
    gpu: str | None = None
    total = 0
    for i, acc in enumerate(requested):
        url = str(acc.get("acceleratorType", ""))
        kind = last_segment(url)
        count = int(acc.get("acceleratorCount", 0))
        if kind not in available or ("/" in url and f"zones/{zone}/" not in url):
            raise invalid(
                f"resource.guestAccelerators[{i}].acceleratorType",
                url,
                f"Accelerator type '{kind}' does not exist in zone '{zone}'.",
            )
        if count < 1:
            raise invalid(f"resource.guestAccelerators[{i}].acceleratorCount", count, "Must be positive.")
        gpu, total = kind, total + count
        out.append(
            {
                "acceleratorType": link(project, f"zones/{zone}/acceleratorTypes/{kind}"),
                "acceleratorCount": count,
            }
        )
    return gpu, total, out


def _max_run_s(scheduling: dict[str, Any], stamp: str) -> float | None:
    """Seconds from creation until GCE ends the VM itself (maxRunDuration or terminationTime)."""
    if "maxRunDuration" in scheduling:
        return float(scheduling["maxRunDuration"]["seconds"])
    if "terminationTime" in scheduling:
        end = datetime.fromisoformat(str(scheduling["terminationTime"]).replace("Z", "+00:00"))
        return max(0.0, (end - datetime.fromisoformat(stamp)).total_seconds())
    return None


def _time_limit(req: dict[str, Any], model: str, out: dict[str, Any]) -> None:
    """maxRunDuration / terminationTime as GCE validates them (one of them; an action with it)."""
    duration, until = req.get("maxRunDuration"), req.get("terminationTime")
    if duration is not None and until is not None:
        raise invalid("resource.scheduling.terminationTime", until, "Specify maxRunDuration or terminationTime.")
    if duration is not None:
        seconds = int((duration or {}).get("seconds", 0))
        limit = 7 * 86400 if model == "FLEX_START" else 120 * 86400
        if not 30 <= seconds <= limit:
            raise invalid("resource.scheduling.maxRunDuration.seconds", seconds, f"Must be in [30, {limit}].")
        out["maxRunDuration"] = {"seconds": str(seconds)}
    if until is not None:
        try:
            datetime.fromisoformat(str(until).replace("Z", "+00:00"))
        except ValueError:
            raise invalid("resource.scheduling.terminationTime", until, "Must be an RFC 3339 timestamp.") from None
        out["terminationTime"] = str(until)
    if model == "FLEX_START" and duration is None:
        raise invalid("resource.scheduling.maxRunDuration", "", "FLEX_START instances require maxRunDuration.")


def _scheduling(req: dict[str, Any], has_gpu: bool, machine: str = "") -> dict[str, Any]:
    model = req.get("provisioningModel") or "STANDARD"
    if model not in ("STANDARD", "SPOT", "FLEX_START"):
        raise invalid("resource.scheduling.provisioningModel", model)
    if model == "FLEX_START" and machine.split("-", 1)[0] not in FLEX_START_SERIES:
        raise invalid(
            "resource.scheduling.provisioningModel", model, f"FLEX_START is not supported for machine type {machine}."
        )
    spot = model == "SPOT"
    preemptible = bool(req.get("preemptible", False)) or spot
    maintenance = req.get("onHostMaintenance") or ("TERMINATE" if preemptible else "MIGRATE")
    restart = req.get("automaticRestart", not preemptible)
    if has_gpu and maintenance != "TERMINATE":
        raise invalid(
            "resource.scheduling.onHostMaintenance",
            maintenance,
            "Instances with guest accelerators do not support live migration.",
        )
    if preemptible and (restart or maintenance != "TERMINATE"):
        raise invalid(
            "resource.scheduling",
            "",
            "Preemptible and Spot instances cannot be automatically "
            "restarted and must terminate on host maintenance.",
        )
    out: dict[str, Any] = {
        "onHostMaintenance": maintenance,
        "automaticRestart": bool(restart),
        "preemptible": preemptible,
        "provisioningModel": model,
    }
    action = req.get("instanceTerminationAction")
    limited = req.get("maxRunDuration") is not None or req.get("terminationTime") is not None
    if action and not (spot or limited or model == "FLEX_START"):
        raise invalid(
            "resource.scheduling.instanceTerminationAction",
            action,
            "Requires provisioningModel SPOT or a time limit (maxRunDuration / terminationTime).",
        )
    if model == "FLEX_START" and (action or "DELETE") != "DELETE":
        raise invalid("resource.scheduling.instanceTerminationAction", action, "FLEX_START instances are deleted.")
    if limited and not action:
        raise invalid(
            "resource.scheduling.instanceTerminationAction", "", "Required with maxRunDuration or terminationTime."
        )
    if spot or action:
        if (action or "STOP") not in ("STOP", "DELETE"):
            raise invalid("resource.scheduling.instanceTerminationAction", action)
        out["instanceTerminationAction"] = action or "STOP"
    _time_limit(req, model, out)
    return out


def _disks(project: str, zone: str, name: str, disks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    boot = [d for d in disks if d.get("boot")]
    if len(boot) != 1:
        raise invalid("resource.disks", "", "Exactly one boot disk must be specified.")
    params = boot[0].get("initializeParams") or {}
    source_image = str(params.get("sourceImage", ""))
    if not source_image and not boot[0].get("source"):
        raise invalid("resource.disks[0].initializeParams.sourceImage", "", "Boot disk must have a source.")
    disk_name = params.get("diskName") or name
    return [
        {
            "kind": "compute#attachedDisk",
            "type": "PERSISTENT",
            "mode": "READ_WRITE",
            "source": boot[0].get("source") or link(project, f"zones/{zone}/disks/{disk_name}"),
            "deviceName": boot[0].get("deviceName") or "persistent-disk-0",
            "index": 0,
            "boot": True,
            "autoDelete": bool(boot[0].get("autoDelete", False)),
            "interface": "SCSI",
            "diskSizeGb": str(params.get("diskSizeGb") or 10),
            "architecture": "X86_64",
        }
    ]


def _nics(
    config: EmulatorConfig, project: str, zone: str, nics: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    for i, nic in enumerate(nics):
        network = last_segment(nic.get("network") or "default")
        out.append(
            {
                "kind": "compute#networkInterface",
                "name": f"nic{i}",
                "network": link(project, f"global/networks/{network}"),
                "subnetwork": link(
                    project,
                    f"regions/{region_of(zone)}/subnetworks/{last_segment(nic.get('subnetwork') or network)}",
                ),
                "networkIP": config.network_ip,
                "stackType": "IPV4_ONLY",
                "fingerprint": fingerprint(i),
                "accessConfigs": [
                    {
                        "kind": "compute#accessConfig",
                        "type": ac.get("type", "ONE_TO_ONE_NAT"),
                        "name": ac.get("name", "External NAT"),
                        "networkTier": "PREMIUM",
                    }
                    for ac in nic.get("accessConfigs") or []
                ],
            }
        )
    return out


def build_firewall(
    project: str,
    name: str,
    req: dict[str, Any],
    fw_id: str,
    stamp: str,
) -> dict[str, Any]:
    if not NAME_RE.match(name):
        raise invalid("resource.name", name)
    if not req.get("allowed") and not req.get("denied"):
        raise invalid("resource.allowed", "", "Either allowed or denied must be specified.")
    for i, rule in enumerate(list(req.get("allowed") or []) + list(req.get("denied") or [])):
        if not rule.get("IPProtocol"):
            raise invalid(f"resource.allowed[{i}].IPProtocol", "")
    body: dict[str, Any] = {
        "kind": "compute#firewall",
        "id": fw_id,
        "creationTimestamp": stamp,
        "name": name,
        "description": req.get("description", ""),
        "network": link(project, f"global/networks/{last_segment(req.get('network') or 'default')}"),
        "priority": int(req.get("priority", 1000)),
        "direction": req.get("direction") or "INGRESS",
        "disabled": bool(req.get("disabled", False)),
        "logConfig": {"enable": False},
        "selfLink": link(project, f"global/firewalls/{name}"),
    }
    for key in (
        "allowed",
        "denied",
        "sourceRanges",
        "sourceTags",
        "targetTags",
        "destinationRanges",
        "sourceServiceAccounts",
        "targetServiceAccounts",
    ):
        if req.get(key):
            body[key] = copy.deepcopy(req[key])
    return body
