"""The bathtub fits kept between processes (costmodel/revocation/fit_cache.py) give the fit itself, and a changed
trace or an unwritable home never gives a stale or a missing one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.costmodel.revocation import fit_cache
from orchestrator.costmodel.revocation.distributions import fit_bathtub
from orchestrator.costmodel.revocation.traces import load_trace

CAP = 86400.0


def _rows() -> tuple[np.ndarray, np.ndarray]:
    return load_trace(None).select("k80")


def test_a_second_model_reads_the_first_ones_fit_and_it_is_the_fit_itself(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path))
    times, events = _rows()
    key = fit_cache.digest(times, events, CAP)
    assert fit_cache.cached(key) is None
    direct = fit_bathtub(times, events, CAP)
    fit_cache.keep(key, direct)
    assert fit_cache.cached(key) == direct  # floats round-trip exactly through the JSON file
    assert fit_cache.cache_path().is_file()


def test_changed_rows_have_another_key() -> None:
    times, events = _rows()
    changed = events.copy()
    changed[0] = not changed[0]
    assert fit_cache.digest(times, events, CAP) != fit_cache.digest(times, changed, CAP)
    assert fit_cache.digest(times, events, CAP) != fit_cache.digest(times + 1.0, events, CAP)
    assert fit_cache.digest(times, events, CAP) != fit_cache.digest(times, events, 2 * CAP)


def test_an_unwritable_or_broken_cache_costs_only_the_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.write_text("a file where the home's folder should be")
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(home))
    times, events = _rows()
    key = fit_cache.digest(times, events, CAP)
    fit_cache.keep(key, fit_bathtub(times, events, CAP))  # no error: nothing kept
    assert fit_cache.cached(key) is None
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / "h2"))
    fit_cache.cache_path().parent.mkdir(parents=True)
    fit_cache.cache_path().write_text("{not json")
    assert fit_cache.cached(key) is None
    fit_cache.keep(key, fit_bathtub(times, events, CAP))
    assert fit_cache.cached(key) is not None
