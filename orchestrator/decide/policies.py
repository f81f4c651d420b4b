"""The deadline policies by name, in one place (issue 53, item 3): every name ``simulate``, ``plan``'s outlook, the
benches and the daemon pick a policy by, with what it is. Every tuple of names is read off this table.

Three families share one state of where the job stands against its deadline (``decide.deadline.Standing``): one
market (``decide.deadline.Progress``: spot, on-demand or nothing), several markets at once (zones, GPU types:
``decide.deadline_markets.MarketSet``; one market is a set of one) and elastic counts (``decide.elastic.ElasticState``:
how many spot VMs of the same markets). Each policy is a ``Rule``: a state in, a choice out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Protocol, TypeVar

from orchestrator.decide import deadline, deadline_mpc
from orchestrator.decide.deadline import Availability, Mode, Progress

S_contra = TypeVar("S_contra", contravariant=True)
C_co = TypeVar("C_co", covariant=True)


class Rule(Protocol[S_contra, C_co]):
    """One deadline policy: where the job stands (a family's state) in, what to run next out."""

    def __call__(self, state: S_contra, /) -> C_co: ...


class Family(StrEnum):
    MARKET = "market"  # one spot market: spot, on-demand or nothing (sim.availability)
    MARKETS = "markets"  # several markets at once: zones, GPU types (sim.multizone)
    ELASTIC = "elastic"  # how many spot VMs of one market, topped up on on-demand (sim.elastic)


OneMarketRule = Callable[[Progress, Availability], Mode]


@dataclass(frozen=True)
class Entry:
    name: str
    family: Family
    rule: OneMarketRule | None = None  # the one-market decision; None: offline, or another family's own rule
    offline: bool = False  # the optimum: knows the trace (the simulator only)
    learns: bool = False  # reads the availability seen (the others ignore it)
    trial: bool = False  # named only, never in "all" (nor in plan's outlook)
    on_counts: bool = False  # also replayed on a counted trace, all or nothing over the cluster (sim.elastic)


REGISTRY: Final = (
    Entry("on-demand", Family.MARKET, lambda p, _: deadline.on_demand_policy(p), on_counts=True),
    Entry("greedy", Family.MARKET, lambda p, _: deadline.greedy_policy(p)),
    Entry("uniform-progress", Family.MARKET, lambda p, _: deadline.uniform_progress_policy(p), on_counts=True),
    Entry("deadline", Family.MARKET, deadline.deadline_policy, learns=True, on_counts=True),
    Entry("elastic", Family.ELASTIC),
    Entry("optimal", Family.MARKET, offline=True, on_counts=True),
    # The model-predictive deadline policy (decide.deadline_mpc). On the held-out bench it captures as much of the
    # saving as ``deadline`` but is dearer than uniform progress in more cells and ~15x slower to simulate, so
    # ``deadline`` stays the rule (bench/deadline_policy.py --mpc).
    Entry("deadline-mpc", Family.MARKET, deadline_mpc.mpc_policy, learns=True, trial=True),
    Entry("deadline-zones", Family.MARKETS),  # the deadline policy holding every zone at once
    Entry("optimal-zones", Family.MARKETS, offline=True),
    Entry("deadline-markets", Family.MARKETS),  # ... and every GPU type of ``policy.also_gpus``
    Entry("optimal-markets", Family.MARKETS, offline=True),
)
BY_NAME: Final = {e.name: e for e in REGISTRY}

# The views callers pick from, in the table's order.
ONLINE_POLICIES: Final = tuple(e.name for e in REGISTRY if e.family == Family.MARKET and not (e.offline or e.trial))
DEADLINE_POLICIES: Final = tuple(e.name for e in REGISTRY if e.family == Family.MARKET and not e.trial)  # "all"
TRIAL_POLICIES: Final = tuple(e.name for e in REGISTRY if e.trial)
LEARNING_POLICIES: Final = tuple(e.name for e in REGISTRY if e.learns)
COUNTED_ONLINE: Final = tuple(e.name for e in REGISTRY
                              if (e.on_counts or e.family == Family.ELASTIC) and not e.offline)
COUNTED_POLICIES: Final = tuple(e.name for e in REGISTRY if e.on_counts or e.family == Family.ELASTIC)
ZONE_POLICIES: Final = ("deadline-zones", "optimal-zones")  # the online row and its optimum
MARKET_POLICIES: Final = ("deadline-markets", "optimal-markets")
assert all(n in BY_NAME for n in (*ZONE_POLICIES, *MARKET_POLICIES))


def decide_one(name: str, p: Progress, seen: Availability = deadline.DEFAULT_AVAILABILITY) -> Mode:
    """What to run next under the named one-market online policy."""
    rule = BY_NAME[name].rule
    if rule is None:
        raise KeyError(f"{name} is not an online one-market policy")
    return rule(p, seen)
