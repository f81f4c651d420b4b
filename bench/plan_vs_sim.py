"""Planner vs simulator on the same cluster with no revocation: time and cost must agree (goal: within 2%).

Both take the cluster's boot, start-up, checkpoint pauses and teardown from one function
(``orchestrator.costmodel.accounting.run_accounting``) and the step rates from the same place (the cost
model for cloud GPUs; this host's CPU step plus the measured emulation curves for the local provider).

    python bench/plan_vs_sim.py [SPEC.yaml ...]     # default: the examples that pin a cluster
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.model.spec import SpecError, load_spec  # noqa: E402
from orchestrator.planning.local_run import plan_job as plan  # noqa: E402
from orchestrator.sim.engine import NoRevocations, simulate  # noqa: E402
from orchestrator.sim.from_spec import cluster_from_spec  # noqa: E402


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]] or sorted((REPO / "examples").glob("*.yaml"))
    print(f"{'spec':34} {'plan time':>10} {'sim time':>10} {'diff':>7} {'plan $':>9} {'sim $':>9} {'diff':>7}")
    worst = 0.0
    for path in paths:
        try:
            spec = load_spec(path)
        except SpecError as exc:
            print(f"{path.name:34} skipped: {str(exc).splitlines()[0][:80]}")
            continue
        if spec.cluster is None:
            continue
        chosen = plan(spec)[0].chosen
        assert chosen is not None
        t_plan, c_plan = chosen.base_time_s, chosen.hourly_usd * chosen.base_time_s / 3600
        res = simulate(replace(cluster_from_spec(spec), enforce_limits=False), NoRevocations())
        dt, dc = t_plan / res.wall_time_s - 1, c_plan / res.cost_usd - 1
        worst = max(worst, abs(dt), abs(dc))
        print(f"{path.name:34} {t_plan:10.1f} {res.wall_time_s:10.1f} {dt:+7.2%} {c_plan:9.4f} {res.cost_usd:9.4f} "
              f"{dc:+7.2%}")
    print(f"largest disagreement: {worst:.2%} (goal <= 2%)")


if __name__ == "__main__":
    main()
