"""What every part of the spec shares: field-path errors, the strict base model, durations."""

from __future__ import annotations

import re
import types
import typing
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from orchestrator.model.specfile import short

LOCAL_ZONE = "local"
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
# A quoted value: not the text between two quoted values ("' is not one of '"), which starts or ends with a space
# or punctuation.
_LONG_QUOTED = re.compile(r"'([^'\s,.;:)][^']{59,}[^'\s(])'")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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

    what = "job spec"  # how an error names the file (the CLI's one line)

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


class StrictModel(BaseModel):
    """The base of every spec model: unknown fields, inf/nan and a true/false number are errors."""

    # No inf/nan anywhere; no string of a novel's length in any field.
    # A field with a spec spelling of its own (training.batch: batch_per_worker) dumps under it, so a dumped spec
    # (the stored spec_yaml) validates again.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, str_max_length=10_000,
                              serialize_by_alias=True)

    @field_validator("*", mode="after")
    @classmethod
    def _no_control_characters(cls, v: Any) -> Any:
        # Every string of the spec reaches a command line, a path, a request or an instance name: a newline in
        # `network` or `data_dir` would start a new line there (13 restarts a minute). Per field, so every
        # other field is still checked and reported.
        values = v if isinstance(v, list | tuple) else [v]
        if any(isinstance(x, str | PurePath) and _CONTROL.search(str(x)) for x in values):
            raise ValueError("control characters (newline, tab, NUL, escape ...) are not allowed; give the value "
                             "on one line")
        return v

    @model_validator(mode="before")
    @classmethod
    def _no_bool_as_number(cls, data: Any) -> Any:
        # Pydantic's lax mode reads YAML `true` as 1: `count: true` would launch one worker without a word.
        if isinstance(data, dict):
            # a field is written under its spec name: its validation alias where it has one (batch_per_worker)
            spelled = {f.validation_alias if isinstance(f.validation_alias, str) else n: f
                       for n, f in cls.model_fields.items()}
            for name, v in data.items():
                field = spelled.get(name) if isinstance(name, str) else None
                if isinstance(v, bool) and field is not None and _is_number_type(field.annotation):
                    raise NotANumberError(name)
        return data


class FieldValueError(ValueError):
    """A model-level check that names one field of the model; ``field`` completes the error's path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class NotANumberError(FieldValueError):
    """A true/false where a number belongs."""

    def __init__(self, field: str) -> None:
        super().__init__(field, "expected a number, not true/false")
