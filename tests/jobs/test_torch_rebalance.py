"""The running job's re-split rule (jobs/torchjob/rebalance.py): pure Python, no processes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jobs"))

from torchjob.rebalance import (  # noqa: E402
    MAX_BACKOFF,
    Rebalancer,
    initial_weights,
    rebalanced,
    resplit_gain_s,
    slowdown_factor,
    spread,
)


def test_balanced_ranks_keep_their_split() -> None:
    assert rebalanced([40, 40, 16], [0.20, 0.205, 0.198]) is None  # within 5%
    assert spread([0.2, 0.1]) == 0.5


def test_examples_move_from_the_slow_rank_to_the_fast_ones_and_the_total_stays() -> None:
    # Rank 0 takes twice as long per example as planned: it must lose examples, the others gain them.
    new = rebalanced([48, 32, 16], [0.40, 0.20, 0.20])
    assert new is not None and sum(new) == 96
    assert new[0] < 48 and new[1] > 32 and new[2] > 16
    # speeds 120, 160, 80 examples/s: the proportional split evens the compute out
    times = [b / s for b, s in zip(new, [120.0, 160.0, 80.0], strict=True)]
    assert spread(times) < 0.05


def test_a_verdict_needs_two_probes_and_takes_each_ranks_faster_one() -> None:
    r = Rebalancer(every=10)
    r.start(0)
    assert not r.due(9) and r.due(10)
    assert r.record(10, [0.2, 0.9], [48, 48]) is None  # one probe (an interrupted one, for rank 1): no verdict yet
    new = r.record(20, [0.2, 0.2], [48, 48])  # rank 1's faster probe says the ranks are even
    assert new is None and r.verdict == [0.2, 0.2]
    assert r.backoff == 2 and not r.due(39) and r.due(40)  # balanced: probes become rarer


def test_a_persistent_slowdown_resplits_and_resets_the_interval() -> None:
    r = Rebalancer(every=10, backoff=MAX_BACKOFF)
    r.start(100)
    r.record(140, [0.4, 0.2], [48, 48])
    new = r.record(180, [0.41, 0.2], [48, 48])
    assert new is not None and new[0] < 48 and sum(new) == 96 and r.backoff == 1


def test_a_restarted_world_splits_by_the_speeds_it_measured() -> None:
    # slot 0 measured 100 ex/s, slot 2 never measured (a replacement): it gets its planned share of the speed
    weights = initial_weights([48, 32, 16], [100.0, 200.0, None])
    assert weights[:2] == [100.0, 200.0] and abs(weights[2] - 16 * 300 / 80) < 1e-9
    assert initial_weights([48, 48], [None, None]) == [48.0, 48.0]


def test_slowdowns_apply_from_their_step() -> None:
    assert slowdown_factor([(150, 2.0)], 149) == 1.0
    assert slowdown_factor([(150, 2.0)], 150) == 2.0
    assert slowdown_factor([(300, 1.0), (150, 2.0)], 320) == 1.0


def test_a_resplit_that_would_not_repay_its_measured_cost_is_declined() -> None:
    # The verdicts of a real run (data/measurements/raw/h200-mps-resplit-2026-11-28-metrics.jsonl: three ranks
    # at 100/25/10% of an H200's SMs, 360 steps), where each re-split cost about 3.3 s of cuDNN autotuning.
    r = Rebalancer(10)
    r.cost_s = 3.3
    step60 = ([2028, 709, 335], [0.07832, 0.10386, 0.10408])  # 18.6 ms a step x 300 steps left: 5.6 s
    step80 = ([2222, 578, 272], [0.0879, 0.09896, 0.09266])  # 8.7 ms a step x 280 steps left: 2.4 s
    assert 0.018 < resplit_gain_s(*step60) < 0.019 and 0.008 < resplit_gain_s(*step80) < 0.009
    for _ in range(2):
        new = r.record(60, step60[1], step60[0], steps_left=300)
    assert new is not None and sum(new) == 3072 and r.declined is None
    for _ in range(2):
        new = r.record(80, step80[1], step80[0], steps_left=280)
    assert new is None and r.declined is not None and r.declined["cost_s"] == 3.3
    assert r.backoff == 2  # declined reads as balanced: the probes become rarer
    # A long job repays the same re-split many times over; before any cost is measured, none is declined.
    for _ in range(2):
        new = r.record(80, step80[1], step80[0], steps_left=100_000)
    assert new is not None
    fresh = Rebalancer(10)
    for _ in range(2):
        new = fresh.record(80, step80[1], step80[0], steps_left=1)
    assert new is not None
