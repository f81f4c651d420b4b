"""Files the chief writes into the job's storage directory (metrics.jsonl, result.json) and notices/."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

NOTICE_POLL_S = 0.5


class MetricsWriter:
    """Appends one JSON object per line to ``metrics.jsonl``, flushed per line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        rec = {"kind": kind, "t": round(time.time(), 3), **fields}
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._f.flush()
        return rec

    def close(self) -> None:
        self._f.close()


def write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


class NoticeWatcher:
    """Polls ``notices/`` (at most every NOTICE_POLL_S); files present at start count as already seen."""

    def __init__(self, directory: Path, poll_s: float = NOTICE_POLL_S) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._poll_s = poll_s
        self._next = 0.0
        self.seen: set[str] = set(self._list())

    def _list(self) -> Iterable[str]:
        try:
            return [n for n in os.listdir(self.directory) if not n.startswith(".")]
        except FileNotFoundError:
            return []

    def poll(self) -> list[str]:
        """New notice names since the last call (empty if polled too recently)."""
        now = time.monotonic()
        if now < self._next:
            return []
        self._next = now + self._poll_s
        new = sorted(set(self._list()) - self.seen)
        self.seen.update(new)
        return new


@dataclass
class WindowStats:
    """Per-worker step counts over one logging window (worker index -> steps)."""

    start: float = field(default_factory=time.monotonic)
    steps: dict[int, int] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)

    unknown: int = 0  # steps whose worker could not be told (outputs lost with the worker)

    def add(self, worker: int, loss: float) -> None:
        if worker < 0:
            self.unknown += 1
        else:
            self.steps[worker] = self.steps.get(worker, 0) + 1
        if loss == loss:  # not NaN
            self.losses.append(loss)

    def record(self, step: int, batch_per_worker: tuple[int, ...]) -> dict[str, Any]:
        secs = max(time.monotonic() - self.start, 1e-9)
        total_steps = sum(self.steps.values()) + self.unknown
        examples = sum(batch_per_worker[w] * n for w, n in self.steps.items())
        workers = {
            str(w): {
                "steps": self.steps.get(w, 0),
                "batch": batch_per_worker[w],
                "examples_per_s": round(batch_per_worker[w] * self.steps.get(w, 0) / secs, 3),
                "step_time_s": round(secs / self.steps[w], 5) if self.steps.get(w) else None,
            }
            for w in range(len(batch_per_worker))
        }
        loss = sum(self.losses) / len(self.losses) if self.losses else float("nan")
        return {
            "step": step,
            "loss": round(loss, 5),
            "examples_per_s": round(examples / secs, 3),
            "steps_per_s": round(total_steps / secs, 4),
            "window_s": round(secs, 4),
            "workers": workers,
            # The calibration's runtime key of this payload (TensorFlow's graph-mode PS job, the 2019 study's).
            "runtime": "tf1-graph",
            "precision": "fp32",
        }
