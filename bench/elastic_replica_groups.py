"""The elastic deadline policy on torchft replica groups against elastic torchrun (issue 54 item 3), in one run.

The same elastic policy (decide.elastic) replays the NSDI'24 16-node AWS spot traces (shared/spot-traces: how many
of 16 requested spot VMs could be had every 5 minutes) for an N-worker job of 48 h of work: once as elastic torchrun,
where every change of the world restarts all workers for the restart overhead, once on replica groups
(``Job.change_min``: the workers kept pause for a quorum, timings.TORCHFT_PAUSE_S, and only the joiners boot).
Prices: V100 per VM, GCE 2019-02. Nothing here is fitted to these traces (the pause is bench/torchft_pause.py's).
Both columns are the simulator's own reckoning (a what-if of one model under two change costs), not a measurement of
real jobs: they say what the measured pause is worth to the policy, not that the simulator is right.

    python bench/elastic_replica_groups.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from orchestrator.model import timings
from orchestrator.sim.availability import Job, load_trace
from orchestrator.sim.elastic import run_elastic

ROOT = Path(__file__).resolve().parents[2] / "shared/spot-traces/availability/16-node"
SPOT, OD = 0.861, 2.144


def main() -> int:
    traces = [load_trace(p) for p in sorted(ROOT.glob("*/*.json"))]
    if not traces:
        print(f"no traces under {ROOT}", file=sys.stderr)
        return 2
    print(f"{len(traces)} traces, a start every 700 ticks after the first day; pause {timings.TORCHFT_PAUSE_S} s")
    print("workers  slack  overhead  runs  torchrun  replica groups  change  missed")
    for n in (4, 8):
        for slack_h, ovh in ((4, 3), (4, 12), (22, 3), (22, 12)):
            job = Job(48 * 60, (48 + slack_h) * 60, ovh, SPOT, OD)
            groups_job = replace(job, change_min=timings.TORCHFT_PAUSE_S / 60)
            runs = [(tr, s) for tr in traces for s in range(288, len(tr.counts) - 70 * 12, 700)]
            a = [run_elastic(job, n, tr, s, ("elastic",))["elastic"] for tr, s in runs]
            b = [run_elastic(groups_job, n, tr, s, ("elastic",))["elastic"] for tr, s in runs]
            ca, cb = sum(o.cost_usd for o in a) / len(a), sum(o.cost_usd for o in b) / len(b)
            missed = sum(not o.deadline_met for o in (*a, *b))
            print(f"{n:7d}  {slack_h:3d} h  {ovh:5d} min  {len(runs):4d}  ${ca:7.2f}  ${cb:13.2f}  "
                  f"{(cb - ca) / ca * 100:+5.1f}%  {missed:6d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
