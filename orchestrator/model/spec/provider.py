"""``provider:`` of the spec: where the instances come from (local, ssh, gce), one model per kind."""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.model.spec.base import LOCAL_ZONE, FieldValueError, StrictModel
from orchestrator.model.spec.fields import CidrRange, GceImage, GceNetwork, GceProjectId, UserPort
from orchestrator.model.specfile import short

SSH_USER_PATTERN = r"^[A-Za-z_][A-Za-z0-9._-]*$"  # POSIX portable user names (no newline, colon or space)
# A service account email (user-made or the project's Compute default), or "none".
_SERVICE_ACCOUNT = (r"^(none|[a-z][a-z0-9-]{4,29}@[a-z0-9.-]+\.iam\.gserviceaccount\.com"
                    r"|[0-9]+-compute@developer\.gserviceaccount\.com)$")


# provider.api_endpoint: [scheme://]host[:port], nothing else (no user@, path or query: what the client joins to
# its request paths, parsed one way). The client takes a bare host as https.
_ENDPOINT = re.compile(r"(?:(?P<scheme>https?)://)?(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9.])?"
                       r"|\[[0-9A-Fa-f:.]{2,45}\])(?::(?P<port>[0-9]{1,5}))?")
# Credentials (an OAuth bearer token) go only over https to googleapis.com or a host under it: the global
# compute.googleapis.com, Private Google Access (private.googleapis.com, restricted.googleapis.com,
# https://cloud.google.com/vpc/docs/configure-private-google-access), Private Service Connect endpoints
# (*.p.googleapis.com, https://cloud.google.com/vpc/docs/configure-private-service-connect-apis) and regional
# endpoints (*.rep.googleapis.com, https://cloud.google.com/storage/docs/regional-endpoints).
GOOGLE_API_DOMAIN = "googleapis.com"
ENDPOINT_FIX = ("use https://compute.googleapis.com (or another *.googleapis.com host), or http://127.0.0.1:PORT "
                "for a Compute API on this machine (called without credentials)")


def _endpoint_host(url: str) -> tuple[str, str] | None:
    """(scheme, host) of an endpoint of the accepted form, the host lowercased; None for any other string."""
    m = _ENDPOINT.fullmatch(url)
    if m is None or (m["port"] is not None and not 0 < int(m["port"]) < 65536):
        return None
    return m["scheme"] or "https", m["host"].lower().strip("[]").rstrip(".")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_endpoint(url: str | None) -> bool:
    """``url`` is a Compute API on this machine (localhost, 127.0.0.0/8, ::1): it is called with anonymous
    credentials, and its VMs are reached from here at 127.0.0.1. False for None (GCE itself) and other hosts."""
    parsed = _endpoint_host(url) if url else None
    return parsed is not None and _is_loopback(parsed[1])


def check_api_endpoint(url: str) -> str:
    """``url`` if the Compute API may be called there; else a ValueError naming what is wrong and the fix."""
    parsed = _endpoint_host(url)
    if parsed is None:
        raise ValueError(f"'{short(url)}' is not an endpoint of the form [https://]HOST[:PORT] "
                         f"(no user, path or query); {ENDPOINT_FIX}")
    scheme, host = parsed
    if _is_loopback(host):
        return url
    google = host == GOOGLE_API_DOMAIN or host.endswith("." + GOOGLE_API_DOMAIN)
    if not google:
        raise ValueError(f"'{short(url)}' is not a Google API host (credentials go only to *.{GOOGLE_API_DOMAIN} "
                         f"over https); {ENDPOINT_FIX}")
    if scheme != "https":
        raise ValueError(f"'{short(url)}' would send your credentials unencrypted; use https://{host}")
    return url


class RevocationMode(StrEnum):
    MODEL = "model"  # lifetimes drawn from the hazard model fitted to the 2019 GCE trace
    SCHEDULE = "schedule"  # deterministic: revoke <instance> at t seconds
    NONE = "none"


class ScheduledRevocation(StrictModel):
    """Revoke a slot's instance at ``at_s`` (wall time) or ``at_step`` (when the job's training reaches that
    step: the same step however loaded the machine); the k-th entry naming a slot applies to its k-th instance."""

    instance: str = Field(description="slot name such as 'worker-2', 'ps-0' or 'chief-0'")
    at_s: float | None = Field(default=None, gt=0, le=1e9, description="seconds of wall time after the job starts")
    at_step: int | None = Field(default=None, ge=1, le=10_000_000,
                                description="the global training step at which the notice comes")

    @model_validator(mode="after")
    def _one_clock(self) -> ScheduledRevocation:
        if (self.at_s is None) == (self.at_step is None):
            raise ValueError("give exactly one of at_s (seconds after the job starts) or at_step (a training step)")
        return self

    @field_validator("instance")
    @classmethod
    def _slot(cls, v: str) -> str:
        if not re.fullmatch(r"(ps|chief|worker)-\d+", v):
            raise ValueError(f"'{short(v)}' is not a slot; use 'worker-<i>', 'ps-<i>' or 'chief-0'")
        return v


class Slowdown(StrictModel):
    """An emulated GPU that slows mid-run (a noisy neighbour, thermal throttling): the local provider only."""

    worker: int = Field(ge=0, le=255, description="worker slot index (worker-N)")
    at_step: int = Field(ge=0, le=10_000_000, description="training step from which it is slower")
    factor: float = Field(gt=0, le=100, description="its step takes this many times as long (2: half speed)")


class _ProviderBase(StrictModel):
    """What the rest of the product asks a provider spec, answered per kind (no isinstance dispatch)."""

    # gce: machines rented from a cloud (zones, machine types, blocks, quotas, Compute requests).
    is_cloud: ClassVar[bool] = False
    # local: GPUs emulated on this host (measured step curves, simulated revocations, scaled time).
    emulates_gpus: ClassVar[bool] = False

    @property
    def allowed_zones(self) -> list[str]:
        """The zones a launch may use, in order of preference; [] where zones mean nothing (local, ssh)."""
        return []

    @property
    def inventory_path(self) -> Path | None:
        """The ssh inventory file; None for providers without one."""
        return None

    @property
    def stopped_disk_billed(self) -> bool:
        """A preempted VM leaves a stopped boot disk that bills until deleted (gce termination_action STOP)."""
        return False

    def as_local(self) -> LocalProvider | None:
        """This spec as a local provider (its revocation model, seed, emulation speed), else None."""
        return None

    def as_gce(self) -> GceProvider | None:
        """This spec as a gce provider (project, endpoint, image), else None."""
        return None

    def owner_key(self) -> str:
        """Whose blocks and quotas these are: one cloud project or inventory; never credentials."""
        return self.kind_name()

    @classmethod
    def kind_name(cls) -> str:
        return str(cls.model_fields["kind"].default)


class _RealTime(_ProviderBase):
    @property
    def time_scale(self) -> float:
        """Seconds of cloud time per wall second: 1 on real machines."""
        return 1.0


# A local provider's zone: a name of the user's choice (lowercase letters, digits, hyphens).
ZoneName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,39}$")]


class LocalProvider(_ProviderBase):
    kind: Literal["local"] = "local"
    emulates_gpus: ClassVar[bool] = True
    # One real second stands for `time_scale` seconds of cloud time (lifetimes, notice window, boot delay).
    # Bounded: 1e-300 would stretch a 70 s boot past the age of the universe (a hang, not an error).
    time_scale: float = Field(default=60.0, ge=0.01, le=100_000)
    revocations: RevocationMode = RevocationMode.MODEL
    schedule: list[ScheduledRevocation] = Field(default_factory=list)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    # Emulated GPU speed: seconds of sleep per step for the slowest GPU in the catalog (K80); faster
    # types sleep proportionally less (ratio from the cost model, which uses the catalog specs).
    emulation_k80_step_s: float = Field(default=0.3, ge=0, le=60)
    base_port: UserPort = Field(default=0, ge=0, le=65000, description="0 = pick free ports")
    # A measured spot availability trace (shared/spot-traces JSON) replayed from this tick, its gap scaled by
    # time_scale: a spot create is refused (stockout) while it reads 0, a spot VM is revoked when it drops to 0.
    availability_trace: Path | None = Field(default=None, description="spot availability trace (JSON) to replay")
    availability_start_tick: int = Field(default=0, ge=0, le=10_000_000)
    # One trace per zone, replayed from the same tick: a job that may run spot in any of these zones (the deadline
    # policy picks the zone, decide/deadline_zones.py). Instead of availability_trace.
    zone_availability_traces: dict[ZoneName, Path] = Field(
        default_factory=dict, description="zone -> spot availability trace (JSON), two or more")
    # Another GPU type's trace, replayed from the same tick for the instances of that type (policy.also_gpus);
    # the others replay availability_trace. With availability_trace only.
    gpu_availability_traces: dict[str, Path] = Field(
        default_factory=dict, description="GPU type -> spot availability trace (JSON) of its instances")
    slowdowns: list[Slowdown] = Field(default_factory=list, description="emulated GPUs that slow mid-run")

    @field_validator("gpu_availability_traces")
    @classmethod
    def _gpus_lower(cls, v: dict[str, Path]) -> dict[str, Path]:
        return {g.strip().lower(): path for g, path in v.items()}

    @model_validator(mode="after")
    def _schedule_needs_mode(self) -> LocalProvider:
        if self.schedule and self.revocations != RevocationMode.SCHEDULE:
            raise ValueError("a revocation schedule is given, so set revocations: schedule")
        traced = "availability_trace" if self.availability_trace is not None else "zone_availability_traces" \
            if self.zone_availability_traces else None
        if traced is not None and self.revocations != RevocationMode.NONE:
            raise ValueError(f"{traced} revokes spot VMs where the trace drops to 0; set revocations: none")
        if self.availability_trace is not None and self.zone_availability_traces:
            raise ValueError("give availability_trace (one zone) or zone_availability_traces (several), not both")
        if self.gpu_availability_traces and self.availability_trace is None:
            raise ValueError("gpu_availability_traces goes with availability_trace (the job's own GPU type's trace)")
        if len(self.zone_availability_traces) == 1:
            raise ValueError("zone_availability_traces names one zone; give two or more, or use availability_trace")
        return self

    @property
    def traces(self) -> dict[str, Path]:
        """The replayed availability traces by zone (one trace: the local zone's); {} without any."""
        if self.availability_trace is not None:
            return {LOCAL_ZONE: self.availability_trace}
        return dict(self.zone_availability_traces)

    def as_local(self) -> LocalProvider:
        return self


class SshProvider(_RealTime):
    kind: Literal["ssh"] = "ssh"
    inventory: Path = Field(description="YAML file listing your machines (host, port, user, key, gpu, ...)")

    @property
    def inventory_path(self) -> Path:
        return self.inventory

    def owner_key(self) -> str:
        return f"ssh:{self.inventory.expanduser().resolve()}"


class GceProvider(_RealTime):
    kind: Literal["gce"] = "gce"
    is_cloud: ClassVar[bool] = True
    project: GceProjectId
    zones: list[str] = Field(default_factory=list, description="allowed zones, in order of preference")
    credentials: Path | None = Field(default=None, description="service-account key file; default: ADC")
    # None: a Deep Learning VM image with the NVIDIA driver, per GPU and framework (data/gce_images.csv).
    image: GceImage | None = Field(default=None, min_length=1, max_length=300)
    # "installer": a stock image (debian-12, ubuntu) gets Google's cuda_installer.pyz at boot (it reboots once).
    gpu_driver: Literal["image", "installer"] = "image"
    # None: the family's default from data/gce_rules.csv (hyperdisk-balanced on A3 Ultra / A4 / G4, else pd-balanced).
    boot_disk_type: Literal["pd-balanced", "pd-ssd", "pd-standard", "hyperdisk-balanced"] | None = None
    # scheduling.preemptionNoticeDuration (Preview): a Spot VM gets 120 s of notice instead of 30 s.
    preemption_notice_s: Literal[0, 120] = 0
    # The VMs' identity, always with the storage scope only (never cloud-platform): an email (a per-job
    # account is best), None = the project's default account, "none" = no account (storage not on gs://).
    service_account: str | None = Field(default=None, pattern=_SERVICE_ACCOUNT, max_length=100)
    network: GceNetwork = "global/networks/default"
    # None: compute.googleapis.com. Credentials go only to https Google API hosts; a loopback host gets none.
    api_endpoint: str | None = Field(default=None, max_length=300,
                                     description="Compute API endpoint: https://*.googleapis.com, or loopback")
    # A POSIX login name: it goes into the ssh-keys metadata as "user:key", where a newline adds a key.
    ssh_user: str = Field(default="orchestrator", pattern=SSH_USER_PATTERN, max_length=32)
    ssh_source_ranges: list[CidrRange] | None = Field(
        default=None, description="who may SSH to the VMs; default: this controller's public address/32")
    # The network's own rules may open every port between all VMs (default-allow-internal on `default`):
    # launching there is refused (providers/gce/network.py) unless this says the exposure is accepted.
    allow_open_network: bool = False
    python: str = Field(default="python3", min_length=1, description="the payload's interpreter on the VMs")
    # 0: each task gets a distinct free port of this machine, for VMs that all answer at this machine's address
    # (a Compute API on loopback); a replacement then keeps its slot's address (host and port).
    task_port: UserPort = Field(default=2222, ge=0, le=65535, description="TF gRPC port on each VM; 0: one per slot")
    # What GCE does to a preempted (or time-limited) spot VM: DELETE (default: nothing left billing) or STOP
    # (the stopped VM keeps its boot disk, billed until the controller deletes it; the ledger prices the disk).
    termination_action: Literal["DELETE", "STOP"] = "DELETE"

    @field_validator("api_endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        return None if v is None else check_api_endpoint(v)

    @model_validator(mode="after")
    def _no_key_for_loopback(self) -> GceProvider:
        if self.credentials is not None and loopback_endpoint(self.api_endpoint):
            raise FieldValueError("credentials", "a key file is never sent to a loopback api_endpoint (its calls "
                                  "carry no credentials); drop provider.credentials, or the api_endpoint")
        return self

    @property
    def allowed_zones(self) -> list[str]:
        return list(self.zones)

    @property
    def stopped_disk_billed(self) -> bool:
        return self.termination_action == "STOP"

    def as_gce(self) -> GceProvider:
        return self

    def owner_key(self) -> str:
        return f"gce:{self.project}:{self.api_endpoint or ''}"


ProviderSpec = Annotated[LocalProvider | SshProvider | GceProvider, Field(discriminator="kind")]
