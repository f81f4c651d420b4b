"""The deadline studies' one offline optimum: least cost to finish by the deadline knowing every market's trace.

A market set: spot in any of K markets (zones, or other GPU types: a ``Market``'s speed and spot price), each with
its measured availability (aligned tick for tick), and on-demand on the job's own GPU; one market is a set of one.
Backward dynamic programming over (tick, work done in minutes, what runs, overhead still to run), vectorised over
the work done; with the make-before-break what-if (``Job.hop_overhead_min``) also over on-demand training while a
standby spot VM boots in a market. ``sim.availability.run_policy`` (one market) and ``sim.multizone.run_multi``
replay its choices to its cost (tests/test_deadline_policy.py, test_deadline_markets.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from orchestrator.decide.deadline import Mode
from orchestrator.sim.deadline_job import Job, boot_bill, boot_ticks, price_per_min


@dataclass(frozen=True)
class Market:
    """Where a spot VM may run besides the job's own zone: another zone, or another GPU type. ``speed``: work
    per minute there, relative to the GPU the job's work is measured on (its step time / this GPU's, measured);
    ``spot_usd_per_h``: its spot price (None: the job's). On-demand always runs the job's own GPU."""

    speed: float = 1.0
    spot_usd_per_h: float | None = None


def markets_of(job: Job, k: int, markets: tuple[Market, ...] | None, tick: int) -> tuple[Market, ...]:
    """One market per trace, each with its price, and its speed rounded to whole minutes of work per tick (so a
    tick's work and the minutes to finish are exact inverses, ``work_in`` and ``minutes_for``)."""
    ms = markets or (Market(),) * k
    assert len(ms) == k, "one market per trace"
    return tuple(Market(max(1, round(m.speed * tick)) / tick,
                        job.spot_usd_per_h if m.spot_usd_per_h is None else m.spot_usd_per_h) for m in ms)


def work_in(speed: float, minutes: int) -> int:
    """Whole minutes of the job's work done in ``minutes`` of training on a GPU of ``speed``."""
    return minutes if speed == 1.0 else math.floor(speed * minutes + 1e-9)


def minutes_for(speed: float, work: int) -> int:
    """Minutes of training a GPU of ``speed`` needs for ``work`` minutes of the job's work (``work_in``'s inverse)."""
    return work if speed == 1.0 else math.ceil(work / speed - 1e-9)


def minutes_for_each(speed: float, work: np.ndarray) -> np.ndarray:
    """``minutes_for`` of each element of ``work``."""
    return work if speed == 1.0 else np.ceil(work / speed - 1e-9).astype(int)


def aligned(avails: tuple[tuple[bool, ...], ...], i: int) -> tuple[bool, ...]:
    """Each market's availability at tick ``i`` (past a trace's end: none)."""
    return tuple(a[i] if i < len(a) else False for a in avails)


Choices = list[tuple[Mode, int]]  # (mode, market index; -1 unless spot) per tick
Standby = tuple[int, int]  # a standby spot VM's market and its boot ticks to go (0: up), while on-demand trains


@dataclass(frozen=True)
class Grid:
    """The program's dimensions. Modes: 0 idle, 1..K spot in market k-1, K+1 (``od``) on-demand."""

    job: Job
    tick: int
    ms: tuple[Market, ...]

    @property
    def k(self) -> int:
        return len(self.ms)

    @property
    def od(self) -> int:
        return self.k + 1

    @property
    def kb(self) -> int:
        return 0 if self.job.hop_overhead_min is None else boot_ticks(self.job, self.tick)

    def overheads(self) -> list[int]:
        """The overhead still to run at a tick's start, after a start of the whole overhead or of a hop's."""
        firsts = {self.job.overhead_min, *(() if self.job.hop_overhead_min is None else (self.job.hop_overhead_min,))}
        return sorted({0, *(x - j * self.tick for x in firsts for j in range(1, x // self.tick + 1)
                            if x - j * self.tick > 0)})

    def speed(self, ci: int) -> float:
        return 1.0 if ci == self.od else self.ms[ci - 1].speed

    def into(self, ci: int, rc: int, then: np.ndarray, room: int) -> np.ndarray:
        """Running mode ``ci`` with ``rc`` minutes of overhead still to run this tick: finish, or go on to ``then``."""
        job, tick, speed = self.job, self.tick, self.speed(ci)
        price = price_per_min(job, Mode.ON_DEMAND) if ci == self.od else (self.ms[ci - 1].spot_usd_per_h or 0.0) / 60
        w = np.arange(job.work_min + 1)
        need = rc + minutes_for_each(speed, job.work_min - w)
        v = np.full(job.work_min + 1, math.inf)
        fin = need <= room
        v[fin] = price * need[fin]
        nw = w + work_in(speed, max(0, tick - rc))
        go = (~fin) & (nw < job.work_min)
        v[go] = price * tick + then[nw[go]]
        return v


def optimal_multi(job: Job, avails: tuple[tuple[bool, ...], ...], tick: int,
                  markets: tuple[Market, ...] | None = None) -> tuple[float, Choices] | None:
    """The offline optimum over the markets (``markets``: each trace's speed and spot price, as ``run_multi``'s;
    one trace: the job's own market): least cost to finish by the deadline knowing every trace, and its (mode,
    market) at each tick; None when no schedule finishes in time."""
    g = Grid(job, tick, markets_of(job, len(avails), markets, tick))
    rs = g.overheads()
    r_idx = {r: j for j, r in enumerate(rs)}
    nxt = np.full((g.k + 2, len(rs), job.work_min + 1), math.inf)
    nxt_sb = np.full((g.k, g.kb, job.work_min + 1), math.inf)
    nxt[:, :, job.work_min] = nxt_sb[:, :, job.work_min] = 0.0
    best: list[tuple[np.ndarray, np.ndarray]] = []
    for i in range(math.ceil(job.deadline_min / tick) - 1, -1, -1):
        room = min(tick, job.deadline_min - i * tick)
        cur, arg, nxt_sb, arg_sb = _tick(g, aligned(avails, i), room, nxt, nxt_sb, r_idx)
        best.append((arg, arg_sb))
        nxt = cur
    if not math.isfinite(nxt[0, 0, 0]):
        return None
    best.reverse()
    return float(nxt[0, 0, 0]), _forward(g, avails, best, r_idx)


def _tick(g: Grid, a: tuple[bool, ...], room: int, nxt: np.ndarray, nxt_sb: np.ndarray, r_idx: dict[int, int]
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One tick of the backward program: each state's least cost from here, and its choice (0: wait)."""
    job, od, kb, d, h = g.job, g.od, g.kb, g.job.overhead_min, g.job.hop_overhead_min
    rs = list(r_idx)
    opts = [z + 1 for z in range(g.k) if a[z]] + [od]
    starts = {d, *rs, *(() if h is None else (h,))}
    run = {(ci, rc): g.into(ci, rc, nxt[ci, r_idx[max(0, rc - g.tick)]], room) for ci in opts for rc in starts}
    booting = {z: [boot_bill(job, g.tick, j + 1, g.ms[z].spot_usd_per_h) + g.into(od, 0, nxt_sb[z, j], room)
                   for j in range(kb)] for z in range(g.k) if a[z] and h is not None}
    cur = np.full(nxt.shape, math.inf)
    arg = np.zeros(nxt.shape, dtype=np.int8)
    for mi in range(g.k + 2):
        for ri, r in enumerate(rs):
            if mi == 0 and r:
                continue
            boots = mi == od and r == 0  # spot from on-demand boots a standby there (with the what-if)
            cands = [(ci, run[ci, r] if ci == mi else booting[ci - 1][kb - 1] if boots and ci - 1 in booting
                      else run[ci, d]) for ci in opts]
            cur[mi, ri], arg[mi, ri] = _least(nxt[0, 0], cands)
    cur_sb = np.full(nxt_sb.shape, math.inf)
    arg_sb = np.zeros(nxt_sb.shape, dtype=np.int8)
    for z in range(g.k):
        for j in range(kb):  # spot there: go on booting, or hop once it is up; anything else gives the standby up
            if a[z]:
                assert h is not None
                stay = booting[z][j - 1] if j else run[z + 1, h]
                cur_sb[z, j], arg_sb[z, j] = _least(nxt[0, 0], [
                    (ci, stay if ci == z + 1 else run[od, 0] if ci == od else run[ci, d]) for ci in opts])
            else:  # the standby is lost with spot: on-demand trains on as before
                cur_sb[z, j], arg_sb[z, j] = cur[od, r_idx[0]], arg[od, r_idx[0]]
    for z in range(g.k):
        if not a[z]:  # a spot VM in this market is lost at this tick: its state is that of nothing running
            cur[z + 1], arg[z + 1] = cur[0, 0], arg[0, 0]
    cur[:, :, job.work_min] = cur_sb[:, :, job.work_min] = 0.0
    return cur, arg, cur_sb, arg_sb


def _least(wait: np.ndarray, cands: list[tuple[int, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest of waiting (``wait``: the next tick's value of nothing running) and each (choice, value)."""
    v, k = wait.copy(), np.zeros(len(wait), dtype=np.int8)
    for ci, cand in cands:
        better = cand < v
        v[better], k[better] = cand[better], ci
    return v, k


def switch(g: Grid, m: int, c: int, r: int, sb: Standby | None) -> tuple[int, int, Standby | None]:
    """Choosing mode ``c`` where ``m`` runs with ``r`` minutes of its start to go: what runs this tick, its start
    still to run and the standby. With make-before-break hops, spot chosen while on-demand trains boots (or goes on
    booting) a standby there, and a standby that is up takes over for the hop's own overhead."""
    if g.job.hop_overhead_min is not None and m == g.od and 1 <= c <= g.k:
        if (sb is None and r == 0) or (sb is not None and sb[0] == c - 1 and sb[1] != 0):
            return g.od, r, (c - 1, (g.kb if sb is None else sb[1]) - 1)
        if sb == (c - 1, 0):
            return c, g.job.hop_overhead_min, None
    if c == m:
        return c, r, None
    return c, (g.job.overhead_min if c != 0 else 0), None


def _forward(g: Grid, avails: tuple[tuple[bool, ...], ...], best: list[tuple[np.ndarray, np.ndarray]],
             r_idx: dict[int, int]) -> Choices:
    """The optimum's choice at each tick, following its argmins from the start (as the simulators replay them)."""
    w, r, m, out = 0, 0, 0, []
    sb: Standby | None = None
    for i, (arg, arg_sb) in enumerate(best):
        a = aligned(avails, i)
        if 1 <= m <= g.k and not a[m - 1]:
            m, r = 0, 0
        if sb is not None and not a[sb[0]]:
            sb = None  # preempted while it booted (or before it took over)
        c = int(arg_sb[sb[0], sb[1], w] if sb is not None else arg[m, r_idx[r], w])
        out.append((Mode.IDLE, -1) if c == 0 else (Mode.ON_DEMAND, -1) if c == g.od else (Mode.SPOT, c - 1))
        m, r, sb = switch(g, m, c, r, sb)
        if m != 0:
            speed = g.speed(m)
            if r + minutes_for(speed, g.job.work_min - w) <= g.tick:
                break
            w += work_in(speed, max(0, g.tick - r))
            r = max(0, r - g.tick)
    return out
