"""Revocation models: censored MLE, fits on the real 2019 trace, sampling API, calendar, user traces."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from orchestrator.costmodel.revocation.distributions import (
    Bathtub,
    Exponential,
    Weibull,
    fit_bathtub,
    fit_empirical,
    fit_exponential,
    fit_weibull,
    kaplan_meier,
)
from orchestrator.costmodel.revocation.model import (
    KINDS,
    PREEMPTIBLE_CAP_S,
    CalendarFactor,
    RevocationModel,
    load_revocation_model,
)
from orchestrator.costmodel.revocation.traces import TraceError, load_revocation_summary, load_trace

HOUR = 3600.0
CUTOFF = 23.9 * HOUR
# Revoked before the 24 h limit in the bundled trace (data/gce-preemptible-lifetimes-2019.csv).
OBSERVED = {"k80": 20 / 64, "p100": 8 / 40, "v100": 5 / 48}


@pytest.fixture(scope="module")
def model() -> RevocationModel:
    return load_revocation_model()


def _censor(t: np.ndarray, limit: float) -> tuple[np.ndarray, np.ndarray]:
    return np.minimum(t, limit), t < limit


def test_weibull_censored_mle_recovers_parameters() -> None:
    rng = np.random.default_rng(1)
    true = Weibull(0.7, 50 * HOUR)
    t = true.inv_cum_hazard(rng.standard_exponential(4000))
    times, events = _censor(t, 24 * HOUR)  # ~1/3 revoked, the rest censored as in the trace
    fit = fit_weibull(times, events)
    assert fit.shape == pytest.approx(0.7, rel=0.08)
    assert fit.scale == pytest.approx(50 * HOUR, rel=0.15)


def test_exponential_censored_mle_recovers_rate() -> None:
    rng = np.random.default_rng(2)
    rate = 1 / (30 * HOUR)
    times, events = _censor(rng.exponential(1 / rate, 4000), 24 * HOUR)
    assert fit_exponential(times, events).rate == pytest.approx(rate, rel=0.08)


def test_bathtub_fit_finds_early_and_late_components() -> None:
    rng = np.random.default_rng(3)
    true = Bathtub(0.5, 300 * HOUR, 40.0, 25 * HOUR, PREEMPTIBLE_CAP_S)
    times, events = _censor(true.inv_cum_hazard(rng.standard_exponential(3000)), 24.2 * HOUR)
    fit = fit_bathtub(times, events, PREEMPTIBLE_CAP_S)
    assert fit.shape_early < 1.0
    assert fit.loglik(times, events) >= fit_weibull(times, events).loglik(times, events)
    for t in (1 * HOUR, 12 * HOUR, 23.9 * HOUR):
        assert float(fit.cdf(t)) == pytest.approx(float(true.cdf(t)), abs=0.03)


def test_kaplan_meier_without_censoring_is_the_ecdf() -> None:
    times = np.array([1.0, 2.0, 2.0, 3.0, 5.0])
    u, surv = kaplan_meier(times, np.ones(5, dtype=bool))
    assert list(u) == [1.0, 2.0, 3.0, 5.0]
    assert list(surv) == pytest.approx([0.8, 0.4, 0.2, 0.0])
    emp = fit_empirical(times, np.ones(5, dtype=bool))
    assert list(emp.inv_cum_hazard(-np.log(np.array([0.9, 0.5, 0.3])))) == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gpu", sorted(OBSERVED))
def test_fits_reproduce_the_traces_revoked_fraction(model: RevocationModel, gpu: str, kind: str) -> None:
    assert model.prob_revoked_within(gpu, None, CUTOFF, kind=kind) == pytest.approx(OBSERVED[gpu], abs=0.02)


def test_sampled_preemptible_lifetimes_match_the_trace(model: RevocationModel) -> None:
    rng = np.random.default_rng(4)
    for gpu, frac in OBSERVED.items():
        x = model.sample_lifetimes(gpu, None, 20000, rng, preemptible=True)
        assert x.shape == (20000,) and x.dtype == np.float64
        assert x.max() <= PREEMPTIBLE_CAP_S
        assert float(np.mean(x < CUTOFF)) == pytest.approx(frac, abs=0.02)


def test_fit_summaries_cover_every_gpu_and_kind(model: RevocationModel) -> None:
    fits = model.fits()
    pooled = {(f.gpu, f.kind) for f in fits if f.zone is None}
    assert {(g, k) for g in OBSERVED for k in KINDS} <= pooled
    for f in fits:
        if f.ks is not None:
            assert 0.0 <= f.ks <= 1.0
        if f.aic is not None:
            assert math.isfinite(f.aic)
    k80 = {f.kind: f for f in fits if f.gpu == "k80" and f.zone is None}
    assert k80["weibull"].params["shape"] < 1.0  # early failures: decreasing hazard
    assert k80["bathtub"].loglik is not None and k80["weibull"].loglik is not None
    assert k80["bathtub"].loglik >= k80["weibull"].loglik - 1e-6
    assert (k80["empirical"].n, k80["empirical"].events) == (64, 20)


def test_cpu_model_matches_the_published_summary(model: RevocationModel) -> None:
    cpu = load_revocation_summary()["cpu"]
    assert model.prob_revoked_within(None, None, 24 * HOUR, kind="weibull") == pytest.approx(
        cpu.revoked_before_24h
    )
    assert model.prob_revoked_within(None, None, HOUR, kind="bathtub") == pytest.approx(
        cpu.revoked_first_hour
    )
    x = model.sample_lifetimes(None, None, 20000, np.random.default_rng(5), preemptible=True)
    assert float(np.mean(x < 24 * HOUR)) == pytest.approx(0.175, abs=0.015)


def test_zone_and_gpu_fallbacks(model: RevocationModel) -> None:
    def draw(gpu: str | None, zone: str | None) -> np.ndarray:
        return model.sample_lifetimes(gpu, zone, 50, np.random.default_rng(6))

    assert np.array_equal(draw("k80", "mars-central1-a"), draw("k80", None))  # unknown zone -> pooled GPU fit
    assert np.array_equal(draw("K80", None), draw("k80", None))
    assert np.array_equal(draw("t4", None), draw("all", None))  # GPU absent from the trace -> all GPUs
    busy = model.prob_revoked_within("k80", "us-central1-c", 12 * HOUR)
    quiet = model.prob_revoked_within("k80", "us-east1-c", 12 * HOUR)
    assert busy > model.prob_revoked_within("k80", None, 12 * HOUR) > quiet  # 14/16 vs 0/16 revoked


def test_spot_lifetimes_extend_past_24h(model: RevocationModel) -> None:
    x = model.sample_lifetimes("v100", None, 5000, np.random.default_rng(7), preemptible=False)
    assert float(np.mean(x > PREEMPTIBLE_CAP_S)) > 0.5
    assert np.all(x > 0)


def test_sampling_is_deterministic_and_checks_kind(model: RevocationModel) -> None:
    a = model.sample_lifetimes("p100", "us-west1-b", 10, np.random.default_rng(8), kind="weibull")
    b = model.sample_lifetimes("p100", "us-west1-b", 10, np.random.default_rng(8), kind="weibull")
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="not a revocation model"):
        model.sample_lifetimes("p100", None, 1, np.random.default_rng(0), kind="lognormal")


def test_weekend_factor(model: RevocationModel) -> None:
    e = np.random.default_rng(9).standard_exponential(4000)
    wednesday = datetime(2019, 2, 20, 9, 30)
    plain = model.lifetimes_from_exponentials(e, "k80", None)
    cal = model.with_calendar(CalendarFactor(weekend=1.0))
    assert np.allclose(cal.lifetimes_from_exponentials(e, "k80", None, start=wednesday), plain, rtol=1e-9)
    no_weekend = model.with_calendar(CalendarFactor(weekend=0.0))
    saturday = datetime(2019, 2, 23, 0, 0)
    x = no_weekend.lifetimes_from_exponentials(e, "k80", None, start=saturday)
    assert np.all(x >= 48 * HOUR)  # nothing is revoked before Monday 00:00
    assert model.calendar.weekday == 1.0 and 0.0 <= model.calendar.weekend < 1.0


def test_user_trace(tmp_path: Path) -> None:
    rng = np.random.default_rng(10)
    lifetimes = rng.exponential(20 * HOUR, 60)
    lines = ["gpu,zone,vm,start,end,lifetime_s,revoked"]
    for i, t in enumerate(lifetimes):
        lines.append(f"T4,us-east1-c,vm-{i},,,{min(t, 24 * HOUR):.0f},{int(t < 24 * HOUR)}")
    path = tmp_path / "t4.csv"
    path.write_text("\n".join(lines) + "\n")
    m = load_revocation_model(path)
    assert m.gpus() == ["t4"]
    assert isinstance(m.distribution("t4", "us-east1-c", "exponential")[0], Exponential)
    frac = float(np.mean(lifetimes < 24 * HOUR))
    assert m.prob_revoked_within("t4", None, 24 * HOUR, kind="exponential") == pytest.approx(frac, abs=0.1)

    bad = tmp_path / "bad.csv"
    bad.write_text("gpu,zone,lifetime\nk80,a,1\n")
    with pytest.raises(TraceError, match="missing column"):
        load_trace(bad)
