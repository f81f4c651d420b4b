"""One deadline-policy design (issue 53, item 3): policies by name in one table, one value per knob, one state of
where the job stands that every family reads, one market as a market set of one, and elastic's all-or-nothing
view as that market for the whole cluster."""

from __future__ import annotations

import ast
import itertools
import random
from dataclasses import fields
from pathlib import Path

import pytest

from orchestrator.decide import deadline as policy
from orchestrator.decide import deadline_markets, knobs, policies
from orchestrator.decide.deadline import Availability, Mode, Progress, Standing
from orchestrator.decide.elastic import ElasticState, Members

PACKAGE = Path(__file__).resolve().parent.parent / "orchestrator"
KNOBS = {n for n in vars(knobs) if n.isupper()}


def _progress(rng: random.Random) -> Progress:
    deadline = rng.uniform(10, 60)
    work = rng.uniform(0.3, 0.95) * deadline
    elapsed = rng.uniform(0, deadline * 0.9)
    available = rng.random() < 0.6
    return Progress(elapsed_h=elapsed, work_done_h=min(work, rng.uniform(0, 1.2) * elapsed * work / deadline),
                    work_h=work, deadline_h=deadline, overhead_h=rng.choice((0.05, 0.2)),
                    mode=rng.choice(list(Mode)), spot_available=available, tick_h=0.05,
                    overhead_left_h=rng.choice((0.0, 0.05)), outage_h=0.0 if available else rng.uniform(0, 3),
                    spot_up_h=rng.uniform(0, 5) if available else 0.0)


def _seen(rng: random.Random) -> Availability:
    ups = tuple(rng.uniform(0.05, 6) for _ in range(rng.randrange(4)))
    downs = tuple(rng.uniform(0.05, 3) for _ in range(rng.randrange(4)))
    return Availability(rng.uniform(0.5, 4), rng.uniform(0.2, 2), ups, downs)


def test_one_market_is_a_market_set_of_one() -> None:
    rng = random.Random(53)
    for _ in range(3000):
        p, seen = _progress(rng), _seen(rng)
        if p.mode == Mode.IDLE:
            p = Progress(**{**{f.name: getattr(p, f.name) for f in fields(p)}, "overhead_left_h": 0.0})
        mode, where = deadline_markets.decide_set(deadline_markets.MarketSet.of_one(p, seen))
        assert mode == policy.deadline_policy(p, seen)
        assert where == (deadline_markets.OWN if mode == Mode.SPOT else None)


def test_elastic_reads_the_one_market_state_for_the_whole_cluster() -> None:
    s = ElasticState(workers=4, elapsed_h=3.0, work_done_h=2.0, work_h=20.0, deadline_h=30.0, overhead_h=0.2,
                     tick_h=0.05, running=Members(4, 0), spot_can=5, overhead_left_h=0.05, spot_usd_per_h=0.3,
                     on_demand_usd_per_h=1.0)
    whole = s.whole(Mode.SPOT, 1.5)
    assert (whole.spot_available, whole.spot_usd_per_h, whole.on_demand_usd_per_h) == (True, 1.2, 4.0)
    assert (whole.slack_h, whole.ahead_h) == (s.slack_h, s.ahead_h)
    assert isinstance(s, Standing) and isinstance(whole, Standing)
    # the line and the slack are Standing's alone: no family restates them
    assert "slack_h" not in vars(ElasticState) and "ahead_h" not in vars(ElasticState)
    assert "slack_h" not in vars(Progress)


def test_policies_are_named_in_one_table() -> None:
    assert policies.DEADLINE_POLICIES == ("on-demand", "greedy", "uniform-progress", "deadline", "optimal")
    assert policies.DEADLINE_POLICIES[:-1] == policies.ONLINE_POLICIES
    assert policies.COUNTED_POLICIES == ("on-demand", "uniform-progress", "deadline", "elastic", "optimal")
    assert policies.LEARNING_POLICIES == ("deadline", "deadline-mpc")
    assert policies.TRIAL_POLICIES == ("deadline-mpc",)
    # no other module spells a tuple of two or more policy names
    names = set(policies.BY_NAME)
    for path in PACKAGE.rglob("*.py"):
        if path.name == "policies.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple):
                spelled = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
                assert len(spelled) < 2, f"{path}:{node.lineno} names policies {spelled}: use decide.policies"


def test_each_knob_has_one_value_in_one_place() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.name == "knobs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    assert not (isinstance(t, ast.Name) and t.id in KNOBS), f"{path}:{node.lineno} sets knob {t.id}"


def test_each_online_one_market_policy_decides_by_name() -> None:
    rng = random.Random(7)
    for name, _ in itertools.product(policies.ONLINE_POLICIES, range(50)):
        p = _progress(rng)
        assert policies.decide_one(name, p) in set(Mode)


def test_the_daemon_plans_a_deadline_job_through_one_planning_object() -> None:
    """The daemon's pace never calls the planner itself (issue 52, item 1): control.deadline asks
    planning.outlook.DeadlinePlans, and its caches are objects', not module dicts: the driver's loop owns them
    (``control.driver.DriverState``, passed down run_pass -> drive -> job_view), with its work in flight."""
    from orchestrator.control import deadline as ctl
    from orchestrator.control import driver
    from orchestrator.planning.outlook import DeadlinePlans

    tree = ast.parse(Path(ctl.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                and n.module.startswith("orchestrator.sim") for a in n.names}
    assert imported == set()
    held = [t.id for n in tree.body if isinstance(n, ast.AnnAssign | ast.Assign)
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Name) and (isinstance(n.value, ast.Dict) or (
                isinstance(n.value, ast.Call) and getattr(n.value.func, "id", "") == "DeadlineCache"))]
    assert held == []
    assert not hasattr(ctl, "CACHE") and not any(
        hasattr(driver, n) for n in ("_inflight", "_pools", "_reported"))  # the pass loop's, in its DriverState
    assert isinstance(driver.DriverState().deadline.plans, DeadlinePlans)


def test_one_offline_optimum_with_its_make_before_break_what_if() -> None:
    """One offline optimum (``sim.optimum``): one market is a market set of one, and the make-before-break what-if
    (``Job.hop_overhead_min``) is the optimum's own, for any market set: two markets with one trace cost what one
    does, and the one-market simulator replays the set of one's choices to its cost."""
    from orchestrator.model.paths import data_dir
    from orchestrator.sim import availability
    from orchestrator.sim.availability import Job, load_trace, run_policy
    from orchestrator.sim.optimum import optimal_multi

    assert not hasattr(availability, "optimal_choices")
    trace = load_trace(data_dir() / "spot-availability" / "aws-10-26-2022_us-west-2b_v100_1.json")
    avail = trace.available()
    for start, deadline, hop in ((200, 600, None), (1100, 900, 3), (2000, 700, 0)):
        job = Job(480, deadline, 12, 0.9, 3.06, hop)
        one = optimal_multi(job, (avail[start:],), trace.tick_min)
        two = optimal_multi(job, (avail[start:],) * 2, trace.tick_min)
        assert one is not None and two is not None
        assert two[0] == pytest.approx(one[0])
        replayed = run_policy("optimal", job, avail[start:], trace.tick_min, choices=[mode for mode, _ in one[1]])
        assert replayed.cost_usd == pytest.approx(one[0]) and replayed.deadline_met


def test_one_simulator_loop() -> None:
    """The one-market and the several-market replays are ``sim.market_replay``'s one loop (one market: a set of
    one), with no loop of their own."""
    loops = {name: [n for n in ast.walk(ast.parse((PACKAGE / "sim" / name).read_text())) if isinstance(n, ast.While)]
             for name in ("availability.py", "multizone.py", "market_replay.py")}
    assert not loops["availability.py"] and not loops["multizone.py"] and len(loops["market_replay.py"]) == 1
