"""bench/h200_heldout.py and bench/hopper_transfer.py read the H200's held-out rows and print their errors."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_h200_rows_are_read_and_scored(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("h200_heldout").main() == 0
    out = capsys.readouterr().out
    assert "resnet50" in out and "none       mean |error|" in out and "held out: all 9 H200 rows" in out


def test_the_h100_fit_rows_cover_both_precisions() -> None:
    rows = _load("hopper_transfer").fit_rows()
    assert {p for _, _, p, _ in rows} == {"fp32", "bf16"}
    assert {d for d, _, _, _ in rows} == {20, 32, 44, 56, 110} and all(s > 0 for *_, s in rows)
