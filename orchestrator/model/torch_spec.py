"""What the PyTorch payload needs from a spec: framework, run:/setup: argv, env checks, secrets at task start.

Secrets are references in the spec (an environment variable of the controller or a file), resolved only
when a task starts and handed to its process environment: their values never reach the DB or task.json.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.model.catalog import load_catalog
from orchestrator.model.spec.training import payload_framework as _of_training

if TYPE_CHECKING:
    from orchestrator.model.spec import JobSpec, SecretRef


class SecretError(ValueError):
    """A secret the spec names cannot be read on the controller."""


def is_pytorch(spec: JobSpec) -> bool:
    return getattr(spec.training, "framework", "tensorflow") == "pytorch"


def payload_framework(spec: JobSpec) -> str:
    """The framework ``spec``'s VMs must carry (model.spec.training.payload_framework)."""
    return _of_training(spec.training)


def is_run_job(spec: JobSpec) -> bool:
    return getattr(spec.training, "job", "") == "run"


def exit_zero_is_done(spec: JobSpec) -> bool:
    """The user's own command (run: or job: command) ends the job when it exits 0."""
    return getattr(spec.training, "job", "") in ("run", "command")


# Providers whose workers get torchft with the payload (the local machine's lock; a GCE image's): an ssh inventory
# host's own python3 may lack it, so replica groups there are opt-in.
TORCHFT_BY_DEFAULT = ("local", "gce")


def fault_tolerance(spec: JobSpec) -> str:
    """How a PyTorch job's nodes survive a lost one: ``torchft`` (replica groups, jobs/torchjob/ft_step.py) or
    ``torchrun`` (elastic re-rendezvous). The spec's ``training.fault_tolerance`` where given; else torchft where
    replica groups apply (``_replica_groups_apply``), torchrun elsewhere (docs/pytorch.md)."""
    given = getattr(spec.training, "fault_tolerance", None)
    if given is not None:
        return str(given)
    return "torchft" if _replica_groups_apply(spec) else "torchrun"


def _replica_groups_apply(spec: JobSpec) -> bool:
    """The built-in data-parallel job whose every node trains one GPU (the torchft trainer, jobs/torchjob/ft_worker.py,
    runs one process a node), on a provider that carries torchft. A cloud job whose GPUs the planner picks may get a
    multi-GPU machine type: torchrun. (``auto`` parallelism that plans a pipeline at launch runs torchrun too:
    control.torch_task.uses_torchft.)"""
    training = spec.training
    if not is_pytorch(spec) or is_run_job(spec) or getattr(training, "parallelism", "data") == "pipeline":
        return False
    if spec.provider.kind not in TORCHFT_BY_DEFAULT:
        return False
    if not spec.provider.is_cloud:
        return True
    if spec.cluster is None:
        return False
    cat = load_catalog()
    return all(cat.gpus_per_instance(g.machine_type or cat.gpu(g.gpu).default_machine_type) == 1
               for g in spec.cluster.workers)


def replica_groups(spec: JobSpec) -> bool:
    """Are ``spec``'s data-parallel nodes torchft replica groups? A lost one then costs the survivors a quorum's
    pause (timings.TORCHFT_PAUSE_S) and its share of the pace until its replacement heals, not a world restart."""
    return is_pytorch(spec) and fault_tolerance(spec) == "torchft"


def argv(cmd: str | None) -> list[str] | None:
    return shlex.split(cmd) if cmd else None


def _secret_value(ref: SecretRef) -> str:
    if ref.file is not None:
        path = Path(ref.file).expanduser()
        try:
            return path.read_text().rstrip("\n")
        except OSError as exc:
            raise SecretError(f"training.secrets {ref.name}: cannot read {path}: {exc.strerror}") from None
    var = ref.env or ref.name
    if var not in os.environ:
        raise SecretError(f"training.secrets {ref.name}: the controller's environment has no {var}; export it "
                          "where the daemon / launch runs, or use file:")
    return os.environ[var]


def payload_env(spec: JobSpec) -> dict[str, str]:
    """The spec's env: and the resolved secrets, for the task process (raises SecretError)."""
    training = spec.training
    env = dict(getattr(training, "env", {}) or {})
    for ref in getattr(training, "secrets", []) or []:
        env[ref.name] = _secret_value(ref)
    return env


def secret_problems(spec: JobSpec) -> list[str]:
    """Every secret that cannot be read now (checked at launch, so a typo fails before anything is created)."""
    out = []
    for ref in getattr(spec.training, "secrets", []) or []:
        try:
            _secret_value(ref)
        except SecretError as exc:
            out.append(str(exc))
    return out
