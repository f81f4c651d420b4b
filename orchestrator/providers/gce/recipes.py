"""The image recipes in ``images/``: what `image bake` runs on a builder VM, and what a job's VM on a Google
image runs at first boot (``providers.gce.requests.PAYLOAD_SETUP``)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.model.errors import UserError
from orchestrator.model.paths import _bundled

WORKER_RECIPE, PS_RECIPE = "gpu-worker.sh", "ps.sh"  # in images/


def recipe_path(name: str) -> Path:
    """``images/<name>`` from the checkout (or the wheel's bundled copy)."""
    try:
        path = _bundled("images") / name
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    if not path.is_file():
        raise UserError(f"no image recipe {path}")
    return path
