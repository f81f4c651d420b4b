"""Per-rank batches of a fixed global batch (pure Python: the trainer, the user wrapper and tests use it)."""

from __future__ import annotations


def proportional_split(total: int, weights: list[float]) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights`` (largest remainder), each at least 1.

    The same rule as orchestrator.costmodel.slots.proportional_split: with the planner's per-slot batches as weights
    and the full world, it returns the planner's batches unchanged; after a shrink, the survivors' shares
    grow in the planner's proportions so that the global batch stays the same.
    """
    if total < len(weights):
        raise ValueError(f"global batch {total} is smaller than the {len(weights)} ranks")
    raw = [total * w / sum(weights) for w in weights]
    out = [max(1, int(r)) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True):
        if sum(out) >= total:
            break
        out[i] += 1
    while sum(out) > total:
        out[out.index(max(out))] -= 1
    return out


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
