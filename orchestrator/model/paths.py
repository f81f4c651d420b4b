"""Where the project's bundled files live, in a checkout and in an installed wheel."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from platformdirs import user_data_dir

_PKG = Path(__file__).resolve().parent.parent  # orchestrator/, this file being orchestrator/model/paths.py
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


def home_path() -> Path:
    """Where ``user_dir`` is (nothing created)."""
    return Path(os.environ.get("ORCHESTRATOR_HOME") or user_data_dir("orchestrator"))


def user_dir() -> Path:
    """Per-user state: the default SQLite DB, local instances, per-job SSH keys. Owner-only (0700) whatever
    the DB URL: the keys and the instances' disks live here even when the DB is elsewhere."""
    root = home_path()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    _owner_only(root)
    return root


def _owner_only(folder: Path) -> None:
    # An existing home made before (0755 by the umask) is narrowed too; never a shared sticky folder such as
    # /tmp given as the home, nor one that another user owns.
    try:
        st = folder.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077 and not st.st_mode & stat.S_ISVTX:
            folder.chmod(0o700)
    except OSError:
        pass
