"""One policy (issue 14, item 4): the daemon's reconcile and the simulator decide replacements with the same
``decide.deadline`` functions, so changing one of them changes both; its timings are read from data/."""

from __future__ import annotations

import ast
import csv
import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from orchestrator import control, sim
from orchestrator.control import driver
from orchestrator.costmodel.accounting import run_accounting
from orchestrator.costmodel.slots import Slot
from orchestrator.decide import reconcile
from orchestrator.decide import replacement as replacing
from orchestrator.decide.actions import Action, CreateInstance
from orchestrator.decide.state import InstanceView, JobView, Observation
from orchestrator.model import timings
from orchestrator.model.instances import ObservedInstance, ObservedState, ProcState, ProcStatus, Role
from orchestrator.model.paths import data_dir
from orchestrator.model.spec import OnRevocation, TrainingMode, validate_spec
from orchestrator.model.status import EndReason, InstanceStatus, JobStatus
from orchestrator.providers.local import revocations as local_revocations
from orchestrator.sim import cluster as sim_cluster
from orchestrator.sim import engine, from_spec
from orchestrator.sim import observed as sim_observed
from orchestrator.sim.engine import RunResult, SimCluster, SimSlot, simulate

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOW = 10_000.0
SLOTS = (
    Slot(Role.PS, 0, None, "local", "z1", False, 0.1, on_demand_price_per_hour=0.1, zones=("z1",)),
    Slot(Role.CHIEF, 0, None, "local", "z1", False, 0.1, on_demand_price_per_hour=0.1, zones=("z1",)),
    Slot(Role.WORKER, 0, "k80", "local", "z1", True, 0.25, 32, 0, on_demand_price_per_hour=0.7, zones=("z1", "z2")),
)


def _inst(slot: str, status: InstanceStatus, **kw: Any) -> InstanceView:
    role, index = slot.split("-")
    return InstanceView(id=1, name=f"j-{slot}-0", role=Role(role), index=int(index), generation=0, status=status,
                        spot=role == "worker", zone="z1", port=None, requested_at=NOW - 100, updated_at=NOW - 50, **kw)


def _daemon_replacement() -> list[CreateInstance]:
    """The daemon's reconcile pass after worker-0 (spot) was preempted and deleted."""
    live = [_inst("ps-0", InstanceStatus.TRAINING), _inst("chief-0", InstanceStatus.TRAINING)]
    gone = _inst("worker-0", InstanceStatus.DELETED, end_reason=EndReason.PREEMPTED)
    job = JobView(id="j", status=JobStatus.RECOVERING, outcome=None, mode=TrainingMode.ASYNC, slots=SLOTS,
                  instances=(*live, gone), on_revocation=OnRevocation.REPLACE, max_replacements=5, budget_usd=None,
                  deadline_s=None, started_at=NOW - 1000, restarts=0, cost_usd=0.0)
    obs = Observation(
        instances={i.name: ObservedInstance(i.name, "j", i.role, i.index, 0, "z1", ObservedState.RUNNING, "/w")
                   for i in live},
        procs={i.name: ProcStatus(ProcState.RUNNING) for i in live})
    acts: list[Action] = reconcile.reconcile(job, obs, NOW)
    return [a for a in acts if isinstance(a, CreateInstance)]


def _simulated_run() -> RunResult:
    """The simulator, same policy (replace), its spot worker revoked 300 s after the request."""
    slots = (SimSlot("ps-0", "ps", price_per_hour=0.1), SimSlot("chief-0", "chief", price_per_hour=0.1),
             SimSlot("worker-0", "worker", gpu="k80", zone="z1", spot=True, price_per_hour=0.25,
                     on_demand_price_per_hour=0.7, step_rate=10.0))
    c = SimCluster(slots, train_steps=10_000, policy=OnRevocation.REPLACE.value, spot_extra_boot_s=0.0)
    return simulate(c, engine.ScheduleLifetimes(c, [("worker-0", 300.0)], first_generation_only=True),
                    record=True)


def _on_demand(decide: Callable[..., replacing.Replacement]) -> Callable[..., replacing.Replacement]:
    def changed(*args: Any, **kwargs: Any) -> replacing.Replacement:
        return dataclasses.replace(decide(*args, **kwargs), spot=False)

    return changed


def _never_replace_workers(decide: Callable[..., replacing.Replacement]) -> Callable[..., replacing.Replacement]:
    def changed(role: Role, **kwargs: Any) -> replacing.Replacement:
        return replacing.Replacement(replacing.Verdict.SHRINK) if role == Role.WORKER else decide(role, **kwargs)

    return changed


def _modules(package: ModuleType) -> list[ModuleType]:
    return [importlib.import_module(m.name) for m in pkgutil.iter_modules(package.__path__, package.__name__ + ".")]


# The daemon: control/ (driver.py runs decide.reconcile every pass and executes its actions) and the reconcile.
DAEMON = (reconcile, *_modules(control))
SIMULATOR = tuple(_modules(sim))


# The policy is one set of modules both sides read: the replacement decision, the timings and the local
# provider's injected revocations, each imported whole (``from orchestrator.decide import replacement as
# replacing``) and looked up at call time, so a change there reaches the daemon and the simulator alike.
POLICY_MODULES = {"replacing": replacing, "timings": timings, "local_revocations": local_revocations}


def _policy_names(module: ModuleType) -> tuple[set[str], set[str]]:
    """What ``module`` takes from the policy modules: ``<alias>.<name>`` reads, and ``from ... import <name>``."""
    tree = ast.parse(inspect.getsource(module))
    read = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in POLICY_MODULES
            and vars(module).get(n.value.id) is POLICY_MODULES[n.value.id]}
    names = {m.__name__ for m in POLICY_MODULES.values()}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module in names
                for a in n.names}
    return read, imported


def _defined_in(name: str) -> ModuleType | None:
    return next((m for m in POLICY_MODULES.values() if hasattr(m, name)), None)


def test_the_daemon_and_the_simulator_use_one_policy_module() -> None:
    # The import line in each names the module object itself, not a copy.
    assert vars(driver)["reconcile"] is reconcile.reconcile  # what the daemon runs every pass
    for module in (reconcile, engine, sim_cluster, sim_observed):
        assert vars(module)["replacing"] is replacing, module.__name__
    assert vars(from_spec)["local_revocations"] is local_revocations
    # ``from orchestrator.decide.replacement import <name>``: the very function, not a re-implementation.
    for module in (*DAEMON, *SIMULATOR):
        for name in _policy_names(module)[1]:
            owner = _defined_in(name)
            assert owner is not None and vars(module)[name] is getattr(owner, name), (module.__name__, name)


def test_the_daemon_and_the_simulator_call_the_same_policy_functions() -> None:
    daemon = set().union(*(set.union(*_policy_names(m)) for m in DAEMON))
    simulator = set().union(*(set.union(*_policy_names(m)) for m in SIMULATOR))
    decisions = {"decide_replacement", "replacement_zones", "is_critical", "revoke_after_s"}
    assert decisions <= daemon & simulator, (sorted(daemon), sorted(simulator))
    assert all(_defined_in(name) is not None for name in daemon | simulator)  # nothing else is looked up there
    # Neither side defines a function of its own under a policy function's name.
    own = {name for m in POLICY_MODULES.values() for name, f in vars(m).items()
           if inspect.isfunction(f) and f.__module__ == m.__name__}
    for module in (*DAEMON, *SIMULATOR):
        defined = {n.name for n in ast.walk(ast.parse(inspect.getsource(module))) if isinstance(n, ast.FunctionDef)}
        assert not defined & own, (module.__name__, defined & own)


def test_a_policy_change_shows_in_the_daemon_and_in_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    (before,) = _daemon_replacement()
    sim_before = _simulated_run()
    assert before.spot and sim_before.replacements == 1
    assert any(e.kind == "replace" and ", spot," in e.detail for e in sim_before.events)

    monkeypatch.setattr(replacing, "decide_replacement", _on_demand(replacing.decide_replacement))
    (after,) = _daemon_replacement()
    sim_after = _simulated_run()
    assert not after.spot and "on-demand fallback" in after.reason
    assert any(e.kind == "replace" and "on-demand" in e.detail for e in sim_after.events)
    assert sim_after.cost_usd > sim_before.cost_usd  # billed at the on-demand price from 300 s on


def test_a_shrink_everything_policy_shows_in_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replacing, "decide_replacement", _never_replace_workers(replacing.decide_replacement))
    assert _daemon_replacement() == []
    run = _simulated_run()
    assert run.replacements == 0 and not run.finished and run.failure == engine.FAIL_WORKERS_LOST


def test_a_timing_change_shows_in_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    base = _simulated_run().wall_time_s
    monkeypatch.setattr(timings, "boot_s", lambda spot, base=0.0, spot_extra=0.0: base + 100.0)
    assert _simulated_run().wall_time_s == pytest.approx(base + 2 * 100.0)  # first boot and the replacement's


def test_decisions() -> None:
    def decide(role: Role, rule: OnRevocation, preempted: bool = True, used: int = 0) -> replacing.Replacement:
        return replacing.decide_replacement(role, preempted=preempted, spot=True, on_revocation=rule,
                                         replacements=used, max_replacements=3)

    assert decide(Role.WORKER, OnRevocation.REPLACE) == replacing.Replacement(replacing.Verdict.REPLACE, spot=True)
    assert decide(Role.WORKER, OnRevocation.FALLBACK_ON_DEMAND).spot is False
    assert decide(Role.WORKER, OnRevocation.FALLBACK_ON_DEMAND, preempted=False).spot is True
    assert decide(Role.WORKER, OnRevocation.SHRINK).verdict == replacing.Verdict.SHRINK
    assert decide(Role.PS, OnRevocation.SHRINK).verdict == replacing.Verdict.REPLACE  # a PS is always replaced
    assert decide(Role.WORKER, OnRevocation.REPLACE, used=3).verdict == replacing.Verdict.EXHAUSTED
    assert replacing.replacement_zones("b", ("a", "b", "c")) == ("b", "a", "c")
    assert replacing.replacement_zones("b", ("a", "b", "c"), rotate=True) == ("c", "a", "b")
    assert replacing.is_critical(Role.CHIEF) and not replacing.is_critical(Role.WORKER)
    assert replacing.is_critical(Role.WORKER, hosts_chief=True)


def test_timings_have_one_source_in_data() -> None:
    with (data_dir() / "cloud_facts.csv").open(newline="") as fh:
        facts = {r["key"]: float(r["value"]) for r in csv.DictReader(fh)}
    assert facts["replacement_boot_delay"] == timings.BOOT_S
    assert facts["preemption_notice_window"] == timings.NOTICE_WINDOW_S
    assert facts["preemptible_extra_staging"] == timings.SPOT_EXTRA_BOOT_S
    assert SimCluster((SimSlot("worker-0", "worker"),), train_steps=1).boot_delay_s == timings.BOOT_S
    gce = validate_spec(yaml.safe_load((EXAMPLES / "gce-l4x4-spot.yaml").read_text()))
    # A gce VM's first boot adds its image route's time (the default for this TensorFlow job: the Deep Learning
    # VM base family, TensorFlow installed at first boot), from the same file.
    assert facts["image_boot_extra_dlvm_base"] == timings.image_boot_extra_s("dlvm-base")
    assert timings.image_boot_extra_s("dlvm-base") == timings.gce_boot_extra_s(gce)
    assert run_accounting(gce).boot_s == timings.BOOT_S + timings.gce_boot_extra_s(gce)
    assert run_accounting(gce).spot_extra_boot_s == timings.SPOT_EXTRA_BOOT_S


@pytest.mark.parametrize(("rule", "creates"), [(OnRevocation.FALLBACK_ON_DEMAND, [False]), (OnRevocation.SHRINK, [])])
def test_the_policy_applies_in_the_pass_that_sees_the_preemption(rule: OnRevocation, creates: list[bool]) -> None:
    """The replacement is asked for in the pass that marks the instance REVOKED: it must already count as
    preempted there (found by tests/test_sim_daemon_agree.py: the daemon used to replace it with spot)."""
    live = [_inst("ps-0", InstanceStatus.TRAINING), _inst("chief-0", InstanceStatus.TRAINING),
            _inst("worker-0", InstanceStatus.TRAINING)]
    job = JobView(id="j", status=JobStatus.RUNNING, outcome=None, mode=TrainingMode.ASYNC, slots=SLOTS,
                  instances=tuple(live), on_revocation=rule, max_replacements=5, budget_usd=None, deadline_s=None,
                  started_at=NOW - 1000, restarts=0, cost_usd=0.0)
    state = {i.name: ObservedState.STOPPING if i.role == Role.WORKER else ObservedState.RUNNING for i in live}
    obs = Observation(
        instances={i.name: ObservedInstance(i.name, "j", i.role, i.index, 0, "z1", state[i.name], "/w",
                                            preempted=i.role == Role.WORKER) for i in live},
        procs={i.name: ProcStatus(ProcState.RUNNING) for i in live})
    acts = reconcile.reconcile(job, obs, NOW)
    assert [a.spot for a in acts if isinstance(a, CreateInstance)] == creates
