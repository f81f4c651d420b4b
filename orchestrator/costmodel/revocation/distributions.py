"""Lifetime distributions described by their cumulative hazard, and censored maximum-likelihood fits.

Every distribution exposes ``cum_hazard`` H(t) and its inverse, so sampling is ``H^-1(E)`` with
E ~ Exp(1). Scaling the hazard by a factor m (a zone effect, a weekend) is then ``H^-1(E / m)``,
and a calendar-dependent factor is a time change (see ``revocation.py``).
Times are in seconds.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

import numpy as np

from orchestrator.costmodel.revocation.traces import BoolArray, FloatArray

HOUR = 3600.0
_LOG_T_LO = math.log(1e-3)
_LOG_T_HI = math.log(1e12)
_BISECT_STEPS = 52
# Bathtub bounds (fit in hours): early Weibull shape <= 1, late component near the 24 h cap.
_K1_BOUNDS = (0.05, 1.0)
_S1_BOUNDS_H = (0.01, 1e7)
_K2_BOUNDS = (1.0, 100.0)


def _arr(t: FloatArray | float) -> FloatArray:
    return np.asarray(t, dtype=np.float64)


class LifetimeDist(abc.ABC):
    kind: str = ""
    n_params: int = 0

    @abc.abstractmethod
    def cum_hazard(self, t: FloatArray) -> FloatArray: ...

    @abc.abstractmethod
    def inv_cum_hazard(self, h: FloatArray) -> FloatArray: ...

    @abc.abstractmethod
    def params(self) -> dict[str, float]: ...

    def log_hazard(self, t: FloatArray) -> FloatArray:
        raise NotImplementedError(f"{self.kind} has no density")

    def cdf(self, t: FloatArray | float) -> FloatArray:
        return -np.expm1(-self.cum_hazard(_arr(t)))

    def survival(self, t: FloatArray | float) -> FloatArray:
        return np.exp(-self.cum_hazard(_arr(t)))

    def loglik(self, times: FloatArray, events: BoolArray) -> float:
        """Censored log-likelihood: sum over revocations of log h(t) minus sum over all of H(t)."""
        ll = -float(np.sum(self.cum_hazard(times)))
        if events.any():
            ll += float(np.sum(self.log_hazard(times[events])))
        return ll


@dataclass(frozen=True)
class Exponential(LifetimeDist):
    rate: float  # per second

    kind = "exponential"
    n_params = 1

    def cum_hazard(self, t: FloatArray) -> FloatArray:
        return self.rate * _arr(t)

    def inv_cum_hazard(self, h: FloatArray) -> FloatArray:
        h = _arr(h)
        if self.rate <= 0:
            return np.where(h > 0, np.inf, 0.0)
        return h / self.rate

    def log_hazard(self, t: FloatArray) -> FloatArray:
        return np.full(_arr(t).shape, math.log(self.rate) if self.rate > 0 else -np.inf)

    def params(self) -> dict[str, float]:
        return {
            "rate_per_h": self.rate * HOUR,
            "mean_h": (1 / self.rate / HOUR) if self.rate > 0 else math.inf,
        }


@dataclass(frozen=True)
class Weibull(LifetimeDist):
    shape: float
    scale: float  # seconds

    kind = "weibull"
    n_params = 2

    def cum_hazard(self, t: FloatArray) -> FloatArray:
        return np.power(_arr(t) / self.scale, self.shape)

    def inv_cum_hazard(self, h: FloatArray) -> FloatArray:
        return self.scale * np.power(_arr(h), 1.0 / self.shape)

    def log_hazard(self, t: FloatArray) -> FloatArray:
        t = _arr(t)
        return math.log(self.shape / self.scale) + (self.shape - 1.0) * np.log(t / self.scale)

    def params(self) -> dict[str, float]:
        return {"shape": self.shape, "scale_h": self.scale / HOUR}


@dataclass(frozen=True)
class Bathtub(LifetimeDist):
    """Additive hazards: an early-failure Weibull (shape <= 1) plus a late Weibull that only acts before
    ``cap`` (the 24 h limit the late surge is tied to): H(t) = (t/s1)^k1 + (min(t, cap)/s2)^k2.

    Past the cap (spot VMs, which have no 24 h limit) only the early component keeps going.
    """

    shape_early: float
    scale_early: float
    shape_late: float
    scale_late: float
    cap: float

    kind = "bathtub"
    n_params = 4

    def cum_hazard(self, t: FloatArray) -> FloatArray:
        t = _arr(t)
        early = np.power(t / self.scale_early, self.shape_early)
        late = np.power(np.minimum(t, self.cap) / self.scale_late, self.shape_late)
        return early + late

    def log_hazard(self, t: FloatArray) -> FloatArray:
        t = _arr(t)
        h1 = self.shape_early / self.scale_early * np.power(t / self.scale_early, self.shape_early - 1.0)
        h2 = self.shape_late / self.scale_late * np.power(t / self.scale_late, self.shape_late - 1.0)
        return np.log(h1 + np.where(t < self.cap, h2, 0.0))

    def inv_cum_hazard(self, h: FloatArray) -> FloatArray:
        h = _arr(h)
        lo = np.full(h.shape, _LOG_T_LO)
        hi = np.full(h.shape, _LOG_T_HI)
        for _ in range(_BISECT_STEPS):
            mid = 0.5 * (lo + hi)
            below = self.cum_hazard(np.exp(mid)) < h
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        out = np.exp(hi)
        return np.where(
            h >= self.cum_hazard(np.array(math.exp(_LOG_T_HI))), np.inf, np.where(h <= 0, 0.0, out)
        )

    def params(self) -> dict[str, float]:
        return {
            "shape_early": self.shape_early,
            "scale_early_h": self.scale_early / HOUR,
            "shape_late": self.shape_late,
            "scale_late_h": self.scale_late / HOUR,
        }


@dataclass(frozen=True)
class Empirical(LifetimeDist):
    """Kaplan-Meier survival as a step cumulative hazard H = -log S; past the last observation ``tau``
    the hazard continues at the average rate seen in the trace, H(tau) / tau."""

    event_times: tuple[float, ...]
    cum_hazards: tuple[float, ...]  # H just after each event time (non-decreasing)
    tau: float

    kind = "empirical"
    n_params = 0

    @property
    def tail_rate(self) -> float:
        last = self.cum_hazards[-1] if self.cum_hazards else 0.0
        return last / self.tau if math.isfinite(last) and self.tau > 0 else 0.0

    def cum_hazard(self, t: FloatArray) -> FloatArray:
        t = _arr(t)
        if not self.event_times:
            return np.zeros(t.shape)
        u = np.asarray(self.event_times)
        hs = np.concatenate(([0.0], np.asarray(self.cum_hazards)))
        idx = np.searchsorted(u, t, side="right")
        base = hs[idx]
        last = self.cum_hazards[-1]
        if not math.isfinite(last):
            return base
        return np.where(t > self.tau, last + self.tail_rate * (t - self.tau), base)

    def inv_cum_hazard(self, h: FloatArray) -> FloatArray:
        h = _arr(h)
        if not self.event_times:
            return np.where(h > 0, np.inf, 0.0)
        u = np.asarray(self.event_times)
        hs = np.asarray(self.cum_hazards)
        idx = np.searchsorted(hs, h, side="left")
        inside = u[np.minimum(idx, len(u) - 1)]
        rate = self.tail_rate
        last = hs[-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            tail = self.tau + (h - last) / rate if rate > 0 else np.full(h.shape, np.inf)
        return np.where(h <= 0, 0.0, np.where(idx < len(u), inside, tail))

    def params(self) -> dict[str, float]:
        return {"steps": float(len(self.event_times)), "tail_rate_per_h": self.tail_rate * HOUR}


# ---------------------------------------------------------------- Kaplan-Meier and fits


def kaplan_meier(times: FloatArray, events: BoolArray) -> tuple[FloatArray, FloatArray]:
    """(distinct revocation times, KM survival just after each)."""
    event_times = np.unique(times[events])
    surv = np.empty(event_times.shape)
    s = 1.0
    for j, u in enumerate(event_times):
        at_risk = int(np.sum(times >= u))
        d = int(np.sum((times == u) & events))
        s *= 1.0 - d / at_risk
        surv[j] = s
    return event_times, surv


def fit_empirical(times: FloatArray, events: BoolArray) -> Empirical:
    u, surv = kaplan_meier(times, events)
    with np.errstate(divide="ignore"):
        hs = -np.log(surv)
    return Empirical(tuple(float(x) for x in u), tuple(float(x) for x in hs), float(times.max()))


def fit_exponential(times: FloatArray, events: BoolArray) -> Exponential:
    """Censored MLE: revocations / total exposure (with no revocation at all, half a pseudo-event)."""
    d = float(events.sum())
    return Exponential(max(d, 0.5) / float(times.sum()))


def fit_weibull(times: FloatArray, events: BoolArray) -> Weibull:
    """Censored MLE, scale profiled out: for shape k, scale^k = sum(t^k) / d."""
    d = float(events.sum())
    if d == 0:
        return Weibull(1.0, float(times.sum()) / 0.5)
    th = times / HOUR
    sum_log_e = float(np.sum(np.log(th[events])))

    def neg_profile(log_k: float) -> float:
        k = math.exp(log_k)
        return -(d * math.log(k) - d * math.log(float(np.sum(th**k)) / d) + (k - 1.0) * sum_log_e - d)

    from scipy import optimize  # lazy: a plan whose fits are cached never imports SciPy (0.4-0.7 s)

    res = optimize.minimize_scalar(neg_profile, bounds=(math.log(0.05), math.log(20.0)), method="bounded")
    k = math.exp(float(res.x))
    scale_h = (float(np.sum(th**k)) / d) ** (1.0 / k)
    return Weibull(k, scale_h * HOUR)


def fit_bathtub(times: FloatArray, events: BoolArray, cap: float) -> Bathtub:
    """Censored MLE of the additive early + late hazard, from several starting points (L-BFGS-B)."""
    th = times / HOUR
    cap_h = cap / HOUR
    ev = events
    d = float(ev.sum())
    if d == 0:
        w = fit_weibull(times, events)
        return Bathtub(1.0, w.scale, 100.0, 3.0 * cap, cap)
    s2_bounds = (0.5 * cap_h, 3.0 * cap_h)
    bounds = [
        (math.log(_K1_BOUNDS[0]), math.log(_K1_BOUNDS[1])),
        (math.log(_S1_BOUNDS_H[0]), math.log(_S1_BOUNDS_H[1])),
        (math.log(_K2_BOUNDS[0]), math.log(_K2_BOUNDS[1])),
        (math.log(s2_bounds[0]), math.log(s2_bounds[1])),
    ]
    t_e = th[ev]
    before_cap = t_e < cap_h
    th_cap = np.minimum(th, cap_h)

    def nll(x: FloatArray) -> float:
        k1, s1, k2, s2 = np.exp(x)
        h1 = k1 / s1 * (t_e / s1) ** (k1 - 1.0)
        h2 = np.where(before_cap, k2 / s2 * (t_e / s2) ** (k2 - 1.0), 0.0)
        ll = (
            float(np.sum(np.log(h1 + h2)))
            - float(np.sum((th / s1) ** k1))
            - float(np.sum((th_cap / s2) ** k2))
        )
        return -ll if math.isfinite(ll) else 1e300

    from scipy import optimize  # lazy: see fit_weibull

    w = fit_weibull(times, events)
    k1_0 = min(max(w.shape, _K1_BOUNDS[0]), 0.95)
    s1_0 = min(max(w.scale / HOUR, _S1_BOUNDS_H[0]), _S1_BOUNDS_H[1])
    best: tuple[float, FloatArray] | None = None
    for k2_0, s2_0 in ((80.0, 2.5 * cap_h), (30.0, 1.05 * cap_h), (8.0, 1.2 * cap_h), (3.0, 2.0 * cap_h)):
        x0 = np.log(np.array([k1_0, s1_0, k2_0, s2_0]))
        res = optimize.minimize(nll, x0, method="L-BFGS-B", bounds=bounds)
        val = float(res.fun)
        if best is None or val < best[0]:
            best = (val, np.asarray(res.x, dtype=np.float64))
    assert best is not None
    k1, s1, k2, s2 = (float(v) for v in np.exp(best[1]))
    return Bathtub(k1, s1 * HOUR, k2, s2 * HOUR, cap)


def ks_distance(dist: LifetimeDist, times: FloatArray, events: BoolArray, multiplier: float = 1.0) -> float:
    """Largest gap between the model CDF and the Kaplan-Meier CDF over the observed range."""
    u, surv = kaplan_meier(times, events)
    if len(u) == 0:
        return float(np.max(-np.expm1(-multiplier * dist.cum_hazard(np.array([times.max()])))))
    f_model = -np.expm1(-multiplier * dist.cum_hazard(u))
    f_after = 1.0 - surv
    f_before = np.concatenate(([0.0], f_after[:-1]))
    f_end = -np.expm1(-multiplier * dist.cum_hazard(np.array([times.max()])))[0]
    gaps = np.concatenate((np.abs(f_model - f_after), np.abs(f_model - f_before), [abs(f_end - f_after[-1])]))
    return float(gaps.max())
