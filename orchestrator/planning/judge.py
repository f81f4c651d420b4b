"""A read spec judged: the cost model's checks of it, its provider's inputs (the ssh inventory: its content, and
hosts for every instance), the cluster chosen if the spec does not pin it, and that cluster judged against the
policy's budget AND deadline, planned once. Any problem is a ``UserError`` (exit 2, one line per problem) and no
file, folder or DB row exists afterwards: the results DB is read only when it already exists (stockouts and
quotas in force) and never created. ``planning.admission`` runs this for every verb."""

from __future__ import annotations

import ipaddress
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from orchestrator.costmodel import SplitError, UnknownModelError
from orchestrator.costmodel.launch_plan import LaunchPlan, plan_spec
from orchestrator.costmodel.planner import launch_strategy
from orchestrator.costmodel.spec_checks import batch_fit_errors
from orchestrator.model.errors import UserError
from orchestrator.model.instances import Role
from orchestrator.model.spec import FieldError, JobSpec, SpecError
from orchestrator.model.spec.provider import loopback_endpoint
from orchestrator.model.specfile import short
from orchestrator.model.torch_spec import fault_tolerance, is_pytorch
from orchestrator.planning.blocks import KnownBlock, known_blocks
from orchestrator.planning.inventory import inventory_notes, inventory_priced
from orchestrator.planning.local_run import RunFigures, plan_job
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.providers.ssh.provider import Inventory, load_inventory
from orchestrator.storage.local import storage_problem

if TYPE_CHECKING:
    from orchestrator.costmodel import Calibration, Candidate, PlanResult


class PlanRefused(UserError):
    """The cost model says the cluster cannot meet the policy; ``result`` is the plan it judged (for `plan`)."""

    def __init__(self, message: str, *, hint: str, result: PlanResult, name: str = "") -> None:
        super().__init__(message, hint=hint)
        self.result = result
        self.name = name  # the spec's name, for `plan`'s display of the refused plan
        self.warnings: tuple[str, ...] = ()  # what admission found before the plan (`plan` shows them)


class NotLaunchable(PlanRefused):
    """The cost model's plan stands, but this build cannot run it (a model only a pipeline places: jobs run data
    parallel): `launch` and its dry run refuse; `plan` prints the plan and this refusal as a note."""


@dataclass(frozen=True)
class Judged:
    """A spec every verb may act on: the cluster to run, as the planner judged it."""

    spec: JobSpec  # with the planner's cluster when the spec did not pin one
    result: PlanResult  # the planner's answer for the spec as written (a search, or the pinned cluster judged)
    plan: LaunchPlan  # the one expansion into slots: the dry run, the quota check and the launch all use it
    blocks: list[KnownBlock]
    searched: bool  # the planner chose the cluster
    notes: tuple[str, ...] = ()  # where the provider's inputs say otherwise than the plan (an ssh inventory)
    idle: RunFigures | None = None  # a local run on an idle host, from the same planner run (a host load given)

    @property
    def planned(self) -> PlanResult | None:
        """The planner's search, stored with the job; None when the spec pinned the cluster."""
        return self.result if self.searched else None

    @property
    def estimate(self) -> Candidate | None:
        return self.result.chosen


def judge(spec: JobSpec, source: str, calibration: Calibration | None = None,
          idle: Calibration | None = None) -> Judged:
    """Judge a read spec as every verb does; raises ``SpecError`` / ``UserError``, creates nothing. ``idle``: the
    calibration without the host's other work, for a local run's idle figures beside the loaded ones."""
    try:
        return _judge(spec, source, calibration, idle)
    except UnknownModelError as exc:  # hparam_set names no profile: the cost model cannot judge the job
        raise UserError(f"training.hparam_set: {exc}",
                        hint="name a profiled model (`orchestrator model list`)") from None
    except SplitError as exc:
        raise UserError(f"training.global_batch: {exc}", hint="give a global batch the workers can split") from None


def _judge(spec: JobSpec, source: str, calibration: Calibration | None, idle: Calibration | None) -> Judged:
    if errors := batch_fit_errors(spec):  # the cost model's check of the spec (the spec cannot import it)
        raise SpecError(errors, source)
    storage_reachable(spec, source)
    inventory = _inventory(spec)  # the inventory's content, before any planning
    blocks = known_blocks(spec)
    result, idle_run = plan_job(spec, calibration=calibration, blocks=blocks, idle=idle)
    if findings := spec_warnings(spec):  # printed with the plan's own warnings by every verb
        result = replace(result, warnings=(*result.warnings, *findings))
    searched = spec.cluster is None
    judged = result.chosen
    if searched:
        spec, judged, idle_run = _chosen(spec, result, calibration, blocks, idle)
    plan, unlaunchable = None, None
    if inventory is not None and judged is not None:
        # The ledger bills each host its price_per_hour: the budget check and the plan's figures use those prices.
        plan, unlaunchable = _expand(spec, blocks, calibration)  # the policy's verdict still comes first
        if plan is not None:
            judged = inventory_priced(judged, plan, inventory, spec.policy.budget_usd)
            result = replace(result, chosen=judged, feasible=judged.feasible)
    _within_policy(spec, judged, result)
    _runnable(spec, judged, result)
    if plan is None and unlaunchable is None:
        plan, unlaunchable = _expand(spec, blocks, calibration)
    if plan is None:
        assert unlaunchable is not None
        raise NotLaunchable(unlaunchable.message, hint=unlaunchable.hint or "", result=result, name=spec.name)
    if (store := rendezvous_warning(spec, plan)) is not None:
        result = replace(result, warnings=(*result.warnings, store))
    notes: tuple[str, ...] = ()
    if inventory is not None:
        _hosts_for(plan, Counter(h.gpu or "" for h in inventory.hosts))
        hours = judged.time_s / 3600 if judged is not None and math.isfinite(judged.time_s) else None
        notes = inventory_notes(spec, plan, inventory, hours)
    return Judged(spec, result, plan, blocks, searched, notes, idle_run)


def _chosen(spec: JobSpec, result: PlanResult, calibration: Calibration | None, blocks: list[KnownBlock],
            idle: Calibration | None) -> tuple[JobSpec, Candidate | None, RunFigures | None]:
    """The searched spec with the planner's cluster pinned, and that cluster as the launch will run it: a local
    spec's is the simulated local run (a second planner run, of the one cluster), a cloud's the search's own."""
    if result.chosen is None:
        miss = result.best_infeasible
        raise PlanRefused("no candidate cluster meets the constraints"
                          + (f"; the closest is {miss.label}: {'; '.join(miss.reasons)}" if miss else ""),
                          hint="raise policy.budget_usd / policy.deadline or widen search", result=result,
                          name=spec.name)
    spec = spec.with_cluster(result.chosen.to_cluster())
    judged, idle_run = plan_job(spec, calibration=calibration, blocks=blocks, idle=idle)
    return spec, judged.chosen, idle_run


def _expand(spec: JobSpec, blocks: list[KnownBlock], calibration: Calibration | None
            ) -> tuple[LaunchPlan | None, UserError | None]:
    """The plan's one expansion into slots (with the job's step model, as ``plan_job`` planned it), or why this
    build cannot run it."""
    try:
        steps = step_model_for(spec, calibration)
        return plan_spec(spec, blocks=blocks, calibration=calibration, steps=steps), None
    except UserError as exc:
        return None, exc


def _runnable(spec: JobSpec, judged: Candidate | None, result: PlanResult) -> None:
    """Only the built-in PyTorch job runs a pipeline: other jobs run data parallel, which must hold the model."""
    if judged is None or launch_strategy(spec, judged) is not None:
        return
    data = next((s for s in judged.strategies if s.name == "data"), None)
    raise NotLaunchable(
        f"data parallel cannot place {spec.training.profile_name} on this cluster "
        f"({data.detail if data is not None else 'it does not fit a worker'}), and only the built-in PyTorch job "
        f"runs the {judged.strategy} the plan chose",
        hint="train with the built-in PyTorch job (training.framework: pytorch, no run:), or pick GPUs that hold the "
             "whole model", result=result, name=spec.name)


def _within_policy(spec: JobSpec, judged: Candidate | None, result: PlanResult) -> None:
    """The cluster's predicted time and cost fit the deadline and the budget."""
    if judged is None:
        raise PlanRefused("the cost model could not judge this cluster", hint="check the spec's cluster",
                          result=result, name=spec.name)
    problems = list(judged.reasons) if not judged.feasible else []
    budget, deadline = spec.policy.budget_usd, spec.policy.deadline
    if budget is not None and not judged.cost_usd <= budget and not problems:
        problems.append(f"predicted cost {judged.cost_usd:.2f} USD is over policy.budget_usd {budget:.2f}")
    if deadline is not None and not judged.time_s <= deadline and not problems:
        problems.append(f"predicted time {judged.time_s:.0f} s is past policy.deadline {deadline:.0f} s")
    if problems:
        predicted = (f" (predicted {judged.time_s:,.0f} s, {judged.cost_usd:.4f} USD)"
                     if math.isfinite(judged.time_s) and math.isfinite(judged.cost_usd) else "")
        raise PlanRefused(f"policy: the cluster breaks a constraint{predicted}: {'; '.join(problems)}",
                          hint="raise policy.budget_usd / policy.deadline, use spot or fewer/cheaper GPUs, or "
                               "fewer train_steps (`orchestrator plan` shows the options)", result=result,
                          name=spec.name)


def storage_reachable(spec: JobSpec, source: str) -> None:
    """A cloud's VMs write checkpoints and metrics to storage: a folder of this machine is out of their reach,
    except where the Compute API is served on this machine (a loopback endpoint), whose "VMs" are its
    processes. A local folder is never an OS folder, a shared folder itself, the results DB or the home's own
    files (the check that opening a job's storage runs too)."""
    gce = spec.provider.as_gce()
    if gce is not None and not spec.storage.startswith("gs://") and not loopback_endpoint(gce.api_endpoint):
        raise SpecError([FieldError(path="storage", message=f"'{short(spec.storage)}' is a folder of this machine, "
                                    "which GCE VMs cannot reach; use gs://bucket/prefix")], source)
    if (problem := storage_problem(spec.storage)) is not None:
        raise SpecError([FieldError(path="storage", message=problem)], source)


def spec_warnings(spec: JobSpec) -> list[str]:
    """What the spec may do but should hear about: a GCE firewall rule letting the whole internet try ssh."""
    gce = spec.provider.as_gce()
    ranges = (gce.ssh_source_ranges or []) if gce is not None else []
    return [f"provider.ssh_source_ranges: {r} lets every address on the internet try ssh (port 22) on the VMs; "
            "give your own range (e.g. 203.0.113.7/32), or leave it out for this controller's address"
            for r in ranges if ipaddress.ip_network(r).prefixlen == 0]


def rendezvous_warning(spec: JobSpec, plan: LaunchPlan) -> str | None:
    """A torchrun job whose workers are all spot: its c10d store has no on-demand worker to live on, so it lives on
    worker 0, and worker 0's revocation ends every node's training (they restart from the last checkpoint)."""
    workers = [s for s in plan.slots if s.role == Role.WORKER]
    if not is_pytorch(spec) or fault_tolerance(spec) != "torchrun" or len(workers) < 2 or not all(
            s.spot for s in workers):
        return None
    replicas = getattr(spec.training, "parallelism", "data") != "pipeline"
    every = spec.training.checkpoint_every
    return ("cluster.workers: every worker is spot, so torchrun's rendezvous store lives on worker 0; its revocation "
            f"stops every node, and they go on from the last checkpoint (checkpoint_every: {every} steps); "
            "give one worker group spot: false"
            + (", or set training.fault_tolerance: torchft (replica groups: any worker may go)" if replicas else ""))


def _inventory(spec: JobSpec) -> Inventory | None:
    """The ssh inventory; None for providers without one."""
    path = spec.provider.inventory_path
    return None if path is None else load_inventory(path)


def _hosts_for(plan: LaunchPlan, hosts: Counter[str]) -> None:
    """One instance per inventory host: a host of the right GPU type for every worker, a host for every slot."""
    needed = Counter(s.gpu for s in plan.slots if s.gpu)
    problems = [f"{n} x {gpu} worker(s) but the inventory has {hosts.get(gpu, 0)} host(s) with gpu: {gpu}"
                for gpu, n in sorted(needed.items()) if hosts.get(gpu, 0) < n]
    if not problems and len(plan.slots) > sum(hosts.values()):
        problems.append(f"{len(plan.slots)} instances ({plan.shape}) but the inventory lists "
                        f"{sum(hosts.values())} host(s); one instance runs per host")
    if problems:
        raise UserError("cluster: " + "; ".join(problems),
                        hint="add hosts to provider.inventory or ask for fewer/other GPUs in cluster.workers")
