"""At every simulated revocation, the daemon's real reconcile, shown the state the controller would observe
(``sim.observed``), decides what the engine did: replace or not, spot or on-demand, where, roll back or not."""

from __future__ import annotations

import random

import pytest

from orchestrator.decide import reconcile
from orchestrator.decide import replacement as replacing
from orchestrator.sim.engine import ScheduleLifetimes, SimCluster, SimSlot, simulate
from orchestrator.sim.montecarlo import run_monte_carlo
from orchestrator.sim.observed import compare_with_daemon


def _cluster(rule: str, max_replacements: int = 1000, mode: str = "async") -> SimCluster:
    slots = (
        SimSlot("ps-0", "ps", zone="z1", spot=True, price_per_hour=0.1, on_demand_price_per_hour=0.2),
        SimSlot("chief-0", "chief", zone="z1", price_per_hour=0.1),
        *(SimSlot(f"worker-{i}", "worker", gpu="k80", zone="z1", replacement_zones=("z2",), spot=True,
                  price_per_hour=0.25, on_demand_price_per_hour=0.7, step_rate=5.0) for i in range(3)),
    )
    return SimCluster(slots, train_steps=20_000, mode=mode, policy=rule, max_replacements=max_replacements)


class _Random:
    """Seeded exponential lifetimes for spot instances (mean 600 s)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def lifetime(self, slot: int, generation: int, zone: str | None, spot: bool, t_request: float) -> float:
        return self.rng.expovariate(1 / 600.0) if spot else float("inf")


@pytest.mark.parametrize("rule", ["replace", "fallback-on-demand", "shrink"])
def test_the_daemon_decides_every_simulated_revocation_as_the_engine(rule: str) -> None:
    checked = 0
    for seed in range(30):
        c = _cluster(rule)
        run = simulate(c, _Random(seed), record=True)
        decisions = compare_with_daemon(c, run)
        assert all(d.agree for d in decisions), [d for d in decisions if not d.agree]
        checked += len(decisions)
    assert checked > 50


def test_a_scheduled_ps_loss_rolls_back_in_both() -> None:
    c = _cluster("replace")
    run = simulate(c, ScheduleLifetimes(c, [("ps-0", 500.0), ("worker-1", 800.0)]), record=True)
    ps, worker = compare_with_daemon(c, run)
    assert ps.agree and ps.daemon_restarts and ps.daemon == "replace spot in z1"
    assert worker.agree and not worker.daemon_restarts


def test_known_difference_exhausted_replacements(monkeypatch: pytest.MonkeyPatch) -> None:
    """With max_replacements used up the daemon fails the job; the simulator carries on without the worker."""
    c = _cluster("replace", max_replacements=0)
    run = simulate(c, ScheduleLifetimes(c, [("worker-1", 800.0)]), record=True)
    (d,) = compare_with_daemon(c, run)
    assert (d.daemon, d.engine) == ("job fails", "not replaced")
    # A policy change reaches both sides of the comparison.
    shrink = replacing.Replacement(replacing.Verdict.SHRINK)
    monkeypatch.setattr(replacing, "decide_replacement", lambda role, **kw: shrink)
    run = simulate(c, ScheduleLifetimes(c, [("worker-1", 800.0)]), record=True)
    (d,) = compare_with_daemon(c, run)
    assert d.agree and d.daemon == "not replaced"


@pytest.mark.parametrize("rule", ["replace", "fallback-on-demand", "shrink"])
def test_a_run_driven_by_the_real_reconcile_equals_the_policy_driven_run(rule: str) -> None:
    for seed in range(20):
        c = _cluster(rule)
        by_policy = simulate(c, _Random(seed), record=True)
        by_daemon = simulate(c, _Random(seed), record=True, daemon=True)
        assert by_daemon == by_policy


def test_a_daemon_driven_run_ends_when_the_daemon_gives_up() -> None:
    c = _cluster("replace", max_replacements=0)
    schedule = ScheduleLifetimes(c, [("worker-1", 800.0)])
    assert simulate(c, schedule).finished  # the simulator's own rule: carry on with the workers left
    run = simulate(c, schedule, daemon=True)
    assert not run.finished and run.failure == "replacements_exhausted"


def test_a_reconcile_change_shows_in_a_daemon_driven_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A change inside reconcile itself (not in decide.deadline) reaches only the daemon-driven run."""
    c = _cluster("replace")
    before = simulate(c, _Random(3), record=True)
    assert before.revocations > 0 and not any("zone z2" in e.detail for e in before.events)
    monkeypatch.setattr(reconcile, "prefer_unblocked", lambda zones, blocked: (*reversed(zones),))
    assert simulate(c, _Random(3), record=True) == before
    after = simulate(c, _Random(3), record=True, daemon=True)
    assert any(e.kind == "replace" and e.slot.startswith("worker") and "zone z2" in e.detail for e in after.events)


def test_monte_carlo_decided_by_the_daemon_gives_the_same_distribution() -> None:
    c = _cluster("fallback-on-demand")
    by_policy = run_monte_carlo(c, runs=200, seed=5).summary()
    by_daemon = run_monte_carlo(c, runs=200, seed=5, daemon=True).summary()
    assert by_daemon == by_policy and by_policy["revocations"]["mean"] > 0
