"""The YAML job spec: pydantic models, validation against the catalog, field-path errors.

Every problem is reported as ``<field path>: <what is wrong>; <what is allowed>`` and nothing is
created before the whole spec validates.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
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

from orchestrator.catalog import Catalog, CatalogError, load_catalog

LOCAL_ZONE = "local"
_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


class FieldError(BaseModel):
    path: str
    message: str

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
            raise ValueError(f"'{value}' is not a duration; use e.g. '6h', '90m', '45s' or a number of seconds")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not 0 < seconds < 1e9:
        raise ValueError("a duration must be positive and finite")
    return seconds


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- provider


class RevocationMode(StrEnum):
    MODEL = "model"  # lifetimes drawn from the hazard model fitted to the 2019 GCE trace
    SCHEDULE = "schedule"  # deterministic: revoke <instance> at t seconds
    NONE = "none"


class ScheduledRevocation(_Strict):
    """Revoke a slot's instance at ``at_s``; the k-th entry naming a slot applies to its k-th instance."""

    instance: str = Field(description="slot name such as 'worker-2', 'ps-0' or 'chief-0'")
    at_s: float = Field(gt=0, description="seconds of wall time after the job starts")

    @field_validator("instance")
    @classmethod
    def _slot(cls, v: str) -> str:
        if not re.fullmatch(r"(ps|chief|worker)-\d+", v):
            raise ValueError(f"'{v}' is not a slot; use 'worker-<i>', 'ps-<i>' or 'chief-0'")
        return v


class LocalProvider(_Strict):
    kind: Literal["local"] = "local"
    # One real second stands for `time_scale` seconds of cloud time (lifetimes, notice window, boot delay).
    time_scale: float = Field(default=60.0, gt=0)
    revocations: RevocationMode = RevocationMode.MODEL
    schedule: list[ScheduledRevocation] = Field(default_factory=list)
    seed: int = 0
    # Emulated GPU speed: seconds of sleep per step for the slowest GPU in the catalog (K80); faster
    # types sleep proportionally less (ratio from the cost model, which uses the catalog specs).
    emulation_k80_step_s: float = Field(default=0.3, ge=0)
    base_port: int = Field(default=0, ge=0, le=65000, description="0 = pick free ports")

    @model_validator(mode="after")
    def _schedule_needs_mode(self) -> LocalProvider:
        if self.schedule and self.revocations != RevocationMode.SCHEDULE:
            raise ValueError("a revocation schedule is given, so set revocations: schedule")
        return self


class SshProvider(_Strict):
    kind: Literal["ssh"] = "ssh"
    inventory: Path = Field(description="YAML file listing your machines (host, port, user, key, gpu, ...)")


class GceProvider(_Strict):
    kind: Literal["gce"] = "gce"
    project: str = Field(min_length=6, max_length=30)
    zones: list[str] = Field(default_factory=list, description="allowed zones, in order of preference")
    credentials: Path | None = Field(default=None, description="service-account key file; default: ADC")
    image: str = "projects/debian-cloud/global/images/family/debian-12"
    network: str = "global/networks/default"
    api_endpoint: str | None = Field(default=None, description="Compute API endpoint (emulator, tests)")
    ssh_user: str = "orchestrator"


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
    mode: TrainingMode = TrainingMode.ASYNC
    train_steps: int = Field(default=64000, gt=0, le=10_000_000)
    batch_per_worker: int | None = Field(default=None, gt=0, le=65536)
    global_batch: int | None = Field(default=None, gt=0, le=1_048_576)
    checkpoint_every: int = Field(default=1000, gt=0)
    eval_every: int = Field(default=0, ge=0)
    log_every: int = Field(default=10, gt=0)

    @model_validator(mode="after")
    def _batch(self) -> BuiltinTraining:
        if self.batch_per_worker is not None and self.global_batch is not None:
            raise ValueError("give batch_per_worker or global_batch, not both")
        return self

    @property
    def profile_name(self) -> str:
        return self.hparam_set


class CommandTraining(_Strict):
    job: Literal["command"]
    command: str = Field(min_length=1, description="run on every instance; TF_CONFIG and TASK_JSON are set")
    files: list[Path] = Field(default_factory=list, description="files/folders pushed to every instance")
    mode: TrainingMode = TrainingMode.ASYNC
    train_steps: int = Field(default=1000, gt=0)
    batch_per_worker: int | None = Field(default=None, gt=0)
    global_batch: int | None = Field(default=None, gt=0)
    checkpoint_every: int = Field(default=1000, gt=0)
    eval_every: int = Field(default=0, ge=0)
    log_every: int = Field(default=10, gt=0)
    hparam_set: str = "resnet_cifar_32"  # the profile the cost model uses to predict step times

    @property
    def profile_name(self) -> str:
        return self.hparam_set


def _training_kind(value: Any) -> str:
    # `job:` may be omitted: the built-in ResNet/CIFAR job is the default.
    if isinstance(value, dict):
        return str(value.get("job", "resnet-cifar"))
    return str(getattr(value, "job", "resnet-cifar"))


TrainingSpec = Annotated[
    Annotated[BuiltinTraining, Tag("resnet-cifar")] | Annotated[CommandTraining, Tag("command")],
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


class WorkerGroup(_Strict):
    gpu: str
    count: int = Field(default=1, ge=1, le=256)
    spot: bool = True
    zone: str | None = None
    machine_type: str | None = None  # default: the GPU's usual host type from the catalog
    batch: int | None = Field(default=None, gt=0, description="per-worker batch, overrides training")

    @field_validator("gpu")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.strip().lower()


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
    max_replacements: int = Field(default=20, ge=0)
    budget_usd: float | None = Field(default=None, gt=0)
    deadline: float | None = Field(default=None, description="e.g. '6h', '90m', or seconds")

    @field_validator("deadline", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)


class PriceOverride(_Strict):
    on_demand: float = Field(ge=0)
    spot: float = Field(ge=0)


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
                f"'{v}' is not a valid job name; use 1-32 lowercase letters, digits and '-', "
                "starting with a letter (it becomes part of every instance name)"
            )
        return v

    @field_validator("storage")
    @classmethod
    def _storage(cls, v: str) -> str:
        if v.startswith("gs://") and not re.fullmatch(r"gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?", v):
            raise ValueError(f"'{v}' is not a valid gs:// URL; use gs://bucket/prefix")
        if not v.strip():
            raise ValueError("give a local directory or gs://bucket/prefix")
        return v

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


# ---------------------------------------------------------------- semantic checks against the catalog


def _check_against_catalog(spec: JobSpec, catalog: Catalog) -> list[FieldError]:
    errors: list[FieldError] = []
    provider = spec.provider
    cloud = isinstance(provider, GceProvider)
    allowed_zones = provider.zones if isinstance(provider, GceProvider) else []

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
        for i, z in enumerate(spec.search.zones):
            zone_known(f"search.zones[{i}]", z)
    if spec.cluster is None:
        return errors
    cluster = spec.cluster
    cpu_roles: list[tuple[str, str, str | None, bool]] = []
    if spec.ps_count > 0:
        ps = cluster.parameter_servers
        cpu_roles.append(("cluster.parameter_servers", ps.machine_type, ps.zone, ps.spot))
    if spec.mode == TrainingMode.ASYNC:
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
            from orchestrator.costmodel.memory import max_batch  # the memory model (weights, optimizer, activations)

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
    if isinstance(provider, LocalProvider):
        slots = {f"ps-{i}" for i in range(spec.ps_count)} | {f"worker-{i}" for i in range(spec.worker_count)}
        if spec.mode == TrainingMode.ASYNC:
            slots.add("chief-0")
        for i, item in enumerate(provider.schedule):
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

_UNIONS = {"provider": {"local", "ssh", "gce"}, "training": {"resnet-cifar", "command"}}


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i > 0 and loc[i - 1] in _UNIONS and part in _UNIONS[str(loc[i - 1])]:
            continue  # the union member pydantic tried: a tag, not a field the user wrote
        elif not re.fullmatch(r"[A-Za-z0-9_-]+", part):
            out += f"[{part!r}]"  # a key the user wrote with odd characters: quote it, keep one line
        else:
            out += f".{part}" if out else str(part)
    return out


def _pydantic_errors(exc: ValidationError) -> list[FieldError]:
    out = []
    for err in exc.errors():
        msg = str(err.get("msg", "invalid"))
        msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            msg = "unknown field; check the spelling (see README: job spec)"
        elif kind == "missing":
            msg = "required field is missing"
        elif kind == "union_tag_invalid":
            ctx = err.get("ctx") or {}
            msg = f"{ctx.get('tag')!r} is not one of: {ctx.get('expected_tags')}"
        elif kind == "union_tag_not_found":
            msg = "say which kind: " + str((err.get("ctx") or {}).get("discriminator", ""))
        out.append(FieldError(path=_loc_to_path(tuple(err.get("loc", ()))), message=msg))
    return out


def validate_spec(data: Any, catalog: Catalog | None = None, source: str = "") -> JobSpec:
    """Validate a parsed YAML document; raises ``SpecError`` listing every problem."""
    if not isinstance(data, dict):
        raise SpecError([FieldError(path="", message="the spec must be a YAML mapping (name:, cluster:, ...)")], source)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_pydantic_errors(exc), source) from None
    errors = _check_against_catalog(spec, catalog or load_catalog())
    if errors:
        raise SpecError(errors, source)
    return spec


def load_spec(path: str | Path, catalog: Catalog | None = None) -> JobSpec:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError([FieldError(path="", message=f"cannot read {p}: {exc.strerror}")], str(p)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([FieldError(path="", message=f"not valid YAML: {exc}")], str(p)) from None
    return validate_spec(data, catalog, source=str(p))
