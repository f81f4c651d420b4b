"""Load VM-lifetime traces: one row per VM, right-censored where the VM was not revoked.

The bundled trace is ``data/gce-preemptible-lifetimes-2019.csv`` (152 preemptible GPU VMs on GCE,
February 2019). A user trace must have the same columns: ``gpu,zone,vm,start,end,lifetime_s,revoked``
(``revoked`` = 1 if the cloud took the VM back, 0 if it was still running when observation stopped;
``start``/``end`` are ISO 8601 and may be empty).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from orchestrator.model.paths import data_dir

TRACE_FILE = "gce-preemptible-lifetimes-2019.csv"
SUMMARY_FILE = "revocation_summary.csv"
REQUIRED_COLUMNS = ("gpu", "zone", "lifetime_s", "revoked")
# The bundled trace has one-minute resolution: a lifetime of 0 means "under a minute".
MIN_LIFETIME_S = 30.0

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class TraceError(ValueError):
    """The trace file cannot be used; the message names the file, line and problem."""


@dataclass(frozen=True)
class TraceRow:
    gpu: str  # lowercase catalog key, e.g. "k80"
    zone: str
    vm: str
    start: datetime | None
    end: datetime | None
    lifetime_s: float
    revoked: bool


@dataclass(frozen=True)
class Trace:
    path: Path
    rows: tuple[TraceRow, ...]

    def gpus(self) -> list[str]:
        return sorted({r.gpu for r in self.rows})

    def zones(self, gpu: str) -> list[str]:
        return sorted({r.zone for r in self.rows if r.gpu == gpu})

    def select(self, gpu: str | None = None, zone: str | None = None) -> tuple[FloatArray, BoolArray]:
        """(lifetimes in seconds, revoked flags) of the matching rows; ``None`` matches everything."""
        rows = [r for r in self.rows if (gpu is None or r.gpu == gpu) and (zone is None or r.zone == zone)]
        times = np.array([max(r.lifetime_s, MIN_LIFETIME_S) for r in rows], dtype=np.float64)
        events = np.array([r.revoked for r in rows], dtype=np.bool_)
        return times, events


def default_trace_path() -> Path:
    return data_dir() / TRACE_FILE


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def load_trace(path: Path | None = None) -> Trace:
    """Read a lifetime trace (the bundled 2019 GCE trace by default)."""
    p = Path(path) if path is not None else default_trace_path()
    try:
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(
                    f"{p}: missing column(s) {', '.join(missing)}; "
                    "a trace needs gpu,zone,vm,start,end,lifetime_s,revoked"
                )
            rows: list[TraceRow] = []
            for line, rec in enumerate(reader, start=2):
                try:
                    lifetime = float(rec["lifetime_s"])
                    revoked = int(rec["revoked"])
                except (TypeError, ValueError):
                    raise TraceError(f"{p}:{line}: lifetime_s must be a number and revoked 0 or 1") from None
                if lifetime < 0 or revoked not in (0, 1):
                    raise TraceError(f"{p}:{line}: lifetime_s must be >= 0 and revoked 0 or 1")
                gpu = (rec.get("gpu") or "").strip().lower()
                if not gpu:
                    raise TraceError(f"{p}:{line}: empty gpu")
                rows.append(
                    TraceRow(
                        gpu=gpu,
                        zone=(rec.get("zone") or "").strip(),
                        vm=(rec.get("vm") or "").strip(),
                        start=_parse_time(rec.get("start")),
                        end=_parse_time(rec.get("end")),
                        lifetime_s=lifetime,
                        revoked=bool(revoked),
                    )
                )
    except OSError as exc:
        raise TraceError(f"cannot read trace {p}: {exc.strerror}") from None
    if not rows:
        raise TraceError(f"{p}: the trace has no rows")
    return Trace(p, tuple(rows))


@dataclass(frozen=True)
class RevocationSummary:
    """Published revoked-before-24h and revoked-in-first-hour fractions for one instance type."""

    key: str
    revoked_before_24h: float
    revoked_first_hour: float
    source: str


def load_revocation_summary(path: Path | None = None) -> dict[str, RevocationSummary]:
    p = Path(path) if path is not None else data_dir() / SUMMARY_FILE
    with p.open(newline="") as fh:
        return {
            r["gpu"].strip().lower(): RevocationSummary(
                r["gpu"].strip().lower(),
                float(r["revoked_before_24h"]),
                float(r["revoked_first_hour"]),
                r.get("source", ""),
            )
            for r in csv.DictReader(fh)
        }
