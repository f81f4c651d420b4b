"""Shared Rich rendering helpers."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def money(usd: float | None) -> str:
    return "" if usd is None else f"${usd:,.4f}" if usd < 1 else f"${usd:,.2f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.2f}h"


def when(ts: float | None) -> str:
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"
