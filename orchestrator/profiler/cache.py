"""Profiles cached by content: the factory's source (or library version), the batches, torch's version.

The key is made without running anything of the user's (``factory_ref``); a hit needs no child, a miss
profiles the factory in one (``sandbox``)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Any

from orchestrator.costmodel.profiles import ModelProfile, register_profile
from orchestrator.costmodel.profiles.user import profiles_dir, write_profile
from orchestrator.model.specfile import read_yaml_file
from orchestrator.profiler.factory_ref import ProfileError, resolve_factory
from orchestrator.profiler.sandbox import profile_in_child

# what the cache key is made of, as the profiler defines them (torch_profile.py imports no torch at its top)
from orchestrator.profiler.torch_profile import BATCHES, PROFILER_VERSION


def cache_key(ref: str, fingerprint: str, torch_version: str) -> str:
    text = json.dumps([PROFILER_VERSION, ref, fingerprint, list(BATCHES), torch_version])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def torch_version() -> str:
    """The installed torch's version, from its metadata (torch.__version__ without importing torch)."""
    if importlib.util.find_spec("torch") is None:
        raise ProfileError("PyTorch is not installed: `pip install torch` (CPU wheels are enough)")
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a build without metadata: ask the library itself
        import torch  # lazy: torch is an optional extra (heavy import)

        return str(torch.__version__)


def torch_profile(ref: str, base: Path | None = None, use_cache: bool = True,
                  withhold: frozenset[str] = frozenset()) -> tuple[ModelProfile, bool]:
    """(profile of ``ref``, whether it came from the cache); registered with the cost model either way. A miss
    runs the factory in a child process (``sandbox``) whose environment lacks ``withhold`` among others."""
    src = resolve_factory(ref, base)  # refuses os:system and the like; nothing of the user's runs here
    path = profiles_dir() / f"{cache_key(src.ref, src.fingerprint, torch_version())}.json"
    if use_cache and path.exists():
        try:
            profile = ModelProfile.from_dict(json.loads(path.read_text()))
            register_profile(profile)
            return profile, True
        except (ValueError, KeyError, TypeError):
            pass  # an unreadable cache entry is rebuilt
    profile = profile_in_child(src, base or Path.cwd(), withhold)
    write_profile(path, profile)
    register_profile(profile)
    return profile, False


def spec_model_ref(raw: Any) -> str | None:
    """``training.model.torch`` of a parsed spec document, if it names one."""
    training = raw.get("training") if isinstance(raw, dict) else None
    model = training.get("model") if isinstance(training, dict) else None
    ref = model.get("torch") if isinstance(model, dict) else None
    return ref if isinstance(ref, str) else None


def spec_secret_names(raw: Any) -> frozenset[str]:
    """Every variable name ``training.secrets`` reads or sets (``- NAME``, ``{name:, env:}``)."""
    training = raw.get("training") if isinstance(raw, dict) else None
    secrets = training.get("secrets") if isinstance(training, dict) else None
    names: set[str] = set()
    for item in secrets if isinstance(secrets, list) else []:
        if isinstance(item, str):
            names.add(item)
        elif isinstance(item, dict):
            names.update(v for k, v in item.items() if k in ("name", "env") and isinstance(v, str))
    return frozenset(names)


def prepare_spec_model(spec_path: Path) -> ModelProfile | None:
    """Profile (or fetch from the cache) the model a spec names, before the spec is loaded and checked
    (its batch check needs the profile)."""
    try:
        raw = read_yaml_file(Path(spec_path), "spec")  # the safe reader load_spec uses (UTF-8, size, depth)
    except (OSError, ValueError):
        return None  # load_spec reports it
    return prepare_document_model(raw, Path(spec_path).resolve().parent)


def prepare_document_model(raw: Any, folder: Path) -> ModelProfile | None:
    """The same for a spec document already read: the factory path is relative to the spec's ``folder``, where
    the profiling child runs, without the spec's secrets."""
    ref = spec_model_ref(raw)
    if ref is None:
        return None
    return torch_profile(ref, folder, withhold=spec_secret_names(raw))[0]
