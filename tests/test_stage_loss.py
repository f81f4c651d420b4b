"""costmodel.stage_loss: wait for a lost stage's replacement or re-partition over the survivors."""

from __future__ import annotations

import math

import pytest

from orchestrator.costmodel.stage_loss import REPARTITION, WAIT, decide_stage_loss


def test_a_slow_replacement_and_a_short_remainder_re_partition() -> None:
    # 100 steps left at 1 s; survivors 1.2 s a step. Wait: 600 s boot + 20 s restore + 100 s at 4 VMs' price.
    d = decide_stage_loss(100, 1.0, 1.2, 600.0, 20.0, 4.0, 3.0)
    assert d.action == REPARTITION
    assert d.wait.time_s == pytest.approx(720.0) and d.wait.usd == pytest.approx(2880.0)
    assert d.repartition.time_s == pytest.approx(140.0) and d.repartition.usd == pytest.approx(420.0)
    assert "repartition is cheaper" in d.reason


def test_a_long_remainder_waits_for_the_replacement() -> None:
    # 10,000 steps: 5,000 s of slower steps (three VMs at 1.5 s cost more a step than four at 1 s) outweigh a 90 s boot
    d = decide_stage_loss(10_000, 1.0, 1.5, 90.0, 20.0, 4.0, 3.0)
    assert d.action == WAIT
    # at 1.2 s the three survivors are cheaper a step than the four: re-partitioning is cheaper however long
    assert decide_stage_loss(10_000, 1.0, 1.2, 90.0, 20.0, 4.0, 3.0).action == REPARTITION


def test_no_partition_of_the_survivors_fits_so_it_waits() -> None:
    d = decide_stage_loss(10, 1.0, None, 1e6, 20.0, 4.0, 3.0)
    assert d.action == WAIT and not d.repartition.possible and math.isinf(d.repartition.usd)
    assert "fits" in d.reason


def test_the_objective_decides_between_cheaper_and_faster() -> None:
    # Survivors are much slower but cheap: re-partitioning is cheaper, waiting is faster.
    args = (1000, 1.0, 2.0, 300.0, 0.0, 4.0, 1.0)
    assert decide_stage_loss(*args).action == REPARTITION
    assert decide_stage_loss(*args, objective="time").action == WAIT


def test_a_deadline_rules_out_the_option_that_misses_it() -> None:
    # Re-partitioning is cheaper (2,000 s) but waiting (1,300 s) alone meets a 1,500 s deadline.
    args = (1000, 1.0, 2.0, 300.0, 0.0, 4.0, 1.0)
    assert decide_stage_loss(*args, deadline_left_s=1500.0).action == WAIT
    assert "within the deadline" in decide_stage_loss(*args, deadline_left_s=1500.0).reason
    assert decide_stage_loss(*args, deadline_left_s=5000.0).action == REPARTITION


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        decide_stage_loss(-1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)


def test_a_repartition_delay_counts_for_the_repartition_only() -> None:
    base = decide_stage_loss(100, 1.0, 1.2, 60.0, 10.0, 3.0, 2.0)
    later = decide_stage_loss(100, 1.0, 1.2, 60.0, 10.0, 3.0, 2.0, repartition_delay_s=30.0)
    assert later.wait == base.wait and later.repartition.time_s == base.repartition.time_s + 30.0
