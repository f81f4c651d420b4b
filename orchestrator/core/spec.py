"""The YAML job spec: pydantic models, validation against the catalog, field-path errors.

Every problem is reported as ``<field path>: <what is wrong>; <what is allowed>`` and nothing is
created before the whole spec validates.
"""

from __future__ import annotations

import re
import types
import typing
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.core.catalog import Catalog, CatalogError, load_catalog
from orchestrator.core.offerings import flex_start_message, machine_type_message, retired_message
from orchestrator.core.specfile import (
    MAX_CANDIDATES,
    YamlFileError,
    command_problem,
    env_problem,
    folder_problem,
    pushed_file_problem,
    read_yaml_file,
    resolve_under,
    search_size,
    short,
)

LOCAL_ZONE = "local"
_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")
SSH_USER_PATTERN = r"^[A-Za-z_][A-Za-z0-9._-]*$"  # POSIX portable user names (no newline, colon or space)
_CIDR = r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$"
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_LONG_QUOTED = re.compile(r"'([^']{61,})'")


class FieldError(BaseModel):
    path: str
    message: str

    @field_validator("path", "message")
    @classmethod
    def _one_short_line(cls, v: str) -> str:
        # Whatever echoes a user's value, the message stays one line and a long value is cut to 60 chars + '…'.
        v = _LONG_QUOTED.sub(lambda m: f"'{short(m.group(1))}'", v)
        return " ".join(v.splitlines()) if len(v) <= 2000 else " ".join(v[:2000].splitlines()) + "…"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecError(ValueError):
    """The spec is invalid; ``errors`` lists every problem with its field path."""

    def __init__(self, errors: list[FieldError], source: str = "") -> None:
        self.errors = errors
        self.source = source
        super().__init__("\n".join(str(e) for e in errors))


def parse_duration(value: str | float | int) -> float:
    """'6h', '90m', '3600s', '1.5d' or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '6h', '90m' or a number of seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    elif not isinstance(value, str):
        raise ValueError("expected a duration such as '6h', '90m' or a number of seconds")
    else:
        match = _DURATION_RE.match(value)
        if not match:
            raise ValueError(f"'{short(value)}' is not a duration; use e.g. '6h', '90m', '45s' or a number of seconds")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not 0 < seconds < 1e9:
        raise ValueError("a duration must be positive and finite")
    return seconds


def _is_number_type(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(a in (int, float) for a in args)
    return False


class _Strict(BaseModel):
    # No inf/nan anywhere; no string of a novel's length in any field.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, str_max_length=10_000)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_as_number(cls, data: Any) -> Any:
        # Pydantic's lax mode reads YAML `true` as 1: `count: true` would launch one worker without a word.
        if isinstance(data, dict):
            for name, v in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if isinstance(v, bool) and field is not None and _is_number_type(field.annotation):
                    raise _NotANumber(name)
        return data


class _NotANumber(ValueError):
    """A true/false where a number belongs; ``field`` completes the error's path."""

    def __init__(self, field: str) -> None:
        super().__init__("expected a number, not true/false")
        self.field = field


# ---------------------------------------------------------------- provider


class RevocationMode(StrEnum):
    MODEL = "model"  # lifetimes drawn from the hazard model fitted to the 2019 GCE trace
    SCHEDULE = "schedule"  # deterministic: revoke <instance> at t seconds
    NONE = "none"


class ScheduledRevocation(_Strict):
    """Revoke a slot's instance at ``at_s``; the k-th entry naming a slot applies to its k-th instance."""

    instance: str = Field(description="slot name such as 'worker-2', 'ps-0' or 'chief-0'")
    at_s: float = Field(gt=0, le=1e9, description="seconds of wall time after the job starts")

    @field_validator("instance")
    @classmethod
    def _slot(cls, v: str) -> str:
        if not re.fullmatch(r"(ps|chief|worker)-\d+", v):
            raise ValueError(f"'{short(v)}' is not a slot; use 'worker-<i>', 'ps-<i>' or 'chief-0'")
        return v


class _ProviderBase(_Strict):
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
    base_port: int = Field(default=0, ge=0, le=65000, description="0 = pick free ports")

    @model_validator(mode="after")
    def _schedule_needs_mode(self) -> LocalProvider:
        if self.schedule and self.revocations != RevocationMode.SCHEDULE:
            raise ValueError("a revocation schedule is given, so set revocations: schedule")
        return self

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
    project: str = Field(min_length=6, max_length=30)
    zones: list[str] = Field(default_factory=list, description="allowed zones, in order of preference")
    credentials: Path | None = Field(default=None, description="service-account key file; default: ADC")
    image: str = "projects/debian-cloud/global/images/family/debian-12"
    network: str = "global/networks/default"
    api_endpoint: str | None = Field(default=None, description="Compute API endpoint (emulator, tests)")
    # A POSIX login name: it goes into the ssh-keys metadata as "user:key", where a newline adds a key.
    ssh_user: str = Field(default="orchestrator", pattern=SSH_USER_PATTERN, max_length=32)
    ssh_source_ranges: list[Annotated[str, Field(pattern=_CIDR)]] | None = Field(
        default=None, description="who may SSH to the VMs; default: this controller's public address/32")
    # The network's own rules may open every port between all VMs (default-allow-internal on `default`):
    # launching there is refused (providers/gce/network.py) unless this says the exposure is accepted.
    allow_open_network: bool = False
    python: str = Field(default="python3", min_length=1, description="the payload's interpreter on the VMs")
    # 0: each task gets a distinct free port of this machine, for VMs that all answer at this machine's address
    # (e.g. the Compute API emulator); a replacement then keeps its slot's address (host and port).
    task_port: int = Field(default=2222, ge=0, le=65535, description="TF gRPC port on each VM; 0: one per slot")
    # What GCE does to a preempted (or time-limited) spot VM: DELETE (default: nothing left billing) or STOP
    # (the stopped VM keeps its boot disk, billed until the controller deletes it; the ledger prices the disk).
    termination_action: Literal["DELETE", "STOP"] = "DELETE"

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


# ---------------------------------------------------------------- training


class TrainingMode(StrEnum):
    ASYNC = "async"  # parameter servers, asynchronous updates (the 2019 study)
    SYNC = "sync"  # all-reduce, per-worker batch split


class BuiltinTraining(_Strict):
    job: Literal["resnet-cifar"] = "resnet-cifar"
    model: Literal["resnet"] = "resnet"
    hparam_set: Literal["resnet_tiny", "resnet_cifar_15", "resnet_cifar_32", "resnet_cifar_56"] = "resnet_cifar_32"
    problem: Literal["image_cifar10"] = "image_cifar10"
    data_dir: str | None = Field(default=None, description="CIFAR-10 python-pickle folder; default: offline digits")
    # tensorflow: the 2019 study's job (jobs/tfjob); pytorch: elastic DDP under torchrun (jobs/torchjob).
    framework: Literal["tensorflow", "pytorch"] = "tensorflow"
    min_workers: int | None = Field(default=None, ge=1, le=256, description="pytorch: fewest nodes that train on")
    mode: TrainingMode = TrainingMode.ASYNC
    train_steps: int = Field(default=64000, gt=0, le=10_000_000)
    batch_per_worker: int | None = Field(default=None, gt=0, le=65536)
    global_batch: int | None = Field(default=None, gt=0, le=1_048_576)
    checkpoint_every: int = Field(default=1000, gt=0, le=10_000_000)
    eval_every: int = Field(default=0, ge=0, le=10_000_000)
    log_every: int = Field(default=10, gt=0, le=10_000_000)

    @model_validator(mode="before")
    @classmethod
    def _pytorch_is_sync(cls, data: Any) -> Any:
        # DDP is synchronous: for framework: pytorch, mode defaults to sync (and async is refused below).
        if isinstance(data, dict) and data.get("framework") == "pytorch" and "mode" not in data:
            return {**data, "mode": "sync"}
        return data

    @model_validator(mode="after")
    def _batch(self) -> BuiltinTraining:
        if self.batch_per_worker is not None and self.global_batch is not None:
            raise ValueError("give batch_per_worker or global_batch, not both")
        if self.framework == "pytorch" and self.mode == TrainingMode.ASYNC:
            raise ValueError("framework: pytorch trains with synchronous DDP; use mode: sync (or leave mode out)")
        if self.framework == "tensorflow" and self.min_workers is not None:
            raise ValueError("min_workers is for framework: pytorch (elastic training); drop it")
        return self

    @property
    def profile_name(self) -> str:
        return self.hparam_set


class CommandTraining(_Strict):
    job: Literal["command"]
    command: str = Field(min_length=1, description="run on every instance; TF_CONFIG and TASK_JSON are set")
    files: list[Path] = Field(default_factory=list, description="files/folders pushed to every instance")
    mode: TrainingMode = TrainingMode.ASYNC
    train_steps: int = Field(default=1000, gt=0, le=10_000_000)
    batch_per_worker: int | None = Field(default=None, gt=0, le=65536)
    global_batch: int | None = Field(default=None, gt=0, le=1_048_576)
    checkpoint_every: int = Field(default=1000, gt=0, le=10_000_000)
    eval_every: int = Field(default=0, ge=0, le=10_000_000)
    log_every: int = Field(default=10, gt=0, le=10_000_000)
    hparam_set: str = "resnet_cifar_32"  # the profile the cost model uses to predict step times

    @property
    def profile_name(self) -> str:
        return self.hparam_set


class SecretRef(_Strict):
    """A secret the script gets as environment variable ``name``: read at task start, never stored."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
                            description="variable of the controller's environment; default: name")
    file: Path | None = Field(default=None, description="file holding the value (trailing newline dropped)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"name": data}  # `- HF_TOKEN`: from the controller's environment variable HF_TOKEN
        if isinstance(data, dict) and "value" in data:
            raise ValueError("a secret's value never goes in the spec (it is stored); use env: VAR or file: PATH")
        return data

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if self.env is not None and self.file is not None:
            raise ValueError("give env or file, not both")
        return self


class RunTraining(_Strict):
    """The user's own command under torchrun on every node (``run:``, PyTorch only)."""

    job: Literal["run"] = "run"
    framework: Literal["pytorch"] = "pytorch"
    run: str = Field(min_length=1, description="argv, split like a shell would (no shell): python train.py --lr 0.1")
    setup: str | None = Field(default=None, min_length=1, description="run once per node before torchrun")
    files: list[Path] = Field(default_factory=list, description="files/folders pushed to every instance")
    env: dict[str, str] = Field(default_factory=dict, description="environment for the script (not secret)")
    secrets: list[SecretRef] = Field(default_factory=list)
    mode: Literal[TrainingMode.SYNC] = TrainingMode.SYNC
    min_workers: int | None = Field(default=None, ge=1, le=256)
    train_steps: int = Field(default=1000, gt=0, le=10_000_000)
    batch_per_worker: int | None = Field(default=None, gt=0, le=65536)
    global_batch: int | None = Field(default=None, gt=0, le=1_048_576)
    checkpoint_every: int = Field(default=1000, gt=0, le=10_000_000)
    eval_every: int = Field(default=0, ge=0, le=10_000_000)
    log_every: int = Field(default=10, gt=0, le=10_000_000)
    hparam_set: str = "resnet_cifar_32"  # the profile the cost model uses to predict step times

    @field_validator("run", "setup")
    @classmethod
    def _argv(cls, v: str | None) -> str | None:
        problem = command_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        problem = env_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @property
    def profile_name(self) -> str:
        return self.hparam_set


def _training_kind(value: Any) -> str:
    # `job:` may be omitted: the built-in ResNet/CIFAR job is the default; a `run:` command means job: run.
    if isinstance(value, dict):
        return str(value.get("job", "run" if "run" in value else "resnet-cifar"))
    return str(getattr(value, "job", "resnet-cifar"))


TrainingSpec = Annotated[
    Annotated[BuiltinTraining, Tag("resnet-cifar")] | Annotated[CommandTraining, Tag("command")]
    | Annotated[RunTraining, Tag("run")],
    Discriminator(_training_kind),
]


# ---------------------------------------------------------------- cluster


class ParameterServers(_Strict):
    count: int | None = Field(default=None, ge=0, le=64, description="default: 1 (async), 0 (sync)")
    machine_type: str = "n1-standard-4"
    spot: bool = False
    zone: str | None = None


class Chief(_Strict):
    machine_type: str = "n1-standard-4"
    spot: bool = False
    zone: str | None = None
    # The ICAC'19 setup: the async chief runs on worker 0's VM, so it has no VM (and no bill) of its own
    # and worker 0's revocation stops it. Local provider, plan and simulate (a gce launch: not yet).
    on_worker0: bool = False


class WorkerGroup(_Strict):
    gpu: str
    count: int = Field(default=1, ge=1, le=256)
    spot: bool = True
    zone: str | None = None
    machine_type: str | None = None  # default: the GPU's usual host type from the catalog
    batch: int | None = Field(default=None, gt=0, le=65536, description="per-worker batch, overrides training")
    # flex_start: GCE Dynamic Workload Scheduler (A2/A3/A4 only): waits for capacity, then runs without preemption.
    provisioning: Literal["flex_start"] | None = None

    @field_validator("gpu")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.strip().lower()

    @model_validator(mode="before")
    @classmethod
    def _flex_start_is_not_spot(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("provisioning") == "flex_start" and "spot" not in data:
            return {**data, "spot": False}
        return data

    @model_validator(mode="after")
    def _flex_start_spot(self) -> WorkerGroup:
        if self.provisioning == "flex_start" and self.spot:
            raise ValueError("provisioning: flex_start VMs are not spot VMs; drop spot: true (or the provisioning)")
        return self


class Cluster(_Strict):
    parameter_servers: ParameterServers = Field(default_factory=ParameterServers)
    chief: Chief = Field(default_factory=Chief)
    workers: list[WorkerGroup] = Field(min_length=1)


class SearchSpace(_Strict):
    """What the planner may choose from when the spec does not pin the cluster."""

    gpus: list[str] = Field(min_length=1)
    min_workers: int = Field(default=1, ge=1, le=256)
    max_workers: int = Field(default=8, ge=1, le=256)
    max_ps: int = Field(default=3, ge=1, le=16)
    zones: list[str] = Field(default_factory=list, description="default: provider.zones")
    spot: list[bool] = Field(default_factory=lambda: [True, False], min_length=1)
    mixed: bool = Field(default=False, description="also consider clusters mixing GPU types")
    objective: Literal["cost", "time"] = "cost"

    @field_validator("gpus")
    @classmethod
    def _lower(cls, v: list[str]) -> list[str]:
        return [g.strip().lower() for g in v]

    @model_validator(mode="after")
    def _range(self) -> SearchSpace:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) is above max_workers ({self.max_workers})")
        return self


# ---------------------------------------------------------------- policy and pricing


class OnRevocation(StrEnum):
    REPLACE = "replace"  # same GPU type, next allowed zone if the first has no capacity
    SHRINK = "shrink"  # carry on with fewer workers
    FALLBACK_ON_DEMAND = "fallback-on-demand"  # replace with an on-demand instance of the same type


class Policy(_Strict):
    on_revocation: OnRevocation = OnRevocation.REPLACE
    max_replacements: int = Field(default=20, ge=0, le=10_000)
    budget_usd: float | None = Field(default=None, gt=0, le=10_000_000)
    deadline: float | None = Field(default=None, description="e.g. '6h', '90m', or seconds")

    @field_validator("deadline", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)


class PriceOverride(_Strict):
    on_demand: float = Field(ge=0, le=10_000)
    spot: float = Field(ge=0, le=10_000)


class Pricing(_Strict):
    book: str = "current"
    overrides: dict[str, PriceOverride] = Field(default_factory=dict)


# ---------------------------------------------------------------- the job


class JobSpec(_Strict):
    name: str
    provider: ProviderSpec = Field(default_factory=LocalProvider)
    storage: str = Field(default="./runs", description="local directory or gs://bucket/prefix")
    training: TrainingSpec = Field(default_factory=BuiltinTraining)
    cluster: Cluster | None = Field(default=None, description="pinned cluster; omit to let the planner choose")
    search: SearchSpace | None = None
    policy: Policy = Field(default_factory=Policy)
    pricing: Pricing = Field(default_factory=Pricing)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"'{short(v)}' is not a valid job name; use 1-32 lowercase letters, digits and '-', "
                "starting with a letter (it becomes part of every instance name)"
            )
        return v

    @field_validator("storage")
    @classmethod
    def _storage(cls, v: str) -> str:
        if v.startswith("gs://") and not re.fullmatch(r"gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/[^\x00-\x1f]*)?", v):
            raise ValueError(f"'{short(v)}' is not a valid gs:// URL; use gs://bucket/prefix")
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", v) and not v.startswith("gs://"):
            raise ValueError(f"'{short(v)}': only a local folder or gs://bucket/prefix is supported")
        if any(c < " " for c in v):
            raise ValueError("control characters (newline, NUL, ...) are not allowed in a path")
        if not v.strip():
            raise ValueError("give a local directory or gs://bucket/prefix")
        return v

    @model_validator(mode="before")
    @classmethod
    def _default_book(cls, data: Any) -> Any:
        # No pricing.book: "current" (2026-11), except a local/ssh spec whose GPUs only the 2019-02 book
        # prices (K80, P100: the 2019 study's GPUs, kept for the local provider and the simulator).
        pricing = data.get("pricing") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(pricing or {}, dict) or "book" in (pricing or {}):
            return data  # a pricing that is not a mapping is reported by validation, not a TypeError here
        book = _default_book_for(data)
        return data if book is None else {**data, "pricing": {**(data.get("pricing") or {}), "book": book}}

    @model_validator(mode="after")
    def _cluster_or_search(self) -> JobSpec:
        if self.cluster is None and self.search is None:
            raise ValueError("give cluster (what to run) or search (what the planner may choose from)")
        return self

    # ---- derived views used by the planner and the controller

    def with_cluster(self, cluster: Cluster) -> JobSpec:
        """The same job with a concrete cluster (what the planner chose)."""
        return self.model_copy(update={"cluster": cluster})

    @property
    def pinned(self) -> Cluster:
        if self.cluster is None:
            raise ValueError("the spec does not pin a cluster; run the planner first")
        return self.cluster

    @property
    def mode(self) -> TrainingMode:
        return self.training.mode

    @property
    def ps_count(self) -> int:
        count = self.cluster.parameter_servers.count if self.cluster else None
        if count is None:
            return 1 if self.mode == TrainingMode.ASYNC else 0
        return count

    @property
    def worker_count(self) -> int:
        return sum(g.count for g in self.cluster.workers) if self.cluster else 0


def _default_book_for(data: dict[Any, Any]) -> str | None:
    """'2019-02' for a local/ssh spec whose GPUs are priced there but not in the current book, else None."""
    raw = data.get("provider")
    kind = raw.get("kind", "local") if isinstance(raw, dict) else "local"
    cluster, search = data.get("cluster"), data.get("search")
    groups = cluster.get("workers") if isinstance(cluster, dict) else None
    gpus = [g.get("gpu") for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []
    if isinstance(search, dict) and isinstance(search.get("gpus"), list):
        gpus += search["gpus"]
    keys = {g.strip().lower() for g in gpus if isinstance(g, str)}
    if kind not in ("local", "ssh") or not keys:
        return None
    catalog = load_catalog()
    old, current = catalog.price_book(LEGACY_BOOK), catalog.price_book("current")
    if keys <= set(old.gpus) and not keys <= set(current.gpus):
        return LEGACY_BOOK
    return None


LEGACY_BOOK = "2019-02"  # the ICAC'19 study's prices: K80 / P100 / V100 whole VMs


# ---------------------------------------------------------------- semantic checks against the catalog


def _check_against_catalog(spec: JobSpec, catalog: Catalog) -> list[FieldError]:
    errors: list[FieldError] = []
    provider = spec.provider
    cloud = provider.is_cloud
    allowed_zones = provider.allowed_zones

    def zone_known(path: str, zone: str | None) -> None:
        if zone is None or zone == LOCAL_ZONE:
            return
        if zone not in catalog.all_zones():
            near = ", ".join(catalog.all_zones())
            errors.append(FieldError(path=path, message=f"'{zone}' is not a known zone; known: {near}"))
        elif allowed_zones and zone not in allowed_zones:
            errors.append(
                FieldError(path=path, message=f"'{zone}' is not in provider.zones ({', '.join(allowed_zones)})")
            )

    for i, z in enumerate(allowed_zones):
        zone_known(f"provider.zones[{i}]", z)

    try:
        book = catalog.price_book(spec.pricing.book)
    except CatalogError as exc:
        errors.append(FieldError(path="pricing.book", message=str(exc)))
        book = None
    for key in spec.pricing.overrides:
        if key not in catalog.gpus and key not in catalog.machine_types:
            errors.append(
                FieldError(
                    path=f"pricing.overrides.{key}",
                    message=f"'{key}' is neither a GPU type ({', '.join(catalog.gpus)}) nor a machine type",
                )
            )
    if book is not None:
        book = book.with_overrides(
            {k: (v.on_demand, v.spot) for k, v in spec.pricing.overrides.items()}, set(catalog.machine_types)
        )

    def machine_ok(path: str, name: str) -> bool:
        if name in catalog.machine_types:
            return True
        errors.append(
            FieldError(path=path, message=f"'{name}' is not a machine type; known: {', '.join(catalog.machine_types)}")
        )
        return False

    def priced(path: str, machine: str, gpu: str | None, spot: bool) -> None:
        if book is None:
            return
        try:
            book.instance_price(machine, gpu, 1 if gpu else 0, spot)
        except CatalogError as exc:
            errors.append(FieldError(path=path, message=str(exc)))

    if spec.search is not None:
        for i, key in enumerate(spec.search.gpus):
            if key not in catalog.gpus:
                errors.append(
                    FieldError(
                        path=f"search.gpus[{i}]", message=f"'{key}' is not a GPU type; known: {', '.join(catalog.gpus)}"
                    )
                )
            elif cloud and book is not None and (gone := retired_message(catalog, key, book)):
                errors.append(FieldError(path=f"search.gpus[{i}]", message=gone))
        for i, z in enumerate(spec.search.zones):
            zone_known(f"search.zones[{i}]", z)
    if spec.cluster is None:
        return errors
    cluster = spec.cluster
    cpu_roles: list[tuple[str, str, str | None, bool]] = []
    if spec.ps_count > 0:
        ps = cluster.parameter_servers
        cpu_roles.append(("cluster.parameter_servers", ps.machine_type, ps.zone, ps.spot))
    if spec.mode == TrainingMode.ASYNC and cluster.chief.on_worker0 and cloud:
        errors.append(FieldError(path="cluster.chief.on_worker0", message=(
            "a gce launch cannot co-locate the chief with worker 0 yet; use it with the local provider, "
            "or drop it (the chief then gets its own VM)")))
    if spec.mode == TrainingMode.ASYNC and not cluster.chief.on_worker0:
        ch = cluster.chief
        cpu_roles.append(("cluster.chief", ch.machine_type, ch.zone, ch.spot))
    for path, machine, zone, spot in cpu_roles:
        zone_known(f"{path}.zone", zone)
        local_machine = machine if cloud else "local"
        if machine_ok(f"{path}.machine_type", machine):
            priced(f"{path}.machine_type", local_machine, None, spot)

    for i, group in enumerate(cluster.workers):
        path = f"cluster.workers[{i}]"
        if group.gpu not in catalog.gpus:
            errors.append(
                FieldError(
                    path=f"{path}.gpu", message=f"'{group.gpu}' is not a GPU type; known: {', '.join(catalog.gpus)}"
                )
            )
            continue
        gpu = catalog.gpus[group.gpu]
        machine = group.machine_type or gpu.default_machine_type
        if group.machine_type is not None:
            machine_ok(f"{path}.machine_type", group.machine_type)
        if cloud and book is not None and (gone := retired_message(catalog, gpu.key, book)):
            errors.append(FieldError(path=f"{path}.gpu", message=gone))
            continue
        if cloud and (wrong := machine_type_message(catalog, gpu.key, group.machine_type)):
            errors.append(FieldError(path=f"{path}.machine_type", message=wrong))
            continue
        if group.provisioning == "flex_start" and (not cloud or flex_start_message(machine)):
            why = flex_start_message(machine) or "provisioning: flex_start needs provider kind: gce"
            errors.append(FieldError(path=f"{path}.provisioning", message=why))
        zone_known(f"{path}.zone", group.zone)
        offered = catalog.zones_for(gpu.key)
        if group.zone and group.zone != LOCAL_ZONE and group.zone in catalog.all_zones() and group.zone not in offered:
            errors.append(
                FieldError(
                    path=path,
                    message=f"{gpu.gce_accelerator} is not offered in zone {group.zone}; "
                    f"it is in: {', '.join(offered)}",
                )
            )
        if cloud and group.zone is None:
            candidates = [z for z in allowed_zones if z in offered]
            if not candidates:
                where = f"provider.zones ({', '.join(allowed_zones)})" if allowed_zones else "no zone given"
                errors.append(
                    FieldError(
                        path=f"{path}.zone",
                        message=f"no zone for {gpu.gce_accelerator}: {where}; it is offered in: {', '.join(offered)}",
                    )
                )
        priced(f"{path}.gpu", machine if cloud else "local", gpu.key, group.spot)
        batch = group.batch or spec.training.batch_per_worker
        if batch is not None:
            from orchestrator.core.costmodel.memory import (
                max_batch,  # the memory model (weights, optimizer, activations)
            )

            cap = max_batch(spec.training.profile_name, gpu.key)
            if batch > cap:
                errors.append(
                    FieldError(
                        path=f"{path}.batch" if group.batch else "training.batch_per_worker",
                        message=f"batch {batch} does not fit a {gpu.key}'s {gpu.memory_gb:g} GB "
                        f"for {spec.training.profile_name}; at most {cap}",
                    )
                )

    ps_count = cluster.parameter_servers.count
    if spec.mode == TrainingMode.SYNC and ps_count:
        errors.append(
            FieldError(
                path="cluster.parameter_servers.count",
                message="synchronous training uses all-reduce, not parameter servers; set 0 or training.mode: async",
            )
        )
    if spec.mode == TrainingMode.ASYNC and ps_count == 0:
        errors.append(
            FieldError(
                path="cluster.parameter_servers.count", message="async training needs at least 1 parameter server"
            )
        )
    if (local := provider.as_local()) is not None:
        slots = {f"ps-{i}" for i in range(spec.ps_count)} | {f"worker-{i}" for i in range(spec.worker_count)}
        if spec.mode == TrainingMode.ASYNC:
            slots.add("chief-0")
        for i, item in enumerate(local.schedule):
            if item.instance not in slots:
                errors.append(
                    FieldError(
                        path=f"provider.schedule[{i}].instance",
                        message=f"'{item.instance}' is not in this cluster; slots: {', '.join(sorted(slots))}",
                    )
                )
    if spec.training.global_batch is not None and spec.training.global_batch < spec.worker_count:
        errors.append(
            FieldError(
                path="training.global_batch",
                message=f"{spec.training.global_batch} is smaller than the {spec.worker_count} workers; give each >= 1",
            )
        )
    return errors


# ---------------------------------------------------------------- loading

_UNIONS = {"provider": {"local", "ssh", "gce"}, "training": {"resnet-cifar", "command", "run"}}


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i > 0 and loc[i - 1] in _UNIONS and part in _UNIONS[str(loc[i - 1])]:
            continue  # the union member pydantic tried: a tag, not a field the user wrote
        elif not re.fullmatch(r"[A-Za-z0-9_-]+", part):
            out += f"[{short(part)!r}]"  # a key the user wrote with odd characters: quote it, keep one line
        else:
            out += f".{short(part)}" if out else short(part)
    return out


def _pydantic_errors(exc: ValidationError) -> list[FieldError]:
    out = []
    for err in exc.errors():
        msg = str(err.get("msg", "invalid"))
        msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        kind = err.get("type", "")
        loc = tuple(err.get("loc", ()))
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, _NotANumber):
            loc = (*loc, cause.field)
        if kind == "extra_forbidden":
            msg = "unknown field; check the spelling (see README: job spec)"
        elif kind == "missing":
            msg = "required field is missing"
        elif kind == "union_tag_invalid":
            ctx = err.get("ctx") or {}
            msg = f"{ctx.get('tag')!r} is not one of: {ctx.get('expected_tags')}"
        elif kind == "union_tag_not_found":
            msg = "say which kind: " + str((err.get("ctx") or {}).get("discriminator", ""))
        out.append(FieldError(path=_loc_to_path(loc), message=msg))
    return out


def validate_spec(data: Any, catalog: Catalog | None = None, source: str = "") -> JobSpec:
    """Validate a parsed YAML document; raises ``SpecError`` listing every problem."""
    if not isinstance(data, dict):
        raise SpecError([FieldError(path="", message="the spec must be a YAML mapping (name:, cluster:, ...)")], source)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_pydantic_errors(exc), source) from None
    catalog = catalog or load_catalog()
    errors = _check_against_catalog(spec, catalog) + _search_too_big(spec, catalog)
    if errors:
        raise SpecError(errors, source)
    return spec


def _search_too_big(spec: JobSpec, catalog: Catalog) -> list[FieldError]:
    # A search of 11 GPU types x 256 mixed workers would keep `plan` and `launch` busy for days.
    s = spec.search
    if s is None or spec.cluster is not None:
        return []
    zones = s.zones or spec.provider.allowed_zones
    if not zones and spec.provider.is_cloud:
        zones = sorted({z for g in s.gpus if g in catalog.gpus for z in catalog.zones_for(g)})
    ps = s.max_ps if spec.mode == TrainingMode.ASYNC else 1
    size = search_size(len(set(s.gpus)), s.min_workers, s.max_workers, s.mixed, len(zones), len(set(s.spot)), ps)
    if size <= MAX_CANDIDATES:
        return []
    return [FieldError(path="search", message=f"about {size:,} candidate clusters (GPU types x workers x zones x "
                       f"spot x parameter servers); the planner takes at most {MAX_CANDIDATES:,}: lower "
                       "max_workers or max_ps, list fewer gpus or zones, or set mixed: false")]


def load_spec(path: str | Path, catalog: Catalog | None = None) -> JobSpec:
    """Read, parse and validate a spec file, including the local paths it names (nothing is created).

    Relative ``files:`` and ``provider.inventory`` are taken from the spec's folder and stored absolute,
    so a daemon started elsewhere finds them.
    """
    p = Path(path)
    source = short(str(p), 200)
    try:
        data = read_yaml_file(p, "job spec")
    except YamlFileError as exc:
        raise SpecError([FieldError(path="", message=str(exc))], source) from None
    spec = validate_spec(data, catalog, source=source)
    spec, errors = _local_paths(spec, p.absolute().parent)
    if errors:
        raise SpecError(errors, source)
    return spec


def _local_paths(spec: JobSpec, base: Path) -> tuple[JobSpec, list[FieldError]]:
    """Check the local folders and files a spec names; absolute ``files:`` / inventory paths in the copy."""
    errors: list[FieldError] = []
    if not spec.storage.startswith("gs://"):
        problem = folder_problem(Path(spec.storage).expanduser().absolute())
        if problem:
            errors.append(FieldError(path="storage", message=problem))
    update: dict[str, Any] = {}
    if (listed := spec.provider.inventory_path) is not None:
        inventory = resolve_under(base, listed)
        try:
            read_yaml_file(inventory, "inventory")
        except YamlFileError as exc:
            errors.append(FieldError(path="provider.inventory", message=str(exc)))
        update["provider"] = spec.provider.model_copy(update={"inventory": inventory})
    if isinstance(spec.training, CommandTraining | RunTraining):
        names: dict[str, int] = {}
        for i, f in enumerate(spec.training.files):
            problem = pushed_file_problem(base, f)
            name = resolve_under(base, f).name
            if problem is None and name in names:
                problem = f"'{short(name)}' is also files[{names[name]}]; both would land as {short(name)}"
            names.setdefault(name, i)
            if problem:
                errors.append(FieldError(path=f"training.files[{i}]", message=problem))
        files = [resolve_under(base, f) for f in spec.training.files]
        update["training"] = spec.training.model_copy(update={"files": files})
    return (spec.model_copy(update=update) if update else spec), errors
