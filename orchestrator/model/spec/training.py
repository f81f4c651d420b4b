"""``training:`` of the spec: the built-in ResNet job, your own command, or your script under torchrun."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from orchestrator.model.spec.base import FieldValueError, StrictModel
from orchestrator.model.specfile import command_problem, env_name_problem, env_problem

# The per-worker batch of a spec that gives none (no batch_per_worker, global_batch or worker group batch): the
# one default, for a pinned and a searched cluster alike (costmodel/batches.py) and so for the payload.
DEFAULT_BATCH = 128


class TrainingMode(StrEnum):
    ASYNC = "async"  # parameter servers, asynchronous updates (the 2019 study)
    SYNC = "sync"  # all-reduce, per-worker batch split


FaultTolerance = Literal["torchft", "torchrun"]
FT_NOTE = ("torchft: each worker node is a replica group of a per-step quorum (a Lighthouse with the controller); "
           "a lost node costs the survivors the step in flight. torchrun: elastic re-rendezvous (restarts the group)")


class TrainingLoop(StrictModel):
    """The loop fields every ``training:`` kind shares (the spec field names users write): how long it trains,
    its batch (per worker, or global and split by the planner) and how often it checkpoints, evaluates, logs."""

    train_steps: int = Field(default=1000, gt=0, le=10_000_000)
    # Each worker's batch, the name it has at every hop to the payload (a worker group's batch, a slot's, a
    # plan's); the spec spells it batch_per_worker (a user contract), the payload's task.json too.
    batch: int | None = Field(default=None, gt=0, le=65536, alias="batch_per_worker")
    global_batch: int | None = Field(default=None, gt=0, le=1_048_576)
    checkpoint_every: int = Field(default=1000, gt=0, le=10_000_000)
    eval_every: int = Field(default=0, ge=0, le=10_000_000)
    log_every: int = Field(default=10, gt=0, le=10_000_000)


class BuiltinTraining(TrainingLoop):
    job: Literal["resnet-cifar"] = "resnet-cifar"
    model: Literal["resnet"] = "resnet"
    hparam_set: Literal["resnet_tiny", "resnet_cifar_15", "resnet_cifar_32", "resnet_cifar_56"] = "resnet_cifar_32"
    problem: Literal["image_cifar10"] = "image_cifar10"
    data_dir: str | None = Field(default=None, description="CIFAR-10 python-pickle folder; default: offline digits")
    # tensorflow: the 2019 study's job (jobs/tfjob); pytorch: elastic DDP under torchrun (jobs/torchjob).
    framework: Literal["tensorflow", "pytorch"] = "tensorflow"
    min_workers: int | None = Field(default=None, ge=1, le=256, description="pytorch: fewest nodes that train on")
    mode: TrainingMode = TrainingMode.ASYNC
    train_steps: int = Field(default=64000, gt=0, le=10_000_000)  # the 2019 study's run (the others: 1000)
    # pytorch: every N steps each rank times its own compute and the ranks re-split the global batch until
    # they finish within 5% of each other (jobs/torchjob/rebalance.py); 0 keeps the planned split.
    resplit_every: int = Field(default=20, ge=0, le=1_000_000)
    # Data parallel (each worker holds the whole model; the batch is split), a pipeline of contiguous layer
    # stages sized to each GPU (and hybrids: a stage data parallel over equal GPUs), or auto: the faster that
    # fits. The optimizer decides the memory each parameter costs (sgd: momentum, one slot; adam: two).
    parallelism: Literal["auto", "data", "pipeline"] = "auto"
    optimizer: Literal["sgd", "adam"] = "sgd"
    # pipeline: stages sized to each GPU (mini-max, the default) or as many layers each (equal-layers: the
    # heterogeneity-blind baseline, for comparison)
    partition: Literal["mini-max", "equal-layers"] = "mini-max"
    # pytorch data parallel: torchft replica groups or torchrun's elastic restarts (None: the payload's default,
    # model.torch_spec.fault_tolerance)
    fault_tolerance: FaultTolerance | None = Field(default=None, description=FT_NOTE)

    @model_validator(mode="before")
    @classmethod
    def _pytorch_is_sync(cls, data: Any) -> Any:
        # DDP is synchronous: for framework: pytorch, mode defaults to sync (and async is refused below).
        if isinstance(data, dict) and data.get("framework") == "pytorch" and "mode" not in data:
            return {**data, "mode": "sync"}
        return data

    @model_validator(mode="after")
    def _batch(self) -> BuiltinTraining:
        if self.batch is not None and self.global_batch is not None:
            raise ValueError("give batch_per_worker or global_batch, not both")
        if self.framework == "pytorch" and self.mode == TrainingMode.ASYNC:
            raise ValueError("framework: pytorch trains with synchronous DDP; use mode: sync (or leave mode out)")
        if self.framework == "tensorflow" and self.min_workers is not None:
            raise ValueError("min_workers is for framework: pytorch (elastic training); drop it")
        if self.fault_tolerance is not None and self.framework != "pytorch":
            raise FieldValueError("fault_tolerance", "is for framework: pytorch (data parallel); drop it")
        if self.fault_tolerance == "torchft" and self.parallelism == "pipeline":
            raise FieldValueError("fault_tolerance", "torchft replicates whole models (data parallel); a pipeline "
                                  "needs every stage: use torchrun or parallelism: data")
        return self

    @property
    def profile_name(self) -> str:
        return self.hparam_set


class TorchModel(StrictModel):
    """``model: {torch: "pkg.mod:build"}``: the cost model profiles ``build(batch) -> (nn.Module, inputs)``
    (``orchestrator model profile --torch``); a file path is relative to the spec's folder."""

    torch: str = Field(pattern=r"^[^:\s]+:[A-Za-z_][A-Za-z0-9_]*$",
                       description="MODULE:FACTORY, e.g. own-script/models.py:resnet50 or torchvision:resnet50")


class CommandTraining(TrainingLoop):
    job: Literal["command"]
    command: str = Field(min_length=1, description="run on every instance; TF_CONFIG and TASK_JSON are set")
    files: list[Path] = Field(default_factory=list, description="files/folders pushed to every instance")
    mode: TrainingMode = TrainingMode.ASYNC
    hparam_set: str = "resnet_cifar_32"  # the profile the cost model uses to predict step times
    model: TorchModel | None = None  # the user's own PyTorch model; replaces hparam_set in the cost model
    # what the user's script trains in, for the cost model only (the script sets it itself): fp32, TF32 matmuls
    # and convolutions (tf32), fp16 autocast (amp), bf16 autocast (bf16)
    precision: Literal["fp32", "tf32", "amp", "bf16"] = "fp32"

    @property
    def profile_name(self) -> str:
        return f"torch:{self.model.torch}" if self.model is not None else self.hparam_set


class SecretRef(StrictModel):
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

    @field_validator("name")
    @classmethod
    def _task_variable(cls, v: str) -> str:
        # The task gets the secret as this variable: the same names are refused as in env: (PATH, LD_PRELOAD).
        if problem := env_name_problem(v):
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if self.env is not None and self.file is not None:
            raise ValueError("give env or file, not both")
        return self


class RunTraining(TrainingLoop):
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
    hparam_set: str = "resnet_cifar_32"  # the profile the cost model uses to predict step times
    model: TorchModel | None = None  # the user's own PyTorch model; replaces hparam_set in the cost model
    # what the user's script trains in, for the cost model only (the script sets it itself): fp32, TF32 matmuls
    # and convolutions (tf32), fp16 autocast (amp), bf16 autocast (bf16)
    precision: Literal["fp32", "tf32", "amp", "bf16"] = "fp32"
    # Data parallel (each worker holds the whole model; the batch is split), a pipeline of contiguous layer
    # stages sized to each GPU (and hybrids: a stage data parallel over equal GPUs), or auto: the faster that
    # fits. The optimizer decides the memory each parameter costs (sgd: momentum, one slot; adam: two).
    parallelism: Literal["auto", "data", "pipeline"] = "auto"
    optimizer: Literal["sgd", "adam"] = "sgd"
    # Opt-in (default torchrun): torchft runs the script once per node with TORCHFT_LIGHTHOUSE and REPLICA_GROUP_ID
    # set, and the script builds its own torchft Manager (docs/pytorch.md).
    fault_tolerance: FaultTolerance = Field(default="torchrun", description=FT_NOTE)

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

    @model_validator(mode="after")
    def _one_value_per_variable(self) -> RunTraining:
        # The task would get one of two values for the variable (the secret wins today): say which, once.
        seen: set[str] = set()
        for ref in self.secrets:
            if ref.name in self.env:
                raise FieldValueError("secrets", f"{ref.name} is also in training.env; give it in one place "
                                      "(secrets: for a value that must not be stored)")
            if ref.name in seen:
                raise FieldValueError("secrets", f"{ref.name} is listed twice; give each secret once")
            seen.add(ref.name)
        if self.fault_tolerance == "torchft" and self.parallelism == "pipeline":
            raise FieldValueError("fault_tolerance", "torchft replicates whole models (data parallel); a pipeline "
                                  "needs every stage: use torchrun or parallelism: data")
        return self

    @property
    def profile_name(self) -> str:
        return f"torch:{self.model.torch}" if self.model is not None else self.hparam_set


def payload_framework(training: BuiltinTraining | CommandTraining | RunTraining) -> str:
    """The framework the VMs must carry: the built-in job's ``framework``, pytorch for a ``run:`` script
    (torchrun), and for ``job: command`` pytorch when its cost model is a torch model, else tensorflow (the
    command gets TF_CONFIG). The gce default image is chosen from it (data/gce_images.csv)."""
    if isinstance(training, RunTraining) or getattr(training, "framework", "") == "pytorch":
        return "pytorch"
    if isinstance(training, CommandTraining) and training.model is not None:
        return "pytorch"
    return "tensorflow"


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
