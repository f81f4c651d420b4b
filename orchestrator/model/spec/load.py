"""Reading a spec: YAML file -> validated ``JobSpec``, or a ``SpecError`` listing every problem.

Nothing is created before the whole spec validates: the models, then the catalog checks, then the local
paths it names.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.model.availability import AvailabilityTraceError, load_trace
from orchestrator.model.catalog import Catalog, load_catalog
from orchestrator.model.spec.base import LOCAL_ZONE, FieldError, FieldValueError, SpecError
from orchestrator.model.spec.checks import check_against_catalog, search_too_big
from orchestrator.model.spec.job import JobSpec
from orchestrator.model.spec.provider import LocalProvider
from orchestrator.model.spec.training import CommandTraining, RunTraining
from orchestrator.model.specfile import (
    YamlFileError,
    folder_problem,
    pushed_file_problem,
    read_yaml_file,
    resolve_under,
    short,
)

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
        if isinstance(cause, FieldValueError):
            loc = (*loc, *cause.field.split("."))  # a model-level check may name a nested field: a.b
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


def _replayed_traces(local: LocalProvider, base: Path, errors: list[FieldError]) -> LocalProvider:
    """The local provider's availability traces resolved and read: each must load, reach past the start tick, and
    (several zones or GPU types) share one tick length, since they are replayed together."""
    one = local.availability_trace is not None
    fields = {("zone", zone): ("provider.availability_trace" if one else f"provider.zone_availability_traces.{zone}",
                               path) for zone, path in local.traces.items()}
    fields |= {("gpu", gpu): (f"provider.gpu_availability_traces.{gpu}", path)
               for gpu, path in local.gpu_availability_traces.items()}
    resolved, gaps = {}, {}
    for key, (field, path) in fields.items():
        resolved[key] = resolve_under(base, path)
        try:
            trace = load_trace(resolved[key])
        except AvailabilityTraceError as exc:
            errors.append(FieldError(path=field, message=str(exc)))
            continue
        gaps[field] = trace.gap_s
        if local.availability_start_tick >= len(trace.counts):
            errors.append(FieldError(path="provider.availability_start_tick", message=(
                f"{local.availability_start_tick} is past the end of {field}; give a tick below {len(trace.counts)}")))
    if len(set(gaps.values())) > 1:
        errors.append(FieldError(path=next(iter(gaps)), message=(
            "the traces are replayed tick for tick, so they need one tick length; these have "
            + ", ".join(f"{f.removeprefix('provider.')}: {g:g} s" for f, g in gaps.items()))))
    gpus = {gpu: resolved["gpu", gpu] for gpu in local.gpu_availability_traces}
    if one:
        return local.model_copy(update={"availability_trace": resolved["zone", LOCAL_ZONE],
                                        "gpu_availability_traces": gpus})
    return local.model_copy(update={"zone_availability_traces": {z: resolved["zone", z] for z in local.traces}})


def validate_spec(data: Any, catalog: Catalog | None = None, source: str = "") -> JobSpec:
    """Validate a parsed YAML document; raises ``SpecError`` listing every problem."""
    if not isinstance(data, dict):
        raise SpecError([FieldError(path="", message="the spec must be a YAML mapping (name:, cluster:, ...)")], source)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_pydantic_errors(exc), source) from None
    catalog = catalog or load_catalog()
    errors = check_against_catalog(spec, catalog) + search_too_big(spec, catalog)
    if errors:
        raise SpecError(errors, source)
    return spec


def read_spec_document(path: str | Path) -> Any:
    """The spec file's parsed YAML document (read once per verb; ``SpecError`` when it cannot be read)."""
    p = Path(path)
    try:
        return read_yaml_file(p, "job spec")
    except YamlFileError as exc:
        raise SpecError([FieldError(path="", message=str(exc))], short(str(p), 200)) from None


def spec_from_document(data: Any, path: str | Path, catalog: Catalog | None = None) -> JobSpec:
    """Validate a spec file's document, including the local paths it names, taken from the file's folder."""
    p = Path(path)
    source = short(str(p), 200)
    spec = validate_spec(data, catalog, source=source)
    spec, errors = _local_paths(spec, p.absolute().parent)
    if errors:
        raise SpecError(errors, source)
    return spec


def load_spec(path: str | Path, catalog: Catalog | None = None) -> JobSpec:
    """Read, parse and validate a spec file, including the local paths it names (nothing is created).

    Relative ``files:`` and ``provider.inventory`` are taken from the spec's folder and stored absolute,
    so a daemon started elsewhere finds them.
    """
    return spec_from_document(read_spec_document(path), path, catalog)


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
    local = spec.provider.as_local()
    if local is not None and local.traces:
        update["provider"] = _replayed_traces(local, base, errors)
    if isinstance(spec.training, CommandTraining | RunTraining):
        names: dict[str, int] = {}
        for i, f in enumerate(spec.training.files):
            problem = pushed_file_problem(base, f)
            name = resolve_under(base, f).name
            if problem is None and name in names:
                problem = f"'{short(name)}' is also files[{names[name]}]; both would land as {short(name)}"
            if problem is None and name == "jobs":  # the orchestrator's own folder on every instance
                problem = "'jobs' would land on the orchestrator's jobs/ folder on each instance; rename it"
            names.setdefault(name, i)
            if problem:
                errors.append(FieldError(path=f"training.files[{i}]", message=problem))
        files = [resolve_under(base, f) for f in spec.training.files]
        update["training"] = spec.training.model_copy(update={"files": files})
    return (spec.model_copy(update=update) if update else spec), errors


def stored_spec(spec_yaml: str) -> JobSpec:
    """A job's spec as the results DB stores it (``jobs.spec_yaml``: checked when the job was created)."""
    return validate_spec(yaml.safe_load(spec_yaml))
