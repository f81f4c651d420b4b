"""bench/h200_heldout.py and bench/hopper_transfer.py read the H200's held-out rows and print their errors."""

from __future__ import annotations

import pytest

from orchestrator_testing.bench_cli import load_bench as _load


def test_the_h200_rows_are_read_and_scored(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("h200_heldout").main() == 0
    out = capsys.readouterr().out
    assert "resnet50" in out and "none       mean |error|" in out and "held out: all 9 H200 rows" in out


def test_the_h100_fit_rows_cover_both_precisions() -> None:
    rows = _load("hopper_transfer").fit_rows()
    assert {p for _, _, p, _ in rows} == {"fp32", "bf16"}
    assert {d for d, _, _, _ in rows} == {20, 32, 44, 56, 110} and all(s > 0 for *_, s in rows)
