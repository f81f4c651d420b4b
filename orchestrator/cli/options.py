"""Checks on option values that typer's types cannot say: a finite positive number of seconds, a plot file whose
folder exists. Each raises typer.BadParameter, which the CLI prints as one line and exit 2, before anything is
created."""

from __future__ import annotations

import math
from pathlib import Path

import typer

PORT_MAX = 65535


def positive_seconds(value: float | None) -> float | None:
    """A finite number of seconds above zero (nan, inf and negatives would make a sleep or a timer fail later)."""
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise typer.BadParameter(f"{value} is not a number of seconds above 0 (e.g. 1 or 0.5)")
    return value


def finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def writable_file(path: Path | None) -> Path | None:
    """A file to write whose folder exists (a typo in the folder is refused, not created)."""
    if path is not None:
        folder = path.parent if str(path.parent) else Path(".")
        if not folder.is_dir():
            raise typer.BadParameter(f"the folder {str(folder)!r} does not exist; create it or give another path")
        if path.is_dir():
            raise typer.BadParameter(f"{str(path)!r} is a folder; give a file name")
    return path


def runtime_name(value: str | None) -> str | None:
    from orchestrator.costmodel.compute import RUNTIMES, TORCHJOB_RUNTIME  # lazy: the cost model

    if value is not None and value not in (*RUNTIMES, TORCHJOB_RUNTIME):
        raise typer.BadParameter(f"'{value}' is not one of {', '.join(RUNTIMES)}")
    return value


def precision_name(value: str) -> str:
    from orchestrator.costmodel.crossgpu import PrecisionError, check_precision  # lazy: the cost model

    try:
        check_precision(value)
    except PrecisionError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


PLOT_FORMATS = {".png": "png", ".svg": "svg"}


def plot_file(path: Path | None) -> Path | None:
    """A .png or .svg file to draw to, in a folder that exists."""
    if path is not None and path.suffix.lower() not in PLOT_FORMATS:
        raise typer.BadParameter(f"'{path}' must end in .png or .svg")
    return writable_file(path)
