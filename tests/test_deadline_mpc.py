"""The model-predictive deadline policy (decide.deadline_mpc): its MDP's choices where the answer is known,
and no deadline missed on measured traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.decide import deadline_mpc
from orchestrator.decide.deadline import Availability, Mode, Progress
from orchestrator.sim.availability import Job, load_trace, run_policy

TRACE = Path(__file__).resolve().parent.parent / "data" / "spot-availability"


def _solve(chain: deadline_mpc.Chain, work: int = 120, deadline: int = 180, overhead: int = 6,
           tick: int = 10) -> deadline_mpc.Solution:
    return deadline_mpc.solve(work, deadline, overhead, tick, 0.3, 1.0, chain)


def _pick(sol: deadline_mpc.Solution, i: int, u: int, mode: tuple[Mode, int] = (Mode.IDLE, 0),
          up: bool = True) -> Mode:
    j = 0 if up else len(deadline_mpc.BUCKETS)
    return (Mode.IDLE, Mode.SPOT, Mode.ON_DEMAND)[int(sol.choice[i, sol.modes.index(mode), j, u])]


def test_spot_that_never_goes_away_is_taken() -> None:
    always = deadline_mpc.Chain(up=(0.0,) * len(deadline_mpc.BUCKETS), down=(1.0,) * len(deadline_mpc.BUCKETS))
    sol = _solve(always)
    assert _pick(sol, 0, 60) == Mode.SPOT
    assert _pick(sol, 0, 60, (Mode.ON_DEMAND, 0)) == Mode.SPOT  # the hop pays for itself over the whole job


def test_spot_that_never_comes_waits_only_as_long_as_the_slack_allows() -> None:
    never = deadline_mpc.Chain(up=(1.0,) * len(deadline_mpc.BUCKETS), down=(0.0,) * len(deadline_mpc.BUCKETS))
    sol = _solve(never)
    # Waiting can only lose slack when spot never comes: on-demand at once, from any slack.
    assert all(_pick(sol, 0, u, up=False) == Mode.ON_DEMAND for u in range(6, 61))


def test_waits_for_spot_that_comes_back_soon_when_the_slack_is_ample() -> None:
    flicker = deadline_mpc.Chain(up=(0.05,) * len(deadline_mpc.BUCKETS), down=(0.9,) * len(deadline_mpc.BUCKETS))
    sol = _solve(flicker)
    assert _pick(sol, 0, 60, up=False) == Mode.IDLE
    assert _pick(sol, 0, 8, up=False) == Mode.ON_DEMAND  # one more tick of waiting leaves no room to restart


def test_fitted_hazards_follow_the_stretches_seen() -> None:
    # Short blips of spot and long outages: a fresh spot stretch is likely to end, an old outage to go on.
    seen = Availability(up_h=1 / 6, down_h=10.0, ups=(1 / 6,) * 20, downs=(5.0, 10.0, 20.0) * 5)
    chain = deadline_mpc.fit_chain(seen, 1 / 6)
    assert chain.up[0] > 0.5
    assert chain.down[-1] < 0.1


def test_the_decision_is_a_pure_function_of_its_inputs() -> None:
    p = Progress(elapsed_h=1.0, work_done_h=0.5, work_h=2.0, deadline_h=3.0, overhead_h=0.1, mode=Mode.IDLE,
                 spot_available=False, tick_h=1 / 6, outage_h=0.5)
    first = deadline_mpc.mpc_policy(p)
    deadline_mpc._CACHE.clear()
    assert deadline_mpc.mpc_policy(p) == first


@pytest.mark.parametrize("start", [150, 1200, 2600])
@pytest.mark.parametrize(("slack_h", "overhead_min"), [(1, 12), (4, 3)])
def test_no_deadline_missed_on_a_measured_trace(start: int, slack_h: int, overhead_min: int) -> None:
    trace = load_trace(TRACE / "aws-10-26-2022_us-west-2b_v100_1.json")
    job = Job(12 * 60, (12 + slack_h) * 60, overhead_min, 0.861, 2.144)
    full = trace.available()
    out = run_policy("deadline-mpc", job, full[start:], trace.tick_min, history=full[start - 144:start])
    assert out.deadline_met
