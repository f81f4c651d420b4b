"""Finishing by a deadline (issue 23): the online policies that pick spot, on-demand or waiting at each
decision point, the same pure functions for the simulator (sim.availability) and the daemon."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from orchestrator.decide import knobs


class Mode(StrEnum):
    IDLE = "idle"
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class Standing:
    """Where a job stands against its deadline, the state every family of deadline policy reads (hours from the
    job's start; ``decide.policies``): one market (``Progress``), several (``decide.deadline_markets.MarketSet``, a
    ``Progress`` and its markets) and elastic counts (``decide.elastic.ElasticState``, its work in full-cluster hours).
    The line of uniform progress and the slack are computed here alone."""

    elapsed_h: float
    work_done_h: float
    work_h: float
    deadline_h: float
    overhead_h: float
    tick_h: float
    overhead_left_h: float

    @property
    def slack_h(self) -> float:
        """Hours the job can still lose (waiting, restarts) and finish on time."""
        return self.deadline_h - self.elapsed_h - (self.work_h - self.work_done_h) - self.overhead_left_h

    @property
    def ahead_h(self) -> float:
        """Hours of work done beyond the line of uniform progress (work_h / deadline_h per hour). It equals the
        slack left less the slack's even share of the time left: how much slack has been spent faster than evenly."""
        return self.work_done_h - self.elapsed_h * self.work_h / self.deadline_h


@dataclass(frozen=True)
class Progress(Standing):
    """Where a job stands against its deadline in one spot market (hours from the job's start)."""

    elapsed_h: float
    work_done_h: float  # training time done, in no-revocation hours of the job's work
    work_h: float  # the whole job's work (the planner's predicted no-revocation time)
    deadline_h: float
    overhead_h: float  # restart overhead: boot + restore + lost steps
    mode: Mode  # what runs now (IDLE after a preemption)
    spot_available: bool  # can a spot VM be had now (no stockout / quota block; trace tick > 0)
    tick_h: float  # time until the next decision
    overhead_left_h: float = 0.0  # of the current VM's start, still to run
    outage_h: float = 0.0  # how long spot has been out (0 when it can be had)
    spot_up_h: float = 0.0  # how long spot has been available (0 when it cannot be had)
    spot_usd_per_h: float = 0.3
    on_demand_usd_per_h: float = 1.0
    hop_overhead_h: float | None = None  # a what-if: a make-before-break hop's overhead (sim.availability.Job)

    @property
    def hop_h(self) -> float:
        """The slack a hop from on-demand to spot costs: the whole overhead, unless the spot VM boots alongside."""
        return self.overhead_h if self.hop_overhead_h is None else self.hop_overhead_h


@dataclass(frozen=True)
class Availability:
    """Spot availability seen so far: mean lengths of the up and down stretches (hours), and the finished
    stretches themselves, for what is left of one of a given age (stretches are heavy-tailed: an outage
    that has lasted an hour is likely to last longer than a fresh one)."""

    up_h: float
    down_h: float
    ups: tuple[float, ...] = ()
    downs: tuple[float, ...] = ()

    @classmethod
    def from_samples(cls, samples: tuple[bool, ...], tick_h: float) -> Availability:
        """The stretches of ``samples`` (one per tick)."""
        log = AvailabilityLog()
        for x in samples:
            log.add(x)
        return log.seen(tick_h)

    def up_left(self, age_h: float) -> float:
        return _left(self.ups, age_h, self.up_h)

    def down_left(self, age_h: float) -> float:
        return _left(self.downs, age_h, self.down_h)


def _left(stretches: tuple[float, ...], age_h: float, mean_h: float) -> float:
    """Mean of what is left of the seen stretches longer than ``age_h``; without any, the mean (or the age)."""
    longer = [x - age_h for x in stretches if x > age_h]
    if longer:
        return sum(longer) / len(longer)
    return max(mean_h - age_h, age_h) if stretches else mean_h


@dataclass
class AvailabilityLog:
    """Stretches of availability seen so far (the open one counts in the means), added one tick at a time:
    the simulator's thousands of ticks and the daemon's passes read the same figures."""

    ticks: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    runs: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    closed: dict[bool, list[int]] = field(default_factory=lambda: {True: [], False: []})
    last: bool | None = None
    open_ticks: int = 0

    def add_stretch(self, available: bool, ticks: int) -> None:
        """A stretch that ended before the log's first tick (seen by an earlier job): it counts in the means and
        the stretches, and is never the open one. Only before ``add``."""
        self.ticks[available] += ticks
        self.runs[available] += 1
        self.closed[available].append(ticks)

    def add(self, available: bool) -> None:
        self.ticks[available] += 1
        if available != self.last:
            self.runs[available] += 1
            if self.last is not None:
                self.closed[self.last].append(self.open_ticks)
            self.open_ticks = 0
        self.open_ticks += 1
        self.last = available

    def seen(self, tick_h: float, prior: Availability | None = None) -> Availability:
        """Mean stretches; a side never seen keeps ``prior`` (default: ``DEFAULT_AVAILABILITY``)."""
        prior = prior or DEFAULT_AVAILABILITY
        up = tick_h * self.ticks[True] / self.runs[True] if self.runs[True] else prior.up_h
        down = tick_h * self.ticks[False] / self.runs[False] if self.runs[False] else prior.down_h
        return Availability(up, down, tuple(tick_h * n for n in self.closed[True]),
                            tuple(tick_h * n for n in self.closed[False]))


# The note events (``events.to_status``) that record each change of spot capacity the daemon saw.
SPOT_SEEN_EVENTS: Final = {True: "spot-up", False: "spot-down"}
# ... and of each zone's, where the provider says by zone (GCE's advice for each zone): the zone leads the reason.
ZONE_SEEN_EVENTS: Final = {True: "zone-spot-up", False: "zone-spot-down"}
# ... and of how many spot VMs can be had, where the provider counts them: the reason begins with the count.
SPOT_COUNT_EVENT: Final = "spot-count"
# ... and each change of the elastic policy's choice: the reason begins "<spot> spot + <on-demand> on-demand".
ELASTIC_CHOICE_EVENT: Final = "elastic-choice"
DRAIN_EVENT: Final = "drain"  # the note event of an instance drained before a deadline hop (its notice written)


def count_of_reason(reason: str) -> int:
    """The count a ``SPOT_COUNT_EVENT`` note's reason begins with (0 where it does not: a note of another version)."""
    head = reason.split(" ", 1)[0]
    return int(head) if head.isdigit() else 0


def choice_of_reason(reason: str) -> tuple[int, int] | None:
    """(spot, on-demand) of an ``ELASTIC_CHOICE_EVENT`` note's reason; None where it does not say."""
    words = reason.split(" ", 5)
    if len(words) < 5 or not (words[0].isdigit() and words[3].isdigit()):
        return None
    return int(words[0]), int(words[3])


def seen_during_job(changes: tuple[tuple[float, bool], ...], started: float, now: float, tick_s: float,
                    hour_s: float, before: tuple[tuple[bool, float], ...] = ()) -> tuple[Availability, float]:
    """What the daemon has seen of spot, as the simulator's ``AvailabilityLog`` sees it: the stretches ``before``
    the job ((available, seconds) of each, seen by earlier jobs in the same spot market in the HISTORY_H hours
    before it: the simulator's history), then the capacity at each past tick of the job (from ``changes``, (time,
    available) at each change the daemon recorded, job clock), and the age of the current up stretch (hours; 0
    when spot is out). ``hour_s``: seconds of the job's clock per hour of cloud time."""
    log = AvailabilityLog()
    for available, seconds in before:
        log.add_stretch(available, max(1, round(seconds / tick_s)))
    ticks = int((now - started) / tick_s + 1e-9)
    k = 0
    for t in range(ticks):
        at = started + t * tick_s + 1e-6
        while k < len(changes) and changes[k][0] <= at:
            k += 1
        if k:
            log.add(changes[k - 1][1])
    up_since = changes[-1][0] if changes and changes[-1][1] else None
    age = 0.0 if up_since is None else int((now - up_since) / tick_s + 1e-9) * tick_s / hour_s
    return log.seen(tick_s / hour_s), age


HISTORY_H: Final = 24.0  # the availability a policy may have seen before the job starts (simulator and daemon)
# Without any history: up stretches of 2 h and outages of 1 h, about the medians of the means of the
# NSDI'24 availability traces (shared/spot-traces; 1.1-4.4 h up, 0.5-3 h down, one 12 h outlier).
DEFAULT_AVAILABILITY: Final = Availability(2.0, 1.0)


def _safe(p: Progress, choice: Mode) -> Mode:
    """The safety net every deadline-aware policy shares: a choice that could leave no time to start an
    on-demand VM (after a preemption, or after waiting this tick) becomes on-demand now."""
    s, d = p.slack_h, p.overhead_h
    start = p.hop_h if p.mode == Mode.ON_DEMAND else d  # the spot VM's start, if it is not running yet
    if choice == Mode.SPOT and s < (d if p.mode == Mode.SPOT else start + d):
        return Mode.ON_DEMAND
    if choice == Mode.IDLE and s - p.tick_h < d:
        return Mode.ON_DEMAND
    return choice


def greedy_policy(p: Progress) -> Mode:
    """Spot whenever it can be had; on-demand only when the deadline forces it, then to the end."""
    if p.mode == Mode.ON_DEMAND:
        return Mode.ON_DEMAND
    return _safe(p, Mode.SPOT if p.spot_available else Mode.IDLE)


_EPS_H: Final = 1e-9  # hours: float noise in the paper's comparisons, which its authors make in exact seconds


def uniform_progress_policy(p: Progress) -> Mode:
    """"Can't Be Late" (NSDI'24) Uniform Progress, rule by rule as its authors' simulator runs it (sky_spot's
    ``rc_cr_threshold``; the check: bench/deadline_policy.py, tests/test_uniform_progress_paper.py). Spot whenever
    it can be had; with none, on-demand only while behind the line of uniform progress, waiting otherwise; on on-demand,
    stay while spot is out, and leave for spot only once ahead of the line's value 2 overheads later (the
    hysteresis, cp(t) > ep(t + 2d)); then the paper's safety net (``_paper_safety_net``)."""
    ahead, line = ahead_h(p), p.work_h / p.deadline_h
    choice = Mode.SPOT if p.spot_available else Mode.IDLE
    if ahead < -_EPS_H and not p.spot_available:
        choice = Mode.ON_DEMAND
    if p.mode == Mode.ON_DEMAND and (not p.spot_available or ahead <= 2 * p.overhead_h * line + _EPS_H):
        choice = Mode.ON_DEMAND
    return _paper_safety_net(p, choice)


def _paper_safety_net(p: Progress, choice: Mode) -> Mode:
    """Uniform Progress's safety net, in whole ticks as its authors count it (the time to the deadline rounded
    down, the work left plus restarts rounded up): off spot, on-demand once the work left and two restarts fill
    the ticks left; once one restart does, on-demand unless a spot VM is running past its start (kept until
    preempted: a preemption then still leaves room for on-demand's start)."""
    left = math.floor((p.deadline_h - p.elapsed_h) / p.tick_h + _EPS_H)
    work_left = p.work_h - p.work_done_h

    def need(restarts: int) -> int:
        return math.ceil((work_left + restarts * p.overhead_h) / p.tick_h - _EPS_H)

    if p.mode != Mode.SPOT and need(2) >= left:
        choice = Mode.ON_DEMAND
    if need(1) >= left:
        running = p.mode == Mode.SPOT and p.spot_available and p.overhead_left_h < _EPS_H
        choice = Mode.SPOT if running else Mode.ON_DEMAND
    return choice


def ahead_h(p: Standing) -> float:
    """``Standing.ahead_h``: hours of work done beyond the line of uniform progress."""
    return p.ahead_h


def hop_age_h(p: Progress, seen: Availability) -> float:
    """The age a spot stretch must have reached before the job leaves on-demand for it. A hop that fails
    spends the spot VM's start and the on-demand one's after it (two overheads of slack), so the slack
    left pays for HOP_BUDGET x slack / (those two) hops; when more spot stretches than that are expected
    before the deadline (time left / (mean up + mean down)), only the longest of them are worth one, and
    the stretches seen say which age only those reach. 0: the slack pays for every stretch."""
    chances = (p.deadline_h - p.elapsed_h) / max(1e-9, seen.up_h + seen.down_h)
    budget = knobs.HOP_BUDGET * max(0.0, p.slack_h) / (p.hop_h + p.overhead_h)
    if not seen.ups or chances <= budget:
        return 0.0
    longest = sorted(seen.ups, reverse=True)
    keep = max(1, min(len(longest), round(budget / chances * len(longest))))
    return longest[keep - 1] - p.tick_h  # a stretch that has lasted this long is one of the ``keep`` longest


def hop_pays(p: Progress, seen: Availability) -> bool:
    """Whether to leave on-demand for the spot stretch there is now. Its saving, (on-demand - spot price) x
    what is left of the stretch (capped at the work left), must beat HOP_GAIN x the hop's cost: the overhead
    at the spot price now and at the on-demand price after the next preemption. With stretches seen, the
    saving is averaged over those that outlived the current one's age, the stretch must be old enough
    (``hop_age_h``: the slack pays only for so many hops), and hopping now must be worth more than waiting
    one tick to see whether the stretch goes on (most stretches that end do so within a tick or two:
    waiting skips those hops for one tick of saving on the others). With none seen yet (a job's first
    stretch, without history): the mean stretch, and only when LINE_HOP overheads ahead of the line."""
    d, left, age = p.overhead_h, p.work_h - p.work_done_h, p.spot_up_h
    save = p.on_demand_usd_per_h - p.spot_usd_per_h
    cost = knobs.HOP_GAIN * d * (p.spot_usd_per_h + p.on_demand_usd_per_h)
    if not seen.ups:
        return ahead_h(p) >= knobs.LINE_HOP * d and save * min(seen.up_left(age), left) >= cost
    if age < hop_age_h(p, seen) - 1e-9:
        return False
    rest = [x - age for x in seen.ups if x > age + 1e-9]  # what is left of each stretch that lived this long
    if not rest:
        return save * min(seen.up_left(age), left) >= cost
    now = sum(save * min(r, left) - cost for r in rest) / len(rest)
    later = sum(save * min(r - p.tick_h, left) - cost for r in rest if r > p.tick_h + 1e-9) / len(rest)
    return now >= max(0.0, later)


def deadline_policy(p: Progress, seen: Availability = DEFAULT_AVAILABILITY) -> Mode:
    """The product's own policy. The line of uniform progress rations the slack (as in Uniform Progress),
    with a margin: a spot outage is waited out only while the job is at least LINE_WAIT overheads ahead of
    the line, so a later hop back to spot still finds slack, or while it is on or above the line and the
    outage is expected to be short (``short_outage``). Spot is taken whenever it can be had from
    nothing; from on-demand only when ``hop_pays``: the spot stretch, at its age, is expected (from the
    stretches ``seen``) to save more than the hop costs, it is old enough to be one of the stretches the
    slack left can pay hops for, and hopping now beats waiting a tick. Uniform Progress hops on every blip
    of spot, and each failed hop spends both money and slack; this gate is what it does not know."""
    d, ahead = p.overhead_h, ahead_h(p)
    if p.spot_available:
        if p.mode != Mode.ON_DEMAND:
            return _safe(p, Mode.SPOT)
        if p.slack_h < d + p.hop_h:
            return Mode.ON_DEMAND
        return Mode.SPOT if hop_pays(p, seen) else Mode.ON_DEMAND
    if p.mode == Mode.ON_DEMAND:
        return Mode.ON_DEMAND  # stay until spot is back (and worth the hop)
    if ahead >= 0 and short_outage(p, seen):
        return _safe(p, Mode.IDLE)
    return _safe(p, Mode.ON_DEMAND if ahead < knobs.LINE_WAIT * d else Mode.IDLE)


def short_outage(p: Progress, seen: Availability) -> bool:
    """Whether the outage there is now, at its age, is expected (from the outages seen; none seen: never) to end
    within WAIT_SHORT overheads, counting this tick. Bridging it on on-demand costs that VM's start and then a
    hop back (two restarts, in money and slack, and the hop gate may hold the job on on-demand longer), while
    waiting costs only the outage's slack: on a trace of one-tick blips, on-demand at each blip is all loss."""
    return bool(seen.downs) and seen.down_left(p.outage_h) + p.tick_h <= knobs.WAIT_SHORT * p.overhead_h


def on_demand_policy(p: Progress) -> Mode:
    return Mode.ON_DEMAND


def choose_zone(current: str | None, up_ages_h: dict[str, float], seen: dict[str, Availability]) -> str | None:
    """Where a spot VM runs when the job holds several zones (or GPU types) at once: stay where it runs while
    that zone still has spot (a move costs a restart); else move to the zone whose spot stretch, at its age,
    is expected to last longest (``up_ages_h``: the zones that have spot now, each with its stretch's age).
    None: no zone has spot."""
    if current is not None and current in up_ages_h:
        return current
    if not up_ages_h:
        return None
    return max(sorted(up_ages_h), key=lambda z: seen.get(z, DEFAULT_AVAILABILITY).up_left(up_ages_h[z]))


def zone_availability(here: Availability | None, anywhere: Availability) -> Availability:
    """What the deadline policy reads when the job holds several zones (the simulator's ``sim.multizone`` and the
    daemon's ``decide.deadline_zones``): the up stretches of the zone ``choose_zone`` picked (``here``; None: no zone
    has spot), and the outages of spot in every zone at once (``anywhere``)."""
    up = here if here is not None else anywhere
    return Availability(up.up_h, anywhere.down_h, up.ups, anywhere.downs)
