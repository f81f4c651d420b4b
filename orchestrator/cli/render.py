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


WIDE_REPORT_COLUMNS = 150  # below this the 14-column report folds every cell; use the narrow layout


def print_report(rows: Sequence[dict[str, Any]], title: str) -> None:
    """``report``'s table: one wide table, or (narrow terminals, e.g. 80 columns) two short ones."""
    if console.width >= WIDE_REPORT_COLUMNS:
        console.print(table(title, ["job", "status", "cluster", "book", "steps", "accuracy", "wall time", "cost",
                                    "workers", "ps", "chief", "revoked", "replaced", "restarts"],
                            [[r["job_id"], r["status"], r["cluster_shape"], r["price_book"],
                              f"{r['final_step'] or 0}/{r['train_steps']}", pct(r["accuracy"]),
                              duration(r["wall_time_s"]), money(r["cost_usd"]), money(r["worker_cost_usd"]),
                              money(r["ps_cost_usd"]), money(r["chief_cost_usd"]), r["revocations"],
                              r["replacements"], r["restarts"]] for r in rows]))
        return
    main = table(title, ["job", "status", "steps", "acc.", "wall", "cost", "rev/rep/rst"],
                 [[r["job_id"], r["status"], f"{r['final_step'] or 0}/{r['train_steps']}", pct(r["accuracy"]),
                   duration(r["wall_time_s"]), money(r["cost_usd"]),
                   f"{r['revocations']}/{r['replacements']}/{r['restarts']}"] for r in rows])
    for column in main.columns[:3]:  # a job id is copied from here; keep it, the status and steps on one line
        column.no_wrap = True
    console.print(main)
    console.print(table("cost by role", ["job", "workers", "ps", "chief", "book"],
                        [[r["job_id"], money(r["worker_cost_usd"]), money(r["ps_cost_usd"]),
                          money(r["chief_cost_usd"]), r["price_book"]] for r in rows]))
    console.print(table("clusters", ["job", "cluster"], [[r["job_id"], r["cluster_shape"]] for r in rows]))
    console.print("rev/rep/rst: revocations / replacements / whole-cluster restarts", style="dim", highlight=False)
