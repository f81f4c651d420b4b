"""Profiles of users' own models (``torch:MODULE:FACTORY``), made by ``orchestrator.profiler``.

Core never imports torch: the profiler (or the CLI before it loads a spec) registers a profile here,
and writes it to ``<orchestrator home>/profiles/`` (by content, and the latest one by name), so a
process that did not profile (the daemon, a later ``plan``) finds the last profile of that name.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from orchestrator.costmodel.profiles.model import ModelProfile
from orchestrator.model.paths import home_path, user_dir

TORCH_PREFIX = "torch:"
_REGISTERED: dict[str, ModelProfile] = {}


def is_user_model(name: str) -> bool:
    return name.startswith(TORCH_PREFIX)


def profiles_dir() -> Path:
    """Where profiles are kept; made by the first write (a refused spec leaves nothing behind)."""
    return home_path() / "profiles"


def write_profile(path: Path, profile: ModelProfile) -> None:
    user_dir()  # the home, owner-only, made by the first write
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict()) + "\n")


def latest_path(name: str) -> Path:
    return profiles_dir() / f"latest-{hashlib.sha256(name.encode()).hexdigest()[:20]}.json"


def register_profile(profile: ModelProfile, persist: bool = True) -> None:
    """Make ``profile`` known by its name to this process (and, ``persist``, to later ones)."""
    _REGISTERED[profile.name] = profile
    if persist:
        write_profile(latest_path(profile.name), profile)


def find_user_profile(name: str) -> ModelProfile | None:
    """The registered profile of ``name``, else the last one written by any process; None if never profiled."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    try:
        profile = ModelProfile.from_dict(json.loads(latest_path(name).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _REGISTERED[name] = profile
    return profile
