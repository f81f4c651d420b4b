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
HOOK_EVENTS = ("running", "preempted", "terminated", "deleted")
Hook = Callable[[dict[str, Any]], None]

# Statuses in which an instance holds CPU/GPU quota (a TERMINATED VM only keeps its disk).
QUOTA_STATUSES = {"PROVISIONING", "STAGING", "RUNNING", "STOPPING"}
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
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
