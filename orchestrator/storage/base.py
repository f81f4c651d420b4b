"""What the controller reads and writes in a job's storage; the layout is the payload's contract.

``metrics.jsonl`` (appended by the chief), ``result.json`` (written once at the end),
``notices/<instance>`` (a preemption notice: the chief checkpoints as soon as one appears),
``checkpoints/`` (TensorFlow checkpoints).
"""

from __future__ import annotations

import abc
from pathlib import Path

METRICS = "metrics.jsonl"
RESULT = "result.json"
NOTICES = "notices"
CHECKPOINTS = "checkpoints"


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

    def write_notice(self, instance: str, text: str) -> None:
        self.write_text(f"{NOTICES}/{instance}", text)

    def notices(self) -> set[str]:
        return set(self.list(NOTICES))
