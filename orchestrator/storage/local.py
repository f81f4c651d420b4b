"""A job's storage in a local directory (the local provider's instances share this machine's disk).

Which folders may be one is decided once, by ``storage_problem``: `plan`, `launch --dry-run` and `launch` refuse
a spec's storage with it (planning/judge.py), and opening a job's storage (the daemon, a foreground launch)
runs it again before anything is written, whatever the job row says.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from orchestrator.model.paths import home_path
from orchestrator.model.specfile import storage_folder_problem
from orchestrator.storage.base import JobStorage, StorageError, os_reason
from orchestrator.store.env import ENV_URL

# SQLite keeps these beside the DB file (and the daemon and the migrations their locks): none is a folder to use.
DB_SIDE_FILES = ("", "-wal", "-shm", "-journal", ".daemon-lock", ".migrate-lock")
# What the orchestrator keeps in its home (model/paths.py user_dir): the default DB (store/db.py), the local
# provider's instances (providers/local/backend.py), per-job SSH keys (transport/keys.py), user model profiles
# (costmodel/profiles/user.py), the ssh provider's host assignments (providers/ssh/provider.py), daemon ids
# (control/daemon.py); hidden files too. tests/test_storage_guard.py checks a real launch's home against it.
HOME_ENTRIES = ("orchestrator.db*", "local", "keys", "profiles", "ssh-assignments.json*", "daemon-*", ".*")


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite:///PATH`` URL opens (relative to the working directory, as SQLite opens it); None for
    a server DB or an in-memory one."""
    scheme, sep, rest = url.partition(":///")
    if not sep or scheme.split("+", 1)[0] != "sqlite":
        return None
    path = rest.split("?", 1)[0].removeprefix("file:")
    return Path(path) if path and path != ":memory:" else None


def storage_problem(uri: str) -> str | None:
    """Why ``uri`` must not be a job's local storage (an OS folder, a shared folder itself, the results DB's file,
    the orchestrator's home), or None; gs:// storage is not a folder of this machine. Creates nothing."""
    if uri.startswith("gs://"):
        return None
    db = sqlite_file(os.environ.get(ENV_URL) or "")  # the default DB is one of the home's own files, below
    db_files = tuple(db.with_name(db.name + side) for side in DB_SIDE_FILES) if db is not None else ()
    return storage_folder_problem(uri, db_files=db_files, home=home_path(), home_entries=HOME_ENTRIES)


class LocalStorage(JobStorage):
    def __init__(self, uri: str, job_id: str) -> None:
        if problem := storage_problem(uri):
            raise StorageError(f"storage: {problem}")
        try:
            self.root = (Path(uri).expanduser() / job_id).resolve()
            self.root.mkdir(parents=True, exist_ok=True)
        except (OSError, RuntimeError) as exc:  # a file in the way, no permission, a read-only disk, a symlink loop
            why = os_reason(exc) if isinstance(exc, OSError) else str(exc)
            raise StorageError(f"storage {uri}: cannot create the job's folder there: {why}") from None
        self.uri = str(self.root)

    def _path(self, rel: str) -> Path:
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"{rel!r} escapes the job's storage")
        return path

    def read_text(self, rel: str) -> str | None:
        try:
            return self._path(rel).read_text()
        except FileNotFoundError:
            return None

    def read_from(self, rel: str, offset: int) -> bytes:
        try:
            with self._path(rel).open("rb") as fh:
                fh.seek(offset)
                return fh.read()
        except FileNotFoundError:
            return b""

    def write_text(self, rel: str, text: str) -> None:
        path = self._path(rel)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
            tmp.replace(path)  # readers never see half a file
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise self._unwritable(exc) from None

    def list(self, prefix: str) -> list[str]:
        try:
            return sorted(p.name for p in self._path(prefix).iterdir() if not p.name.startswith("."))
        except FileNotFoundError:
            return []

    def check_writable(self) -> None:
        probe = self.root / f".writable.{os.getpid()}"
        try:
            with probe.open("wb") as fh:  # one byte: a full disk has no block left for it
                fh.write(b"1")
                fh.flush()
                os.fsync(fh.fileno())  # a disk that allocates at write-back reports ENOSPC here
        except OSError as exc:
            raise self._unwritable(exc) from None
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()

    def _unwritable(self, exc: OSError) -> StorageError:
        return StorageError(f"storage {self.root} cannot be written: {os_reason(exc)}; the job cannot keep its "
                            "checkpoints and metrics there")

    def local_path(self) -> Path:
        return self.root
