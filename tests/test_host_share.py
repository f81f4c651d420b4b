"""The local provider's host-sharing model (costmodel/host_share.py): a processor-sharing queue."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.costmodel.host_share import lockstep_steps, shared_steps
from orchestrator.model.errors import UserError


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


def test_other_work_on_the_host_shares_the_cores() -> None:
    cpu, naps = [0.2, 0.2], [0.1, 0.1]
    assert shared_steps(cpu, naps, cores=2) == pytest.approx([0.3, 0.3])  # idle host: nobody waits
    # two busy loops besides two always-busy workers on 2 cores: each worker gets half a core
    assert shared_steps(cpu, [0.0, 0.0], cores=2, background=2) == pytest.approx([0.4, 0.4], rel=1e-3)
    steps = [shared_steps(cpu, naps, cores=2, background=b)[0] for b in (0.5, 1, 2, 4)]
    assert steps == sorted(steps) and steps[0] > 0.3  # more other work, slower steps, from the first bit of it
    assert lockstep_steps(cpu, naps, cores=2, background=2)[0] == pytest.approx(0.5, rel=1e-3)


def test_the_load_is_measured_from_the_kernels_runnable_count(tmp_path: Path) -> None:
    from orchestrator.planning.host_load import host_load, measure

    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3 4\nprocs_running 4\nprocs_blocked 0\n")
    assert measure(window_s=0.01, samples=3, stat=stat).background == 3  # this process is not "other"
    real = measure(window_s=0.01, samples=3)  # this machine's /proc/stat
    assert real.measured and real.background >= 0 and real.cores >= 1
    assert host_load("0").background == 0 and not host_load("2.5").measured
    with pytest.raises(UserError, match="--host-load"):
        host_load("lots")
