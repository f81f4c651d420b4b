"""The discrete-event engine: closed forms, checkpoints and rollbacks, policies, limits, replay."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.sim.engine import (
    FAIL_BUDGET,
    FAIL_DEADLINE,
    FAIL_NO_REPLACEMENT,
    FAIL_WORKERS_LOST,
    CompiledCluster,
    NoRevocations,
    SimCluster,
    SimSlot,
    advance,
    replay,
    simulate,
    time_to_finish,
)


def worker(i: int, rate: float = 10.0, spot: bool = True, price: float = 0.5, od: float = 1.5) -> SimSlot:
    return SimSlot(
        f"worker-{i}",
        "worker",
        gpu="k80",
        zone="us-central1-c",
        spot=spot,
        price_per_hour=price,
        on_demand_price_per_hour=od,
        step_rate=rate,
        batch=128,
    )


def cluster(workers: int = 2, *, ps_spot: bool = False, chief: bool = True, **kw: object) -> SimCluster:
    slots = [SimSlot("ps-0", "ps", spot=ps_spot, price_per_hour=0.1, on_demand_price_per_hour=0.2)]
    if chief:
        slots.append(SimSlot("chief-0", "chief", price_per_hour=0.2))
    slots += [worker(i) for i in range(workers)]
    defaults: dict[str, object] = {
        "train_steps": 10000,
        "checkpoint_every": 1000,
        "checkpoint_cost_s": 0.0,
        "boot_delay_s": 70.0,
        "spot_extra_boot_s": 0.0,
    }
    defaults.update(kw)
    return SimCluster(tuple(slots), **defaults)  # type: ignore[arg-type]


class Lifetimes:
    """Spot instances of the given slots live ``life`` seconds (the first generation only, unless
    ``every``); everything else lives forever."""

    def __init__(self, life: dict[int, float], every: bool = False) -> None:
        self.life = life
        self.every = every
        self.calls: list[tuple[int, int, bool]] = []

    def lifetime(self, slot: int, generation: int, zone: str | None, spot: bool, t_request: float) -> float:
        self.calls.append((slot, generation, spot))
        if not spot or (generation > 0 and not self.every):
            return math.inf
        return self.life.get(slot, math.inf)


def test_no_revocations_closed_form() -> None:
    c = cluster(2, train_steps=64000, checkpoint_every=64000, spot_extra_boot_s=15.0)
    r = simulate(c, NoRevocations())
    boot = 70.0 + 15.0  # spot workers stage 15 s longer; training starts with the first worker
    assert r.finished and r.failure is None
    assert r.wall_time_s == pytest.approx(boot + 64000 / 20.0, rel=1e-12)
    hourly = sum(s.price_per_hour for s in c.slots)
    assert r.cost_usd == pytest.approx(hourly * r.wall_time_s / 3600, rel=1e-12)
    assert r.cost_by_role["ps"] == pytest.approx(0.1 * r.wall_time_s / 3600)
    assert r.cost_by_role["workers"] == pytest.approx(1.0 * r.wall_time_s / 3600)
    assert (r.revocations, r.replacements, r.steps_lost) == (0, 0, 0.0)


def test_checkpoint_stalls_add_up() -> None:
    c = cluster(1, train_steps=10000, checkpoint_every=1000, checkpoint_cost_s=3.79)
    r = simulate(c, NoRevocations())
    assert r.wall_time_s == pytest.approx(70.0 + 10000 / 10.0 + 9 * 3.79)  # no checkpoint at the last step


def test_ps_capacity_caps_async_rate_and_sync_uses_slowest() -> None:
    capped = cluster(4, ps_capacity_steps_per_s=25.0)
    assert simulate(capped, NoRevocations()).wall_time_s == pytest.approx(70.0 + 10000 / 25.0)
    slots = (worker(0, rate=10.0), worker(1, rate=4.0))
    sync = SimCluster(slots, train_steps=4000, mode="sync", checkpoint_every=4000, spot_extra_boot_s=0.0)
    assert simulate(sync, NoRevocations()).wall_time_s == pytest.approx(70.0 + 4000 / 4.0)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.floats(0, 9999),
    stall=st.sampled_from([0.0, 1.5]),
    rate=st.floats(0.5, 50),
    dt1=st.floats(0, 500),
    dt2=st.floats(0, 500),
)
def test_advance_is_additive_and_consistent_with_time_to_finish(
    steps: float, stall: float, rate: float, dt1: float, dt2: float
) -> None:
    cc = CompiledCluster(cluster(1, checkpoint_cost_s=2.0))
    if stall:
        steps = float(math.floor(steps / 1000) * 1000) or 1000.0  # a stall only happens at a checkpoint
    one = advance(cc, steps, stall, 0.0, rate, dt1 + dt2)
    a = advance(cc, steps, stall, 0.0, rate, dt1)
    two = advance(cc, a[0], a[1], a[2], rate, dt2)
    assert one[0] == pytest.approx(two[0], abs=1e-6)
    assert one[1] == pytest.approx(two[1], abs=1e-6)
    left = time_to_finish(cc, steps, stall, rate)
    assert advance(cc, steps, stall, 0.0, rate, left)[0] == pytest.approx(10000.0, abs=1e-6)


def test_worker_revocation_is_replaced_and_billed_from_request() -> None:
    c = cluster(2)
    src = Lifetimes({2: 500.0})  # worker-0 (slot 2) is revoked 500 s after its request
    r = simulate(c, src, record=True)
    assert r.finished and r.revocations == r.replacements == 1
    # 430 s at 20 steps/s, 70 s at 10 steps/s while the replacement boots, the rest at 20 steps/s again
    assert r.wall_time_s == pytest.approx(570.0 + (10000 - 430 * 20 - 700) / 20.0)
    assert (2, 1, True) in src.calls  # "replace" keeps the replacement spot
    kinds = [e.kind for e in r.events]
    assert "replace" in kinds and "rollback" not in kinds
    # workers are billed for the whole run (replacements included, boot included): 2 slots x 0.5 $/h
    assert r.cost_by_role["workers"] == pytest.approx(2 * 0.5 * r.wall_time_s / 3600)
    assert r.steps_lost == 0.0


def test_rollback_on_ps_loss_loses_steps_since_last_checkpoint() -> None:
    c = cluster(1, ps_spot=True, max_replacements=1)
    r = simulate(c, Lifetimes({0: 320.0}), record=True)  # the PS goes at 320 s: 250 s x 10 steps/s = 2500
    assert r.finished
    assert r.steps_lost == pytest.approx(500.0)  # back to the checkpoint at step 2000
    # paused until the replacement PS is up (70 s), then 8000 steps to go
    assert r.wall_time_s == pytest.approx(320.0 + 70.0 + 8000 / 10.0)
    assert [e.kind for e in r.events if e.slot == "ps-0"] == [
        "ready",
        "revoked",
        "rollback",
        "replace",
        "ready",
    ]


def test_chief_loss_during_checkpoint_write_loses_that_checkpoint() -> None:
    slots = (SimSlot("chief-0", "chief", spot=True, price_per_hour=0.1), worker(0, spot=False))
    c = SimCluster(
        slots,
        train_steps=10000,
        checkpoint_every=1000,
        checkpoint_cost_s=10.0,
        boot_delay_s=70.0,
        spot_extra_boot_s=0.0,
        max_replacements=1,
    )
    # step 2000 is reached at 70 + 100 + 10 + 100 = 280 s; its checkpoint write ends at 290 s
    r = simulate(c, Lifetimes({0: 285.0}))
    assert r.steps_lost == pytest.approx(1000.0)


def test_shrink_never_replaces_workers() -> None:
    c = cluster(2, policy="shrink")
    src = Lifetimes({2: 300.0})
    r = simulate(c, src)
    assert r.finished and r.revocations == 1 and r.replacements == 0
    # 230 s at 20 steps/s, then 10 steps/s for the remaining 5400 steps
    assert r.wall_time_s == pytest.approx(300.0 + (10000 - 230 * 20) / 10.0)
    lone = cluster(1, policy="shrink")
    r1 = simulate(lone, Lifetimes({2: 300.0}))
    assert not r1.finished and r1.failure == FAIL_WORKERS_LOST and r1.wall_time_s == pytest.approx(300.0)


def test_shrink_still_replaces_a_lost_parameter_server() -> None:
    r = simulate(cluster(1, ps_spot=True, policy="shrink"), Lifetimes({0: 320.0}))
    assert r.finished and r.replacements == 1


def test_fallback_replacement_is_on_demand_and_never_revoked() -> None:
    c = cluster(1, policy="fallback-on-demand")
    src = Lifetimes({2: 300.0})
    r = simulate(c, src, record=True)
    assert r.finished and r.revocations == 1 and r.replacements == 1
    assert (2, 1, False) in src.calls  # the replacement was requested on-demand
    replace_event = next(e for e in r.events if e.kind == "replace")
    assert "on-demand" in replace_event.detail
    # worker billed 300 s spot (0.5 $/h) then on-demand (1.5 $/h) until the end
    assert r.cost_by_role["workers"] == pytest.approx((0.5 * 300 + 1.5 * (r.wall_time_s - 300)) / 3600)


def test_max_replacements_caps_the_replacements() -> None:
    c = cluster(2, max_replacements=3)
    r = simulate(c, Lifetimes({2: 100.0}, every=True))  # worker-0 is revoked 100 s after every request
    assert r.replacements == 3 and r.revocations == 4
    assert r.finished  # worker-1 carries on alone
    lost_ps = simulate(cluster(1, ps_spot=True, max_replacements=0), Lifetimes({0: 500.0}))
    assert not lost_ps.finished and lost_ps.failure == FAIL_NO_REPLACEMENT


def test_budget_and_deadline_failures() -> None:
    base = simulate(cluster(2), NoRevocations())
    broke = simulate(cluster(2, budget_usd=base.cost_usd / 2), NoRevocations())
    assert broke.failure == FAIL_BUDGET and broke.over_budget and not broke.finished
    assert broke.cost_usd == pytest.approx(base.cost_usd / 2)
    late = simulate(cluster(2, deadline_s=base.wall_time_s / 2), NoRevocations())
    assert (
        late.failure == FAIL_DEADLINE
        and late.deadline_missed
        and late.wall_time_s == pytest.approx(base.wall_time_s / 2)
    )
    flagged = simulate(cluster(2, deadline_s=100.0, budget_usd=0.01, enforce_limits=False), NoRevocations())
    assert flagged.finished and flagged.deadline_missed and flagged.over_budget
    ok = simulate(cluster(2, deadline_s=1e6, budget_usd=100.0), NoRevocations())
    assert ok.finished and not ok.deadline_missed and not ok.over_budget


def test_replay_schedule_and_measured_rates() -> None:
    c = cluster(2)
    r = replay(
        c,
        [("worker-1", 400.0), ("chief-0", 900.0)],
        boot_delay_s=60.0,
        step_rates={"worker-0": 5.0, "worker-1": 5.0},
    )
    assert r.finished and r.revocations == 2 and r.replacements == 2
    assert r.steps_lost > 0  # the chief's loss rolled back
    assert [e.slot for e in r.events if e.kind == "revoked"] == ["worker-1", "chief-0"]
    with pytest.raises(KeyError, match="not a slot"):
        replay(c, [("worker-9", 10.0)], boot_delay_s=60.0)


def test_replay_measured_delays_and_set_rates() -> None:
    """Startup after the PS and chief are up, a replacement's rejoin, notice billing and teardown."""
    c = cluster(2)
    r = replay(
        c,
        [("worker-1", 300.0)],
        boot_delay_s=70.0,
        set_rates={frozenset({"worker-0"}): 8.0},  # alone slower than its own 10/s; both: 10 + 10
        startup_s=20.0,
        rejoin_s=15.0,
        notice_s=30.0,
        teardown_s=5.0,
    )
    # training from 70 + 20; 90-300 s at 20/s, 300-385 s at 8/s (replacement: 70 s boot + 15 s rejoin),
    # then 20/s to 10000 steps at 641 s; teardown to 646 s.
    assert r.finished and r.wall_time_s == pytest.approx(646.0)
    ready = [e.t for e in r.events if e.kind == "ready" and e.slot == "worker-1"]
    assert ready == [pytest.approx(70.0), pytest.approx(385.0)]
    billed_s = 0.1 * 646 + 0.2 * 646 + 0.5 * 646 + 0.5 * (300 + 30) + 0.5 * (646 - 300)
    assert r.cost_usd == pytest.approx(billed_s / 3600)
    # A lost chief rolls back and pays the startup again once its replacement is up.
    chief = replay(cluster(1, checkpoint_every=100), [("chief-0", 205.0)], boot_delay_s=70.0, startup_s=20.0)
    # 90-205 s at 10/s = 1150 steps, back to the checkpoint at 1100, up again at 275 + 20 s: 8900 / 10 more
    assert chief.steps_lost == pytest.approx(50.0)
    assert chief.wall_time_s == pytest.approx(295.0 + 890.0)
    with pytest.raises(ValueError, match="startup_s"):
        cluster(1, startup_s=-1.0)


def test_cluster_validation() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        SimCluster((SimSlot("ps-0", "ps"),), train_steps=10)
    with pytest.raises(ValueError, match="policy"):
        cluster(1, policy="pray")
    with pytest.raises(ValueError, match="unique"):
        SimCluster((worker(0), worker(0)), train_steps=10)


def test_sync_training_pauses_while_its_world_regroups() -> None:
    # Two sync workers at 10 steps/s; worker-1 (slot 1) is revoked at 170 s, replaced (70 s boot) and rejoins.
    slots = (worker(0, spot=False), worker(1))
    base = {"train_steps": 4000, "mode": "sync", "checkpoint_every": 4000, "spot_extra_boot_s": 0.0,
            "policy": "replace"}
    plain = simulate(SimCluster(slots, **base), Lifetimes({1: 170.0}))  # type: ignore[arg-type]
    paused = simulate(SimCluster(slots, regroup_s=9.0, notice_s=15.0, **base),  # type: ignore[arg-type]
                      Lifetimes({1: 170.0}), record=True)
    assert plain.finished and paused.finished and paused.replacements == 1
    # a shrink waits out the notice, then regroups; the grow regroups again
    assert paused.wall_time_s == pytest.approx(plain.wall_time_s + (15.0 + 9.0) + 9.0)
    assert [e.detail for e in paused.events if e.kind == "regroup"] == ["paused 24.0 s", "paused 9.0 s"]
    # the first start is no regroup, and async training never pauses for one
    assert simulate(SimCluster(slots, regroup_s=9.0, **base), NoRevocations()).wall_time_s == pytest.approx(  # type: ignore[arg-type]
        70.0 + 400.0)
