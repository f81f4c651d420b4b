"""What the controller reads and writes in a job's storage; the layout is the payload's contract.

``metrics.jsonl`` (appended by the chief), ``result.json`` (written once at the end),
``notices/<instance>`` (a preemption notice: the chief checkpoints as soon as one appears),
``checkpoints/`` (TensorFlow checkpoints).
"""

from __future__ import annotations

import abc
import errno
from pathlib import Path

from orchestrator.model.errors import UserError

METRICS = "metrics.jsonl"
RESULT = "result.json"
NOTICES = "notices"
CHECKPOINTS = "checkpoints"


class StorageError(UserError):
    """A job's storage cannot be used (refused, cannot be created, cannot be written): retrying cannot help,
    so it ends the job with this message as its reason."""


def os_reason(exc: OSError) -> str:
    """An OSError as a reason a user can act on: its text and its errno name (``No space left on device
    (ENOSPC)``)."""
    name = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} ({name})" if name else text


class JobStorage(abc.ABC):
    uri: str

    @abc.abstractmethod
    def read_text(self, rel: str) -> str | None:
        """The file's text, or None if it does not exist."""

    @abc.abstractmethod
    def read_from(self, rel: str, offset: int) -> bytes:
        """Bytes from ``offset`` to the end (empty if the file is missing or shorter)."""

    @abc.abstractmethod
    def write_text(self, rel: str, text: str) -> None: ...

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Names directly under ``prefix``."""

    def local_path(self) -> Path | None:
        """A directory every instance can use directly (local storage), else None (instances sync)."""
        return None

    def check_writable(self) -> None:  # noqa: B027 - a no-op by default, on purpose
        """Raise StorageError if a file cannot be written there now (a full disk, a read-only mount); remote
        storage is written by the instances' sync, not here, so it has nothing to check."""

    def write_notice(self, instance: str, text: str) -> None:
        self.write_text(f"{NOTICES}/{instance}", text)

    def notices(self) -> set[str]:
        return set(self.list(NOTICES))


class UnusableStorage(JobStorage):
    """A job's storage that could not be opened: nothing to read, and writing raises ``error`` again, so the job
    can still be torn down (its instances deleted) without it."""

    def __init__(self, uri: str, error: StorageError) -> None:
        self.uri = uri
        self.error = error

    def read_text(self, rel: str) -> str | None:
        return None

    def read_from(self, rel: str, offset: int) -> bytes:
        return b""

    def write_text(self, rel: str, text: str) -> None:
        raise self.error

    def list(self, prefix: str) -> list[str]:
        return []

    def check_writable(self) -> None:
        raise self.error
