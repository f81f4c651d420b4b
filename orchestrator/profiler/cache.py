"""Profiles cached by content: the factory's source (or library version), the batches, torch's version."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from orchestrator.core.costmodel.profiles import ModelProfile, register_profile
from orchestrator.core.costmodel.profiles.user import profiles_dir
from orchestrator.profiler.torch_profile import BATCHES, PROFILER_VERSION, ProfileError, load_factory, profile_factory


def cache_key(ref: str, fingerprint: str, torch_version: str) -> str:
    text = json.dumps([PROFILER_VERSION, ref, fingerprint, list(BATCHES), torch_version])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def torch_profile(ref: str, base: Path | None = None, use_cache: bool = True) -> tuple[ModelProfile, bool]:
    """(profile of ``ref``, whether it came from the cache); registered with the cost model either way."""
    try:
        import torch
    except ImportError:
        raise ProfileError("PyTorch is not installed: `pip install torch` (CPU wheels are enough)") from None
    factory = load_factory(ref, base)
    path = profiles_dir() / f"{cache_key(factory.ref, factory.fingerprint, torch.__version__)}.json"
    if use_cache and path.exists():
        try:
            profile = ModelProfile.from_dict(json.loads(path.read_text()))
            register_profile(profile)
            return profile, True
        except (ValueError, KeyError, TypeError):
            pass  # an unreadable cache entry is rebuilt
    profile = profile_factory(factory)
    path.write_text(json.dumps(profile.to_dict()) + "\n")
    register_profile(profile)
    return profile, False


def spec_model_ref(raw: Any) -> str | None:
    """``training.model.torch`` of a parsed spec document, if it names one."""
    training = raw.get("training") if isinstance(raw, dict) else None
    model = training.get("model") if isinstance(training, dict) else None
    ref = model.get("torch") if isinstance(model, dict) else None
    return ref if isinstance(ref, str) else None


def prepare_spec_model(spec_path: Path) -> ModelProfile | None:
    """Profile (or fetch from the cache) the model a spec names, before the spec is loaded and checked
    (its batch check needs the profile). The factory path is relative to the spec's folder."""
    import yaml

    try:
        raw = yaml.safe_load(Path(spec_path).read_text())
    except (OSError, yaml.YAMLError):
        return None  # load_spec reports it
    ref = spec_model_ref(raw)
    if ref is None:
        return None
    return torch_profile(ref, Path(spec_path).resolve().parent)[0]
