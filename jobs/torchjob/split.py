"""Per-rank batches of a fixed global batch (pure Python: the trainer, the user wrapper and tests use it)."""

from __future__ import annotations

# One rule with the planner's (orchestrator/model/task.py, shipped as jobs/task_schema.py): never a copy here.
from task_schema import proportional_split as proportional_split


def offsets(batches: list[int]) -> list[int]:
    """Where each rank's slice of the global batch starts (rank order)."""
    out, acc = [], 0
    for b in batches:
        out.append(acc)
        acc += b
    return out


def interpolate(table: list[list[float]], x: float) -> float:
    """Piecewise-linear y(x) through [[x, y], ...] points, extended linearly past the ends, never below 0."""
    pts = sorted((float(a), float(b)) for a, b in table)
    if not pts:
        return 0.0
    if len(pts) == 1:
        return pts[0][1]
    i = 0
    while i < len(pts) - 2 and x > pts[i + 1][0]:
        i += 1
    (x0, y0), (x1, y1) = pts[i], pts[i + 1]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0)) if x1 != x0 else y0
