"""The YAML job spec: pydantic models, validation against the catalog, field-path errors.

Every problem is reported as ``<field path>: <what is wrong>; <what is allowed>`` and nothing is
created before the whole spec validates.

* ``base``: ``FieldError`` / ``SpecError``, the strict base model, durations;
* ``provider``, ``training``, ``job``: the models of ``provider:``, ``training:`` and the rest of the spec;
* ``checks``: the semantic checks against the catalog (zones, machine types, prices); the memory check needs
  the cost model, so it lives above the spec (``costmodel.spec_checks``, run by ``planning/judge.py``);
* ``load``: ``validate_spec`` (a parsed document) and ``load_spec`` (a file, with the local paths it names).

The names below are the spec's public interface: most of the package imports them from here.
"""

from __future__ import annotations

from orchestrator.model.spec.base import LOCAL_ZONE, FieldError, SpecError, parse_duration
from orchestrator.model.spec.job import (
    LEGACY_BOOK,
    Chief,
    Cluster,
    JobSpec,
    OnRevocation,
    ParameterServers,
    Policy,
    PriceOverride,
    Pricing,
    SearchSpace,
    WorkerGroup,
)
from orchestrator.model.spec.load import load_spec, read_spec_document, spec_from_document, stored_spec, validate_spec
from orchestrator.model.spec.provider import (
    SSH_USER_PATTERN,
    GceProvider,
    LocalProvider,
    ProviderSpec,
    RevocationMode,
    ScheduledRevocation,
    SshProvider,
)
from orchestrator.model.spec.training import (
    BuiltinTraining,
    CommandTraining,
    RunTraining,
    SecretRef,
    TrainingMode,
    TrainingSpec,
)

__all__ = [
    "LEGACY_BOOK",
    "LOCAL_ZONE",
    "SSH_USER_PATTERN",
    "BuiltinTraining",
    "Chief",
    "Cluster",
    "CommandTraining",
    "FieldError",
    "GceProvider",
    "JobSpec",
    "LocalProvider",
    "OnRevocation",
    "ParameterServers",
    "Policy",
    "PriceOverride",
    "Pricing",
    "ProviderSpec",
    "RevocationMode",
    "RunTraining",
    "ScheduledRevocation",
    "SearchSpace",
    "SecretRef",
    "SpecError",
    "SshProvider",
    "TrainingMode",
    "TrainingSpec",
    "WorkerGroup",
    "load_spec",
    "read_spec_document",
    "spec_from_document",
    "stored_spec",
    "parse_duration",
    "validate_spec",
]
