"""A job's progress clock: the training steps logged in its metrics.jsonl (light: the instance host uses it)."""

from __future__ import annotations

import json


def _steps(data: bytes) -> list[int]:
    out = []
    for line in data.splitlines():
        if b'"step"' not in line:
            continue
        try:
            out.append(int(json.loads(line).get("step", 0)))
        except (ValueError, TypeError, AttributeError):
            continue  # a line being written right now
    return out


def max_step(data: bytes) -> int:
    """The highest ``step`` in these metrics.jsonl lines (0 if none)."""
    return max(_steps(data), default=0)


def first_step_at_least(data: bytes, target: int) -> int | None:
    """The first logged step at or past ``target``, in file order: when the progress clock struck, however
    late the reader looked."""
    return next((s for s in _steps(data) if s >= target), None)
