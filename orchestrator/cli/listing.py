"""Listings that read at any width, piped or not, and the same rows as JSON or CSV for scripts.

Every listing verb (catalog, status, plan, logs, db, model ...) prints through here. A table is plain text
sized to the console (COLUMNS, else the terminal, else 80 when piped): an id column is never cut or wrapped,
so it can be copied; other columns are cut with "…" from the widest down until the table fits. ``--format
json|csv`` prints the full, uncut values under stable keys instead.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import typer
from rich.cells import cell_len, set_cell_size
from rich.text import Text

from orchestrator.cli.render import console, err_console
from orchestrator.model.errors import UserError

FORMATS = ("table", "json", "csv")
GAP = 2  # spaces between columns
MIN_CUT = 5  # a cut column keeps at least this many cells (4 characters and "…")


@dataclass(frozen=True)
class Col:
    """One table column: its header, and whether it is an id (never cut) or a number (right-aligned, never cut)."""

    header: str
    whole: bool = False
    right: bool = False
    floor: int | None = None  # cut no narrower than this (default: MIN_CUT, or the header up to 8)
    words: bool = False  # cut only between words: a cell of names, where "g2-standard-4…" would read as another name


def format_option(what: str = "") -> Any:
    """The ``--format`` option every listing verb takes."""
    return typer.Option("table", "--format", help="table | json | csv" + (f" ({what})" if what else ""))


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise UserError(f"--format: '{fmt}' is not one of {', '.join(FORMATS)}")
    return fmt


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, ending in "…" when it had to be cut."""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, max(width - 1, 0)) + "…" if width > 0 else ""


def cut_words(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, cut after its last whole word (words end at a space, comma or
    bracket) and ending in "…"; a first word too long for ``width`` is cut like ``cut``."""
    if cell_len(text) <= width:
        return text
    head = set_cell_size(text, max(width - 1, 0))
    if text[len(head):len(head) + 1] in (" ", ",", ")"):  # head ends at a word's end
        return head.rstrip(" ,(") + "…"
    ends = [m.start() for m in re.finditer(r"[ ,(]", head)]
    return head[:ends[-1]].rstrip(" ,(") + "…" if ends and ends[-1] > 0 else cut(text, width)


def fit_widths(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """Each column's width: its widest cell, then the widest cuttable columns narrowed one cell at a time
    until the row fits ``width`` (ids and numbers keep theirs, whatever the width)."""
    widths = [max([cell_len(c.header)] + [cell_len(r[i]) for r in rows]) for i, c in enumerate(cols)]
    floors = [w if c.whole or c.right else min(w, _floor(c)) for c, w in zip(cols, widths, strict=True)]
    while _total(widths) > width:
        shrinkable = [i for i, w in enumerate(widths) if w > floors[i]]
        if not shrinkable:
            break
        widths[max(shrinkable, key=lambda i: widths[i])] -= 1
    return widths


def _floor(c: Col) -> int:
    return c.floor if c.floor is not None else max(MIN_CUT, min(cell_len(c.header), 8))


def _total(widths: Sequence[int]) -> int:
    shown = [w for w in widths if w > 0]
    return sum(shown) + GAP * max(len(shown) - 1, 0)


def _line(cells: Sequence[str], cols: Sequence[Col], widths: Sequence[int]) -> str:
    parts = []
    for text, col, w in zip(cells, cols, widths, strict=True):
        if w == 0:  # a column cut away entirely (floor 0): its data is in --format json/csv
            continue
        text = cut_words(text, w) if col.words else cut(text, w)
        pad = " " * (w - cell_len(text))
        parts.append(pad + text if col.right else text + pad)
    return (" " * GAP).join(parts).rstrip()


def print_table(title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[Any]],
                note: str | None = None, err: bool = False) -> None:
    """A fitted table: title (word-wrapped), header, rule, one line per row, an optional footnote (``err``: on
    stderr, where stdout is a command's JSON)."""
    out = err_console if err else console
    cells = [["" if v is None else str(v) for v in r] for r in rows]
    widths = fit_widths(cols, cells, out.width)
    if title:
        out.print(Text(title, style="bold"))
    header = _line([c.header for c in cols], cols, widths)
    out.print(Text(header, style="bold"), no_wrap=True, crop=False, soft_wrap=True)
    out.print("─" * min(_total(widths), max(cell_len(header), out.width)),
              style="dim", highlight=False, markup=False, soft_wrap=True)
    for r in cells:
        out.print(_line(r, cols, widths), highlight=False, markup=False, soft_wrap=True)
    if note:
        out.print(Text(note, style="dim"))


def print_json(data: Any) -> None:
    """JSON on stdout as is (never wrapped or highlighted by the console)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_csv(records: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None) -> None:
    """One CSV table (header row first); ``keys`` fixes the columns when there may be no record."""
    fields = list(keys) if keys is not None else list(dict.fromkeys(k for r in records for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in records:
        writer.writerow({k: "" if r.get(k) is None else r.get(k) for k in fields})
    sys.stdout.write(buf.getvalue())


CONTINUED = "  "  # a wrapped line's continuation starts with this; a record never does


def wrap(line: str, width: int) -> list[str]:
    """One record in lines of at most ``width``, broken at spaces only: an id (``job-ab12-worker-1-0``) is never
    split, at a hyphen or elsewhere. Continuations are indented, so ``unwrap`` gives the record back."""
    return textwrap.wrap(line, width=max(width, 20), subsequent_indent=CONTINUED, break_long_words=False,
                         break_on_hyphens=False, drop_whitespace=True) or [""]


def unwrap(text: str) -> list[str]:
    """The records of ``wrap``ped text, one a line."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith(CONTINUED) and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def print_lines(lines: Sequence[str]) -> None:
    """Log-like records, each wrapped at the console's width (80 when piped) with an indented continuation."""
    for line in lines:
        for part in wrap(line, console.width):
            console.print(part, highlight=False, markup=False, soft_wrap=True)
