"""Monte Carlo: revocation counts against a closed form, determinism, the no-revocation shortcut."""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import numpy.typing as npt
import pytest

from orchestrator.costmodel.revocation.model import CalendarFactor, load_revocation_model
from orchestrator.sim.engine import NoRevocations, SimCluster, SimSlot, simulate
from orchestrator.sim.montecarlo import run_monte_carlo


class ExponentialModel:
    """Every spot instance lives Exp(rate) seconds, whatever its type or zone."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def sample_lifetimes(
        self,
        gpu: str | None,
        zone: str | None,
        n: int,
        rng: np.random.Generator,
        *,
        preemptible: bool = False,
        kind: str = "bathtub",
        start: datetime | None = None,
        hazard_multiplier: float = 1.0,
    ) -> npt.NDArray[np.float64]:
        return rng.exponential(1.0 / self.rate, n)


def k80_cluster(workers: int = 4, **kw: object) -> SimCluster:
    slots = [SimSlot("ps-0", "ps", price_per_hour=0.143), SimSlot("chief-0", "chief", price_per_hour=0.143)]
    slots += [
        SimSlot(
            f"worker-{i}",
            "worker",
            gpu="k80",
            zone="us-central1-c",
            spot=True,
            price_per_hour=0.256,
            on_demand_price_per_hour=0.723,
            step_rate=4.0,
            batch=128,
        )
        for i in range(workers)
    ]
    defaults: dict[str, object] = {
        "train_steps": 64000,
        "ps_capacity_steps_per_s": 40.0,
        "preemptible": True,
        "checkpoint_cost_s": 3.79,
    }
    defaults.update(kw)
    return SimCluster(tuple(slots), **defaults)  # type: ignore[arg-type]


def test_mean_revocations_match_poisson_closed_form() -> None:
    # Instant replacements and a rate that does not depend on how many workers are up: each of the
    # n slots is a Poisson process of rate lambda over the fixed run time T, so E[revocations] = lambda n T.
    n, rate, steps = 4, 10.0, 20000
    c = k80_cluster(
        n,
        train_steps=steps,
        checkpoint_every=steps,
        boot_delay_s=0.0,
        spot_extra_boot_s=0.0,
        rate_fn=lambda live: rate,
        max_replacements=10_000,
    )
    t = steps / rate
    lam = 0.5 / t  # half a revocation per slot per run
    mc = run_monte_carlo(c, 4000, seed=11, model=ExponentialModel(lam))
    assert np.allclose(mc.time_s, t)
    expected = lam * n * t
    stderr = math.sqrt(expected / 4000)
    assert float(np.mean(mc.revocations)) == pytest.approx(expected, abs=4 * stderr)
    assert np.array_equal(mc.revocations, mc.replacements)


def test_deterministic_given_seed() -> None:
    model = load_revocation_model()
    c = k80_cluster(ps_capacity_steps_per_s=12.0)
    a = run_monte_carlo(c, 300, seed=5, model=model)
    b = run_monte_carlo(c, 300, seed=5, model=model)
    other = run_monte_carlo(c, 300, seed=6, model=model)
    assert np.array_equal(a.time_s, b.time_s) and np.array_equal(a.cost_usd, b.cost_usd)
    assert a.summary() == b.summary()
    assert not np.array_equal(a.revocations, other.revocations)


def test_shortcut_gives_the_same_runs_as_the_event_loop() -> None:
    model = load_revocation_model()
    c = k80_cluster(ps_capacity_steps_per_s=12.0, policy="fallback-on-demand")
    fast = run_monte_carlo(c, 300, seed=3, model=model)
    slow = run_monte_carlo(c, 300, seed=3, model=model, shortcut=False)
    assert fast.simulated_runs < slow.simulated_runs == 300
    assert np.array_equal(fast.time_s, slow.time_s) and np.array_equal(fast.cost_usd, slow.cost_usd)


def test_summary_statistics_and_limits() -> None:
    base = simulate(k80_cluster(), NoRevocations())
    c = k80_cluster(deadline_s=base.wall_time_s + 30.0, budget_usd=100.0)
    mc = run_monte_carlo(c, 500, seed=1, model=ExponentialModel(1 / 3600.0))
    s = mc.summary()
    for key in ("time_s", "cost_usd"):
        assert set(s[key]) == {"mean", "p10", "p50", "p90"}
        assert s[key]["p10"] <= s[key]["p50"] <= s[key]["p90"]
    assert s["time_s"]["p10"] >= base.wall_time_s - 1e-9  # revocations only slow the job down
    assert 0.0 < s["p_miss_deadline"] < 1.0  # a revocation costs more than 30 s
    assert s["p_over_budget"] == 0.0
    assert s["failures"] == {"deadline": int(np.sum(mc.deadline_missed))}
    assert set(s["cost_by_role_usd"]) == {"ps", "chief", "workers"}


def test_spot_parameter_server_loses_steps() -> None:
    slots = [SimSlot("ps-0", "ps", spot=True, price_per_hour=0.041, on_demand_price_per_hour=0.143)]
    slots += [
        SimSlot(f"worker-{i}", "worker", gpu="v100", spot=True, price_per_hour=0.861, step_rate=10.0)
        for i in range(2)
    ]
    c = SimCluster(tuple(slots), train_steps=200000)
    mc = run_monte_carlo(c, 400, seed=2, model=ExponentialModel(1 / 20000.0))
    assert float(np.mean(mc.steps_lost)) > 0


def test_schedule_makes_every_run_identical() -> None:
    c = k80_cluster(schedule=(("worker-1", 600.0),))
    mc = run_monte_carlo(c, 50, seed=0)
    assert np.all(mc.revocations == 1) and np.ptp(mc.time_s) == 0.0


def test_calendar_start_on_a_quiet_weekend() -> None:
    model = load_revocation_model().with_calendar(CalendarFactor(weekend=0.0))
    saturday = datetime(2019, 2, 23, 0, 0)
    weekend = run_monte_carlo(k80_cluster(start_at=saturday), 200, seed=4, model=model)
    weekday = run_monte_carlo(k80_cluster(start_at=datetime(2019, 2, 20)), 200, seed=4, model=model)
    assert float(np.sum(weekend.revocations)) == 0.0 < float(np.sum(weekday.revocations))
