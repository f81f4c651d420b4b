"""Revocation models fitted to a lifetime trace: how long a spot / preemptible VM lives.

Per GPU type four models are fitted by censored maximum likelihood: ``empirical`` (Kaplan-Meier),
``exponential``, ``weibull`` and ``bathtub`` (early-failure Weibull with shape <= 1 plus a late
component before the 24 h cap). A zone with trace rows gets the pooled GPU shape times a hazard
multiplier (posterior mean under a Gamma(2, 2) prior: (revocations + 2) / (expected + 2)), because a
zone has too few revocations for a fit of its own. GPU types absent from the trace use the fit pooled
over all GPU types (key ``all``); CPU instances (PS, chief) use a Weibull through the published
``cpu`` row of ``revocation_summary.csv`` (4 % revoked in the first hour, 17.5 % before 24 h).

Preemptible VMs (``preemptible=True``) are stopped at 24 h; spot VMs have no cap and the fitted
hazard is extrapolated (see each model's docstring). A calendar factor scales the hazard on weekends
(the 2019 study saw no revocation on a weekend; the trace itself is Monday-Friday only).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final, Protocol

import numpy as np

from orchestrator.costmodel.revocation import fit_cache
from orchestrator.costmodel.revocation.distributions import (
    HOUR,
    LifetimeDist,
    Weibull,
    fit_bathtub,
    fit_empirical,
    fit_exponential,
    fit_weibull,
    ks_distance,
)
from orchestrator.costmodel.revocation.distributions import Exponential as _Exponential
from orchestrator.costmodel.revocation.traces import (
    BoolArray,
    FloatArray,
    RevocationSummary,
    Trace,
    load_revocation_summary,
    load_trace,
)

KINDS: Final = ("empirical", "exponential", "weibull", "bathtub")
DEFAULT_KIND: Final = "bathtub"
PREEMPTIBLE_CAP_S: Final = 86400.0
REVOKED_CUTOFF_S: Final = 23.9 * HOUR  # the trace's definition of "revoked before the 24 h limit"
POOLED: Final = "all"
CPU: Final = "cpu"
ZONE_PRIOR_STRENGTH: Final = 2.0
CALENDAR_HORIZON_DAYS: Final = 28


@dataclass(frozen=True)
class CalendarFactor:
    """Multiplier on the revocation hazard by day of week (Saturday and Sunday are the weekend).

    The trace was recorded Monday to Friday, so the fitted hazards are weekday hazards (factor 1).
    The source study saw no revocations on weekends; the default weekend factor 0.1 is "small", not
    zero, because weekends were observed far less. Use ``CalendarFactor(weekend=0.0)`` for the
    study's literal finding or ``CalendarFactor(weekend=1.0)`` to ignore the calendar.
    """

    weekday: float = 1.0
    weekend: float = 0.1

    def at(self, when: datetime) -> float:
        return self.weekend if when.weekday() >= 5 else self.weekday


@dataclass(frozen=True)
class FitSummary:
    """One fitted model, for printing: parameters and goodness of fit against the trace."""

    gpu: str  # lowercase GPU key, "all" (every GPU pooled) or "cpu"
    zone: str | None  # None = pooled over zones
    kind: str
    params: dict[str, float]
    n: int  # VMs in the trace
    events: int  # of which revoked
    loglik: float | None
    aic: float | None
    ks: float | None  # sup |F_model - F_KaplanMeier| over the observed range
    revoked_observed: float | None  # fraction revoked before 23.9 h in the trace
    revoked_model: float  # model P(lifetime < 23.9 h)
    first_hour_observed: float | None
    first_hour_model: float
    note: str = ""


@dataclass(frozen=True)
class _ZoneAdjust:
    multiplier: float
    events: int
    expected: float
    n: int


@dataclass
class _GpuFit:
    """One GPU type's (or the pool's) rows and each model kind fitted to them, fitted when first asked for: a
    plan samples one kind of a few GPU types, and the bathtub's censored likelihood fit is most of its CPU time."""

    key: str
    times: FloatArray
    events: BoolArray
    zones: dict[str, tuple[FloatArray, BoolArray]]
    cap_s: float
    _dists: dict[str, LifetimeDist] = field(default_factory=dict)
    _zone_adjust: dict[str, dict[str, _ZoneAdjust]] = field(default_factory=dict)  # kind -> zone -> adj

    def dist(self, kind: str) -> LifetimeDist:
        if kind not in self._dists:
            self._dists[kind] = _FITTERS[kind](self.times, self.events, self.cap_s)
        return self._dists[kind]

    def zone_adjust(self, kind: str) -> dict[str, _ZoneAdjust]:
        if kind not in self._zone_adjust:
            dist, adj = self.dist(kind), {}
            for zone, (zt, ze) in self.zones.items():
                expected = float(np.sum(dist.cum_hazard(zt)))
                d = int(ze.sum())
                mult = (d + ZONE_PRIOR_STRENGTH) / (expected + ZONE_PRIOR_STRENGTH) if math.isfinite(expected) else 1.0
                adj[zone] = _ZoneAdjust(mult, d, expected, len(zt))
            self._zone_adjust[kind] = adj
        return self._zone_adjust[kind]


_FITTERS: Final[dict[str, Callable[[FloatArray, BoolArray, float], LifetimeDist]]] = {
    "empirical": lambda t, e, cap: fit_empirical(t, e),
    "exponential": lambda t, e, cap: fit_exponential(t, e),
    "weibull": lambda t, e, cap: fit_weibull(t, e),
    "bathtub": lambda t, e, cap: _bathtub(t, e, cap),
}


def _bathtub(times: FloatArray, events: BoolArray, cap: float) -> LifetimeDist:
    key = fit_cache.digest(times, events, cap)
    fit = fit_cache.cached(key)
    if fit is None:
        fit = fit_bathtub(times, events, cap)
        fit_cache.keep(key, fit)
    return fit


class LifetimeModel(Protocol):
    """What the Monte Carlo needs from a revocation model (``RevocationModel`` or a test double)."""

    def sample_lifetimes(
        self,
        gpu: str | None,
        zone: str | None,
        n: int,
        rng: np.random.Generator,
        *,
        preemptible: bool = False,
        kind: str = DEFAULT_KIND,
        start: datetime | None = None,
        hazard_multiplier: float = 1.0,
    ) -> FloatArray: ...


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"'{kind}' is not a revocation model; use one of: {', '.join(KINDS)}")


class RevocationModel:
    """Fitted lifetime models for GPU types (and zones) of one trace, plus the CPU model."""

    def __init__(
        self,
        trace: Trace,
        summaries: dict[str, RevocationSummary],
        calendar: CalendarFactor | None = None,
        cap_s: float = PREEMPTIBLE_CAP_S,
    ) -> None:
        self.trace = trace
        self.cap_s = cap_s
        self.calendar = calendar or CalendarFactor()
        self.summaries = summaries
        self._gpu: dict[str, _GpuFit] = {}
        for key in [*trace.gpus(), POOLED]:
            gkey = None if key == POOLED else key
            times, events = trace.select(gkey)
            zones = {} if key == POOLED else {z: trace.select(key, z) for z in trace.zones(key)}
            self._gpu[key] = self._fit_group(key, times, events, zones)
        self._cpu = self._cpu_models(summaries.get(CPU))
        self._fits: list[FitSummary] | None = None  # every kind of every group: simulate --fits alone

    # ---- fitting

    def _fit_group(
        self, key: str, times: FloatArray, events: BoolArray, zones: dict[str, tuple[FloatArray, BoolArray]]
    ) -> _GpuFit:
        return _GpuFit(key, times, events, zones, self.cap_s)

    @staticmethod
    def _cpu_models(summary: RevocationSummary | None) -> dict[str, LifetimeDist]:
        """Weibull through two published points: P(T < 1 h) and P(T < 24 h)."""
        first_hour = summary.revoked_first_hour if summary else 0.04
        before_cap = summary.revoked_before_24h if summary else 0.175
        h1 = -math.log1p(-first_hour)
        h24 = -math.log1p(-before_cap)
        shape = math.log(h24 / h1) / math.log(24.0)
        scale = HOUR / h1 ** (1.0 / shape)
        weib = Weibull(shape, scale)
        expo = _Exponential(h24 / (24.0 * HOUR))
        return {"empirical": weib, "exponential": expo, "weibull": weib, "bathtub": weib}

    def _summaries(self) -> list[FitSummary]:
        out: list[FitSummary] = []
        for key, fit in self._gpu.items():
            for kind in KINDS:
                out.append(self._summary(key, None, kind, fit.times, fit.events, fit.dist(kind), 1.0))
            for zone, (zt, ze) in fit.zones.items():
                for kind in KINDS:
                    adj = fit.zone_adjust(kind)[zone]
                    out.append(self._summary(key, zone, kind, zt, ze, fit.dist(kind), adj.multiplier, adj))
        cpu_summary = self.summaries.get(CPU)
        for kind in ("exponential", "weibull"):
            dist = self._cpu[kind]
            out.append(
                FitSummary(
                    gpu=CPU,
                    zone=None,
                    kind=kind,
                    params=dist.params(),
                    n=0,
                    events=0,
                    loglik=None,
                    aic=None,
                    ks=None,
                    revoked_observed=cpu_summary.revoked_before_24h if cpu_summary else None,
                    revoked_model=float(dist.cdf(REVOKED_CUTOFF_S)),
                    first_hour_observed=cpu_summary.revoked_first_hour if cpu_summary else None,
                    first_hour_model=float(dist.cdf(HOUR)),
                    note="no trace rows: through revocation_summary.csv (cpu); used for all model kinds"
                    if kind == "weibull"
                    else "no trace rows: matches the 24 h fraction only",
                )
            )
        return out

    def _summary(
        self,
        key: str,
        zone: str | None,
        kind: str,
        times: FloatArray,
        events: BoolArray,
        dist: LifetimeDist,
        mult: float,
        adj: _ZoneAdjust | None = None,
    ) -> FitSummary:
        def cdf(t: float) -> float:
            return float(-np.expm1(-mult * dist.cum_hazard(np.array([t]))[0]))

        loglik: float | None = None
        aic: float | None = None
        if kind != "empirical":
            h = mult * dist.cum_hazard(times)
            ll = -float(np.sum(h))
            if events.any():
                ll += float(np.sum(dist.log_hazard(times[events]))) + float(events.sum()) * math.log(mult)
            loglik = ll
            aic = 2.0 * (dist.n_params + (1 if adj else 0)) - 2.0 * ll
        params = dict(dist.params())
        note = ""
        if adj is not None:
            params = {"hazard_multiplier": mult}
            note = (
                f"pooled {key} shape x zone multiplier ({adj.events} revoked vs {adj.expected:.1f} expected)"
            )
        return FitSummary(
            gpu=key,
            zone=zone,
            kind=kind,
            params=params,
            n=len(times),
            events=int(events.sum()),
            loglik=loglik,
            aic=aic,
            ks=ks_distance(dist, times, events, mult),
            revoked_observed=float(np.mean(events & (times < REVOKED_CUTOFF_S))),
            revoked_model=cdf(REVOKED_CUTOFF_S),
            first_hour_observed=float(np.mean(events & (times < HOUR))),
            first_hour_model=cdf(HOUR),
            note=note,
        )

    def with_calendar(self, calendar: CalendarFactor) -> RevocationModel:
        """The same fits with another weekday/weekend factor (no refitting)."""
        other = copy.copy(self)
        other.calendar = calendar
        return other

    # ---- lookups

    def gpus(self) -> list[str]:
        return [k for k in self._gpu if k != POOLED]

    def distribution(
        self, gpu: str | None, zone: str | None, kind: str = DEFAULT_KIND
    ) -> tuple[LifetimeDist, float]:
        """(distribution, hazard multiplier) for an instance; gpu None = a CPU instance."""
        _check_kind(kind)
        if gpu is None:
            return self._cpu[kind], 1.0
        fit = self._gpu.get(gpu.lower()) or self._gpu[POOLED]
        adj = fit.zone_adjust(kind).get(zone) if zone else None
        return fit.dist(kind), (adj.multiplier if adj else 1.0)

    def coverage(self, gpu: str | None, kind: str = DEFAULT_KIND) -> str:
        """Which revocation model an instance of ``gpu`` gets, in words (simulate prints it)."""
        if gpu is None:
            return f"cpu: Weibull through revocation_summary.csv ({kind} kinds use it too)"
        if gpu.lower() in self._gpu and gpu.lower() != POOLED:
            return f"{gpu}: {kind} fitted to its own rows of {self.trace.path.name}"
        traced = "/".join(g.upper() for g in self.gpus())
        return (f"{gpu}: not in {self.trace.path.name}; the {kind} model pooled over all its GPU types "
                f"({traced}), zone multipliers where the zone is in the trace")

    def fits(self) -> list[FitSummary]:
        """Every fitted model: per GPU type (and ``all``) pooled, per zone, and the CPU model."""
        if self._fits is None:
            self._fits = self._summaries()
        return list(self._fits)

    def prob_revoked_within(
        self, gpu: str | None, zone: str | None, t_s: float, *, kind: str = DEFAULT_KIND
    ) -> float:
        dist, mult = self.distribution(gpu, zone, kind)
        return float(-np.expm1(-mult * dist.cum_hazard(np.array([t_s]))[0]))

    # ---- sampling

    def sample_lifetimes(
        self,
        gpu: str | None,
        zone: str | None,
        n: int,
        rng: np.random.Generator,
        *,
        preemptible: bool = False,
        kind: str = DEFAULT_KIND,
        start: datetime | None = None,
        hazard_multiplier: float = 1.0,
    ) -> FloatArray:
        """``n`` lifetimes in seconds from creation to revocation (``inf`` = never revoked).

        ``gpu`` None is a CPU instance; an unknown GPU uses the pooled fit, an unknown zone the GPU's
        pooled fit. ``preemptible`` stops every VM at 24 h (counted as a revocation). ``start`` (the
        creation time) turns on the weekday/weekend calendar factor; without it every day is a weekday.
        """
        return self.lifetimes_from_exponentials(
            rng.standard_exponential(n),
            gpu,
            zone,
            preemptible=preemptible,
            kind=kind,
            start=start,
            hazard_multiplier=hazard_multiplier,
        )

    def lifetimes_from_exponentials(
        self,
        e: FloatArray,
        gpu: str | None,
        zone: str | None,
        *,
        preemptible: bool = False,
        kind: str = DEFAULT_KIND,
        start: datetime | None = None,
        hazard_multiplier: float = 1.0,
    ) -> FloatArray:
        """Lifetimes for given unit-exponential draws (inverse cumulative hazard; deterministic)."""
        dist, mult = self.distribution(gpu, zone, kind)
        mult *= hazard_multiplier
        if start is None:
            out = dist.inv_cum_hazard(e / mult) if mult > 0 else np.full(e.shape, np.inf)
        else:
            out = _calendar_inverse(dist, e, mult, start, self.calendar)
        if preemptible:
            out = np.minimum(out, self.cap_s)
        return np.asarray(out, dtype=np.float64)


def _calendar_inverse(
    dist: LifetimeDist, e: FloatArray, mult: float, start: datetime, calendar: CalendarFactor
) -> FloatArray:
    """Solve integral_0^t mult * c(start + s) h(s) ds = e, with c piecewise constant per calendar day."""
    out = np.full(e.shape, np.inf)
    remaining = np.array(e, dtype=np.float64)
    pending = np.ones(e.shape, dtype=np.bool_)
    midnight = datetime(start.year, start.month, start.day, tzinfo=start.tzinfo) + timedelta(days=1)
    seg_start = 0.0
    seg_end = (midnight - start).total_seconds()
    for _ in range(CALENDAR_HORIZON_DAYS):
        w = mult * calendar.at(start + timedelta(seconds=seg_start))
        h_a = float(dist.cum_hazard(np.array([seg_start]))[0])
        h_b = float(dist.cum_hazard(np.array([seg_end]))[0])
        consumed = w * (h_b - h_a)
        done = pending & (remaining <= consumed)
        if w > 0 and done.any():
            out[done] = np.minimum(dist.inv_cum_hazard(h_a + remaining[done] / w), seg_end)
        pending &= ~done
        remaining = np.where(pending, remaining - consumed, remaining)
        if not pending.any():
            break
        seg_start = seg_end
        seg_end = seg_start + 86400.0
    if pending.any():
        # Past the horizon the calendar averages out: a week's mean factor.
        w = mult * (5.0 * calendar.weekday + 2.0 * calendar.weekend) / 7.0
        if w > 0:
            h_a = float(dist.cum_hazard(np.array([seg_start]))[0])
            out[pending] = dist.inv_cum_hazard(h_a + remaining[pending] / w)
    return out


@functools.lru_cache(maxsize=8)
def _load_cached(path: str | None, mtime: float) -> RevocationModel:
    trace = load_trace(Path(path) if path else None)
    return RevocationModel(trace, load_revocation_summary())


def load_revocation_model(trace: Path | None = None) -> RevocationModel:
    """The revocation models fitted to ``trace`` (default: the bundled 2019 GCE trace); cached per file."""
    if trace is None:
        return _load_cached(None, 0.0)
    p = Path(trace).resolve()
    try:
        mtime = p.stat().st_mtime
    except OSError:
        mtime = 0.0  # load_trace reports the problem
    return _load_cached(str(p), mtime)
