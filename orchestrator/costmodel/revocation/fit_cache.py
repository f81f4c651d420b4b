"""Bathtub fits kept on disk between processes, keyed by a digest of the rows fitted and the cap.

The bathtub's censored likelihood fit (SciPy's L-BFGS-B from four starts) costs a plan about a third of a second
per GPU type, every process; the rows of a trace do not change between plans, so its result is kept under the
orchestrator home (``cache/revocation-fits.json``). The rows are the truth: a changed trace has another digest
and is fitted afresh. A home that cannot be written only costs the fit again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from orchestrator.costmodel.revocation.distributions import Bathtub
from orchestrator.costmodel.revocation.traces import BoolArray, FloatArray
from orchestrator.model.paths import home_path

VERSION = 1  # bump when fit_bathtub changes what it returns for the same rows


def cache_path() -> Path:
    return home_path() / "cache" / "revocation-fits.json"


def digest(times: FloatArray, events: BoolArray, cap: float) -> str:
    h = hashlib.sha256(f"v{VERSION} cap={cap!r}".encode())
    h.update(times.astype("<f8").tobytes())
    h.update(events.astype("?").tobytes())
    return h.hexdigest()


def _read(path: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            return data
    return {}


def cached(key: str) -> Bathtub | None:
    entry = _read(cache_path()).get(key)
    if not isinstance(entry, dict):
        return None
    try:
        return Bathtub(**{f.name: float(entry[f.name]) for f in dataclasses.fields(Bathtub)})
    except (KeyError, TypeError, ValueError):
        return None


def keep(key: str, fit: Bathtub) -> None:
    """Add one fit to the file, written whole through a temporary file (a reader never sees half of it)."""
    path = cache_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = _read(path)
        data[key] = dataclasses.asdict(fit)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, path)
