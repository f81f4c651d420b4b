"""A model-predictive deadline policy (issue 23): fit a semi-Markov model of spot availability to the
stretches seen so far, solve the finite-horizon MDP to the deadline by backward dynamic programming, and
act on its expected-cost-minimising choice.

State of the MDP at a decision point: the tick, the slack left before the current VM's overhead ``u``
(minutes: deadline - now - work left), what runs (idle, spot or on-demand, with the restart overhead still
to run) and the availability state: spot up or down, and how long the current stretch has lasted, in age
buckets (stretches are heavy-tailed, so a long outage is likely to go on; a fresh spot stretch is likely to
be short). Each bucket has its own hazard, fitted from the stretches seen (with a memoryless prior of
``DEFAULT_AVAILABILITY``'s means as pseudo-counts). The deadline is a hard constraint (a large cost for
missing it); ``policy._safe`` still guards every choice.

Cost and timing follow ``sim.market_replay``'s tick exactly (whole minutes, price per minute), so the
MDP's ideal is the simulator's ideal. The solution is a table of choices over every state, cached by the
job and the model quantised on a coarse grid: the decision is a pure function of ``Progress`` and
``Availability``, and a run re-solves only when the fitted model moves across the grid.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from orchestrator.decide.deadline import DEFAULT_AVAILABILITY, Availability, Mode, Progress, _safe, deadline_policy

# Age buckets (ticks the current stretch has lasted, this tick included): 1, 2-3, 4-9, 10-29, 30+.
BUCKETS: Final = (1, 2, 4, 10, 30)
PRIOR_TICKS: Final = 2.0  # the prior's pseudo-exposure per tick of a bucket's width
HAZARD_GRID: Final = 2.0  # hazards are rounded to powers of this: the model key changes only on real moves
REFIT_EVERY: Final = 4  # stretches a side takes in at a time: each refit is a new MDP to solve
MISS: Final = 1e6  # the cost of missing the deadline: a hard constraint in practice
TIE: Final = 1e-4  # dollars: values closer than this are equal (float32)
_CACHE: OrderedDict[tuple[object, ...], Solution] = OrderedDict()
_CACHE_BYTES: Final = 300_000_000  # solutions kept (a re-solve costs up to a second or two)
SOLVES = [0]  # how many MDPs have been solved (the bench reports it)


@dataclass(frozen=True)
class Chain:
    """The availability model: per side (up, down), each age bucket's hazard (the chance the stretch ends
    after this tick)."""

    up: tuple[float, ...]
    down: tuple[float, ...]

    def states(self) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
        """Whether each availability state is up, and the transition matrix between them (up buckets first)."""
        b = len(BUCKETS)
        up = np.array([True] * b + [False] * b)
        P = np.zeros((2 * b, 2 * b))
        for side, hz in enumerate((self.up, self.down)):
            for k, h in enumerate(hz):
                j = side * b + k
                P[j, (1 - side) * b] = h  # the stretch ends: the other side, fresh
                stay = 1.0 - h
                if k + 1 < b:  # within a bucket of width w the age moves on with chance 1/w per tick
                    move = 1.0 / (BUCKETS[k + 1] - BUCKETS[k])
                    P[j, j + 1] += stay * move
                    P[j, j] += stay * (1 - move)
                else:
                    P[j, j] += stay
        return up, P


def _hazards(stretches: tuple[float, ...], mean_h: float, tick_h: float, tail: bool) -> tuple[float, ...]:
    """Each age bucket's hazard from the finished stretches (in ticks), shrunk towards a heavy-tailed prior:
    the memoryless 1/mean, but no more than 1/age (what is left of a stretch is about as long as it has
    lasted), so an age the stretches seen never reached is not taken to end soon."""
    lengths = [max(1, round(x / tick_h)) for x in stretches]
    out = []
    for k, lo in enumerate(BUCKETS):
        hi = BUCKETS[k + 1] if k + 1 < len(BUCKETS) else math.inf
        prior = min(1.0, tick_h / max(mean_h, tick_h), 1.0 / lo if tail else 1.0)
        weight = PRIOR_TICKS * (hi - lo if hi < math.inf else lo)
        exposure = sum(max(0, min(n, hi - 1) - lo + 1) for n in lengths)
        ends = sum(lo <= n < hi for n in lengths)
        h = (ends + weight * prior) / (exposure + weight)
        out.append(HAZARD_GRID ** round(math.log(max(h, 1e-4)) / math.log(HAZARD_GRID)))
    return tuple(min(1.0, h) for h in out)


def fit_chain(seen: Availability, tick_h: float) -> Chain:
    """The finished stretches' hazards; the prior is ``DEFAULT_AVAILABILITY``'s means, not the running ones,
    which move every tick (each move would be a new model to solve). With no stretch seen at all (the
    daemon today) the model is memoryless: the age of a stretch, which the daemon does not track, is moot."""
    tail = bool(seen.ups or seen.downs)
    prior = DEFAULT_AVAILABILITY if tail else seen
    ups, downs = (x[:len(x) - len(x) % REFIT_EVERY] if len(x) >= REFIT_EVERY else x for x in (seen.ups, seen.downs))
    return Chain(_hazards(ups, prior.up_h, tick_h, tail), _hazards(downs, prior.down_h, tick_h, tail))


@dataclass(frozen=True)
class Solution:
    """The MDP's choice (0 idle, 1 spot, 2 on-demand) per (tick, mode state, availability state, slack)."""

    choice: npt.NDArray[np.int8]  # from tick ``first`` on
    first: int
    modes: tuple[tuple[Mode, int], ...]  # (what runs, overhead minutes left) of each mode state
    slack_min: int


def _shift(v: npt.NDArray[np.float64], by: int) -> npt.NDArray[np.float64]:
    """``v`` at slack ``u - by`` for each ``u`` (MISS below zero slack)."""
    out = np.full_like(v, MISS)
    if by <= 0:
        return v.copy()
    if by < v.shape[-1]:
        out[..., by:] = v[..., :-by]
    return out


def solve(work_min: int, deadline_min: int, overhead_min: int, tick_min: int, spot_usd_per_h: float,
          on_demand_usd_per_h: float, chain: Chain, first: int = 0) -> Solution:
    """Backward dynamic programming from the deadline to tick ``first`` over every state (the choices after
    a tick do not depend on the ones before it, so a model fitted mid-run is solved from there on)."""
    SOLVES[0] += 1
    W, D, d, tick = work_min, deadline_min, overhead_min, tick_min
    S = max(0, D - W)
    n = math.ceil(D / tick)
    rs = sorted({0, *(d - k * tick for k in range(1, d // tick + 1) if d - k * tick > 0)})
    modes = ((Mode.IDLE, 0), *((Mode.SPOT, r) for r in rs), *((Mode.ON_DEMAND, r) for r in rs))
    index = {m: k for k, m in enumerate(modes)}
    up, P = chain.states()
    J = len(up)
    price = {Mode.SPOT: spot_usd_per_h / 60, Mode.ON_DEMAND: on_demand_usd_per_h / 60}
    u = np.arange(S + 1)
    nxt = np.full((len(modes), J, S + 1), MISS, dtype=np.float32)
    P = P.astype(np.float32)
    first = min(first, n - 1)
    choice = np.zeros((n - first, len(modes), J, S + 1), dtype=np.int8)
    down_rows = ~up
    for i in range(n - 1, first - 1, -1):
        t = i * tick
        room = min(tick, D - t)
        # Expected value at the next decision; a spot VM is lost where spot goes down.
        exp = {}
        for m, k in index.items():
            v = nxt[k]
            if m[0] == Mode.SPOT:
                v = np.where(up[:, None], v, nxt[0])
            exp[m] = P @ v
        wait = _shift(exp[Mode.IDLE, 0], tick)
        run = {}
        ending = D - t - room <= S + d  # finishing within this tick is possible for some slack
        for c in (Mode.SPOT, Mode.ON_DEMAND):
            for rc in {d, *rs}:
                v = _shift(exp[c, max(0, rc - tick)], min(tick, rc))
                v += price[c] * tick
                if ending:
                    need = np.maximum(0, rc + D - t - u)
                    fin = need <= room
                    v[:, fin] = (price[c] * need[fin])[None, :]
                if c == Mode.SPOT:
                    v[down_rows] = MISS  # none to be had
                run[c, rc] = v
        cur = np.empty_like(nxt)
        for k, (mk, r) in enumerate(modes):
            spot = run[Mode.SPOT, r if mk == Mode.SPOT else d]
            od = run[Mode.ON_DEMAND, r if mk == Mode.ON_DEMAND else d]
            # Ties go to progress: spot before on-demand, either before waiting.
            take_spot = (spot <= od + TIE) & up[:, None]
            best = np.where(take_spot, spot, od)
            take_run = best <= wait + TIE
            cur[k] = np.where(take_run, best, wait)
            choice[i - first, k] = np.where(take_run, np.where(take_spot, 1, 2), 0)
        nxt = np.minimum(cur, MISS)
    return Solution(choice, first, modes, S)


def _solution(p: Progress, chain: Chain, i: int) -> Solution:
    tick = max(1, round(p.tick_h * 60))
    key = (round(p.work_h * 60), round(p.deadline_h * 60), round(p.overhead_h * 60), tick,
           p.spot_usd_per_h, p.on_demand_usd_per_h, chain)
    sol = _CACHE.get(key)
    if sol is None or sol.first > i:
        sol = solve(round(p.work_h * 60), round(p.deadline_h * 60), round(p.overhead_h * 60), tick,
                    p.spot_usd_per_h, p.on_demand_usd_per_h, chain, max(0, i))
        _CACHE[key] = sol
        while len(_CACHE) > 1 and sum(s.choice.nbytes for s in _CACHE.values()) > _CACHE_BYTES:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return sol


def mpc_choice(p: Progress, seen: Availability = DEFAULT_AVAILABILITY) -> Mode | None:
    """The MDP's choice for ``p``; None where the state is outside its table (past the deadline, or slack
    spent): the caller's safety net decides."""
    tick = max(1, round(p.tick_h * 60))
    i = round(p.elapsed_h * 60 / tick)
    u = round(60 * (p.deadline_h - p.elapsed_h - (p.work_h - p.work_done_h)))
    if not (0 <= i < math.ceil(p.deadline_h * 60 / tick) and 0 <= u <= round(60 * (p.deadline_h - p.work_h))):
        return None
    sol = _solution(p, fit_chain(seen, p.tick_h), i)
    r = round(p.overhead_left_h * 60)
    mode = (p.mode, r if p.mode != Mode.IDLE else 0)
    if mode not in sol.modes:
        return None
    age = 1 + round((p.spot_up_h if p.spot_available else p.outage_h) / p.tick_h)
    bucket = max(k for k, lo in enumerate(BUCKETS) if age >= lo)
    j = bucket if p.spot_available else len(BUCKETS) + bucket
    return (Mode.IDLE, Mode.SPOT, Mode.ON_DEMAND)[int(sol.choice[i - sol.first, sol.modes.index(mode), j, u])]


def mpc_policy(p: Progress, seen: Availability = DEFAULT_AVAILABILITY) -> Mode:
    """The MDP's choice behind the shared safety net; outside its table, the rule-based deadline policy."""
    c = mpc_choice(p, seen)
    if c is None:
        return deadline_policy(p, seen)
    if c == Mode.SPOT and not p.spot_available:  # cannot happen from the table; kept for the daemon's sake
        c = Mode.ON_DEMAND
    return _safe(p, c)
