"""Where the project's bundled files live, in a checkout and in an installed wheel."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_data_dir

_PKG = Path(__file__).resolve().parent.parent  # orchestrator/, this file being orchestrator/core/paths.py
_CHECKOUT = _PKG.parent


def _bundled(name: str) -> Path:
    # An editable install / checkout has the folder beside the package; a wheel has it bundled inside.
    for candidate in (_CHECKOUT / name, _PKG / "_bundled" / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"cannot find the project's '{name}' folder (looked beside and inside {_PKG})")


def data_dir() -> Path:
    return _bundled("data")


def jobs_dir() -> Path:
    return _bundled("jobs")


def alembic_dir() -> Path:
    return _bundled("alembic")


def alembic_ini() -> Path:
    return _bundled("alembic.ini")


def user_dir() -> Path:
    """Per-user state: the default SQLite DB, local instances, per-job SSH keys."""
    root = Path(os.environ.get("ORCHESTRATOR_HOME") or user_data_dir("orchestrator"))
    root.mkdir(parents=True, exist_ok=True)
    return root
