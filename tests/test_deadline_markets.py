"""The deadline policy holding zones and GPU types at once (issue 23, item 2: "several zones and GPU types at once,
move instead of waiting"): ``sim.multizone`` with markets of other speeds and prices, its offline optimum, and
``decide.deadline_markets``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.decide.deadline import Availability, Mode, Progress
from orchestrator.decide.deadline_markets import SlowerSpot, choose_slower_spot
from orchestrator.sim.availability import Job, bundled_traces, load_trace
from orchestrator.sim.multizone import Market, minutes_for, optimal_multi, run_multi, work_in

K80_FOR_V100 = 64.6 / 216.0  # ICAC'19's measured ResNet-32 step times (data/measurements), V100 over K80
V100_FOR_K80 = 216.0 / 64.6


def test_work_and_minutes_are_exact_inverses() -> None:
    """A tick's work and the minutes to finish agree for any speed rounded to whole minutes per tick, so the
    optimum's schedule replays to its own cost."""
    for speed in (0.3, 1.0, 3.3, 0.7):
        for work in range(1, 200):
            m = minutes_for(speed, work)
            assert work_in(speed, m) >= work > work_in(speed, m - 1)


def test_a_market_of_the_jobs_own_gpu_and_price_is_a_zone() -> None:
    """Markets that are the job's own GPU at its price give the zones' run and optimum exactly."""
    trace = load_trace(bundled_traces()[0])
    job = Job(12 * 60, 14 * 60, 12, 0.861, 2.144)
    avails = (trace.available()[300:], trace.available()[800:])
    same = (Market(), Market(1.0, 0.861))
    assert run_multi(job, avails, 10, markets=same).cost_usd == pytest.approx(run_multi(job, avails, 10).cost_usd)
    a, b = optimal_multi(job, avails, 10, markets=same), optimal_multi(job, avails, 10)
    assert a is not None and b is not None and a[0] == pytest.approx(b[0])


def test_a_k80_job_moves_to_v100_spot_instead_of_on_demand() -> None:
    """The job's own GPU (K80) has no spot; a V100, 3.3x as fast at about the same price per hour of work, has.
    The policy trains there, and the optimum's schedule replays to its cost."""
    job = Job(24 * 60, 26 * 60, 12, 0.256, 0.723)
    k80, v100 = (False,) * 200, (True,) * 200
    mk = (Market(), Market(V100_FOR_K80, 0.861))
    got = run_multi(job, (k80, v100), 10, markets=mk)
    assert [m for _, m in got.timeline] == ["spot@1", "done"]
    assert got.deadline_met and got.finish_min < 8 * 60  # 24 h of K80 work in ~7.3 h on the V100
    alone = run_multi(job, (k80,), 10)
    assert [m for _, m in alone.timeline] == ["on-demand", "done"] and got.cost_usd < alone.cost_usd / 2
    best = optimal_multi(job, (k80, v100), 10, markets=mk)
    assert best is not None and best[0] <= got.cost_usd + 1e-9
    assert run_multi(job, (k80, v100), 10, markets=mk, choices=best[1]).cost_usd == pytest.approx(best[0])


def test_holding_more_markets_is_never_dearer_for_the_optimum() -> None:
    trace = load_trace(bundled_traces()[0])
    job = Job(12 * 60, 16 * 60, 3, 0.861, 2.144)
    own = trace.available()[1990:]
    slow = tuple(not x for x in trace.available()[1990:])  # spot on the slower GPU while the own one's is out
    alone = optimal_multi(job, (own,), 10)
    both = optimal_multi(job, (own, slow), 10, markets=(Market(), Market(K80_FOR_V100, 0.256)))
    assert alone is not None and both is not None and both[0] <= alone[0] + 1e-9


def test_while_the_rule_waits_the_job_trains_on_a_slower_gpu() -> None:
    """The V100's spot is out for 3 h in the middle; a K80's is there. With slack to wait, the rule waits, and the
    job trains on the K80 meanwhile (its work there cheaper than the V100's spot would be) and comes back."""
    v100 = (True,) * 12 + (False,) * 18 + (True,) * 200
    k80 = (True,) * 230
    job = Job(8 * 60, 20 * 60, 3, 0.861, 2.144)
    got = run_multi(job, (v100, k80), 10, markets=(Market(), Market(K80_FOR_V100, 0.2)))
    assert [m for _, m in got.timeline] == ["spot@0", "spot@1", "spot@0", "done"]
    plain = run_multi(job, (v100,), 10)
    assert [m for _, m in plain.timeline][:2] == ["spot@0", "idle"]
    assert got.deadline_met and got.finish_min < plain.finish_min and got.cost_usd < plain.cost_usd


def _progress(**kw: float) -> Progress:
    base = dict(elapsed_h=2.0, work_done_h=2.0, work_h=8.0, deadline_h=14.0, overhead_h=0.2, mode=Mode.IDLE,
                spot_available=False, tick_h=1 / 6, outage_h=0.5, spot_usd_per_h=0.861, on_demand_usd_per_h=2.144)
    base.update(kw)
    return Progress(**base)  # type: ignore[arg-type]


def test_choose_slower_spot() -> None:
    outages = Availability(2.0, 3.0, (), (3.0, 4.0))
    cheap, dear = SlowerSpot(0.3, 0.2, 5.0), SlowerSpot(0.3, 1.5, 5.0)
    assert choose_slower_spot(_progress(), outages, {"k80": cheap, "x": dear}, None) == "k80"
    assert choose_slower_spot(_progress(), outages, {"x": dear}, None) is None  # billed more than it is worth
    assert choose_slower_spot(_progress(), outages, {"x": dear}, "x") == "x"  # already there: stay
    short = Availability(2.0, 0.1, (), (0.1,))  # the outage is expected to end before the start is paid off
    assert choose_slower_spot(_progress(outage_h=0.0), short, {"k80": cheap}, None) is None


def test_simulate_also_trace_adds_the_markets_rows() -> None:
    """``simulate --availability-trace ... --also-trace GPU=FILE``: the job's own trace and another GPU type's
    (here the shipped us-west-2a trace read as a K80's), replayed together; exit 2 with one line on bad input."""
    from pathlib import Path

    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    example = Path(__file__).resolve().parent.parent / "examples" / "local-deadline.yaml"
    own, other = (str(p) for p in sorted(bundled_traces(), key=lambda p: "us-west-2a" in p.name))
    base = ["simulate", str(example), "--availability-trace", own, "--start-tick", "2243", "--history-h", "0"]
    res = CliRunner().invoke(app, [*base, "--also-trace", f"k80={other}", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    rows = {p["policy"]: p for p in doc["policies"]}
    assert list(rows)[-2:] == ["deadline-markets", "optimal-markets"]
    assert rows["optimal-markets"]["cost_usd"] <= rows["optimal"]["cost_usd"] + 1e-9
    assert rows["optimal-markets"]["saving_share"] == pytest.approx(1.0)
    assert rows["deadline-markets"]["deadline_met"]
    (m,) = doc["markets"]
    assert m["gpu"] == "k80" and 0 < m["speed"] < 1 and m["spot_usd_per_h"] < doc["spot_usd_per_h"]
    for bad, says in ((["--also-trace", "k80"], "give GPU=FILE.json"),
                      (["--also-trace", "nope=" + other], "'nope' is not a GPU type"),
                      (["--also-trace", "k80=/nonexistent.json"], "cannot read the availability trace"),
                      (["--also-trace", f"k80={other}", "--policy", "greedy"], "goes with --policy all or deadline")):
        got = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *base, *bad], capture_output=True,
                             text=True, timeout=120)
        assert got.returncode == 2 and says in got.stderr and "Traceback" not in got.stderr, got.stderr
