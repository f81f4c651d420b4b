"""The local provider's host-sharing model (core/costmodel/host_share.py): a processor-sharing queue."""

from __future__ import annotations

import pytest

from orchestrator.core.costmodel.host_share import shared_steps


def test_no_worker_waits_when_there_are_enough_cores() -> None:
    assert shared_steps([0.2, 0.3], [0.1, 0.0], cores=2) == pytest.approx([0.3, 0.3])


def test_cpu_bound_workers_split_the_cores_evenly() -> None:
    # three workers that never sleep on two cores: each gets two thirds of a core
    assert shared_steps([0.2, 0.2, 0.2], [0.0, 0.0, 0.0], cores=2) == pytest.approx([0.3, 0.3, 0.3], rel=1e-3)


def test_workers_queue_before_the_average_demand_reaches_the_cores() -> None:
    # the README demo's shape: average CPU demand 1.82 of 2 cores, yet every step is stretched
    cpu, naps = [0.19] * 3, [0.25, 0.092, 0.075]
    steps = shared_steps(cpu, naps, cores=2)
    demand = sum(c / (c + s) for c, s in zip(cpu, naps, strict=True))
    assert demand < 2
    assert all(t > (c + s) * 1.0001 for t, c, s in zip(steps, cpu, naps, strict=True))
    assert sum(1 / t for t in steps) < 0.93 * sum(1 / (c + s) for c, s in zip(cpu, naps, strict=True))


def test_more_cores_never_slow_a_worker() -> None:
    cpu, naps = [0.2, 0.1, 0.3, 0.25], [0.05, 0.2, 0.0, 0.1]
    two, three = shared_steps(cpu, naps, 2), shared_steps(cpu, naps, 3)
    assert all(b <= a + 1e-9 for a, b in zip(two, three, strict=True))
