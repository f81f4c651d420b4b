"""A job's storage in a local directory (the local provider's instances share this machine's disk)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.storage.base import JobStorage


class LocalStorage(JobStorage):
    def __init__(self, uri: str, job_id: str) -> None:
        self.root = (Path(uri).expanduser() / job_id).resolve()
        self.uri = str(self.root)
        self.root.mkdir(parents=True, exist_ok=True)

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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)  # readers never see half a file

    def list(self, prefix: str) -> list[str]:
        try:
            return sorted(p.name for p in self._path(prefix).iterdir() if not p.name.startswith("."))
        except FileNotFoundError:
            return []

    def local_path(self) -> Path:
        return self.root
