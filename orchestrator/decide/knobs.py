"""Every tuned constant of the deadline policies, one value each, in one place (issue 53, item 3). The policies
read them here at call time, so the benches' grid searches (bench/deadline_policy.py --tune,
bench/deadline_elastic.py --tune) set them on this module."""

from __future__ import annotations

# One market (decide.deadline), tuned (bench/deadline_policy.py --tune) on the EVEN start points of every trace;
# the odd ones are held out.
LINE_WAIT = 1.0  # spot out: on-demand once less than this many overheads ahead of uniform progress
LINE_HOP = 1.0  # no stretch seen yet: on-demand -> spot only when this many overheads ahead of the line
HOP_GAIN = 1.0  # a hop from on-demand to spot must be expected to save this many times its cost
HOP_BUDGET = 0.75  # hops the slack left pays for: this many times slack left / (2 overheads)
WAIT_SHORT = 4.0  # spot out, on or above the line: wait out an outage expected to end within this many overheads

# Several markets (decide.deadline_markets): while the rule waits out an outage of the job's own spot, work done on
# a slower GPU's spot is worth the job's spot price plus this share of on-demand's premium (the work it takes off
# the end of the job, some of which the deadline would have put on on-demand). Set on the bench's even start
# points (0.25-1 alike, 0 lower).
SLOWER_VALUE = 0.5

# Elastic counts (decide.elastic), tuned (bench/deadline_elastic.py --tune) on the EVEN start points of the
# 16-node traces; odd ones held out.
TOPUP_LINE = 1.0  # top up with on-demand once less than this many overheads ahead of the line
DROP_LINE = 4.0  # trade on-demand VMs for fewer than GROW_FRAC new spot VMs once this far ahead
GROW_FRAC = 0.5  # grow onto newly free spot VMs (a restart) only for at least this share of N
HOP_AGE = 1.0  # ... and only once they have been up this many overheads (stretches are heavy-tailed)
RESERVE = 2.0  # overheads of the time left held back for restarts when sizing the top-up
TOPUP_EXTRA = 1  # on-demand VMs added beyond the need, so the next shortfall needs no restart
HOP_LINE = 0.25  # trade on-demand VMs for spot only once this many overheads ahead of the line
DELEGATE = True  # with all or none of N spot VMs to be had, decide as the all-or-nothing deadline policy
# A restart of the whole cluster onto more spot VMs must be expected to save this many times its cost: the
# elastic counterpart of HOP_GAIN (it was named HOP_GAIN too, at 2.0 where the one-market knob is 1.0: each was
# tuned on its own bench, so they stay two knobs with two names).
GROW_GAIN = 2.0
