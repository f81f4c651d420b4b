"""Where a ``MODULE:FACTORY`` reference points, found without running any of its code.

The controller computes a factory's cache key here (the sha256 of its module's source) and refuses what is
not a model factory of the user's own (a builtin or standard-library module: ``os:system``,
``subprocess:getoutput``, ``builtins:exec``; or the orchestrator's own code) before anything runs; the
factory itself is imported and called only in the profiling child (``sandbox``). Nothing here imports the
user's module, torch or torchvision: a dotted module is found by walking the search folders with the import
system's finders (which read folders, not code), a file is read as bytes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import sys
import sysconfig
from dataclasses import dataclass
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

import orchestrator

EXAMPLE = "examples/own-script/models.py:resnet50"
FIX = f"point it at a factory in your own file, e.g. {EXAMPLE}"


class ProfileError(ValueError):
    """A factory that cannot be found, loaded or run; the message says what to fix."""


@dataclass(frozen=True)
class FactorySource:
    """A resolved reference: what the child imports, and the fingerprint the cache key is made of."""

    ref: str  # what the user wrote: MODULE:FACTORY
    kind: str  # "file" (path/models.py), "module" (pkg.mod) or "torchvision" (a library's factory)
    module: str  # the MODULE part as written
    name: str  # the FACTORY part
    path: str  # the module's file ("" for torchvision)
    root: str  # the folder the child puts first on sys.path to import it ("" for torchvision)
    fingerprint: str  # what defines the model: the module's source, or the library's version

    def to_dict(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in ("ref", "kind", "module", "name", "path", "root", "fingerprint")}

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> FactorySource:
        return cls(**{k: str(d[k]) for k in ("ref", "kind", "module", "name", "path", "root", "fingerprint")})


def foreign_module(module: str) -> str | None:
    """Why a module (by its dotted name) is not a user's own model code (builtin, standard library, this tool's
    own package); else None."""
    top = module.split(".", 1)[0]
    if top in sys.builtin_module_names:
        return f"{top} is a built-in module of Python"
    if top in sys.stdlib_module_names:
        return f"{top} is a standard-library module"
    if top == orchestrator.__name__:
        return f"{top} is the orchestrator's own package"
    return None


def _stdlib_roots() -> list[Path]:
    # The base interpreter's library folders (a venv's platstdlib is the venv's own lib/, which holds its
    # site-packages: take the base installation's, where only the standard library lives).
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix, "installed_base": sys.base_prefix,
            "installed_platbase": sys.base_exec_prefix}
    return sorted({Path(sysconfig.get_path(k, vars=base)).resolve() for k in ("stdlib", "platstdlib")})


def foreign_file(path: Path) -> str | None:
    """Why a file is not a user's own model code (the standard library's, or this tool's package); else None."""
    if stdlib_file(path):
        return f"{path} is a file of Python's standard library"
    if path.is_relative_to(Path(orchestrator.__file__).resolve().parent):
        return f"{path} is a file of the orchestrator's own package"
    return None


def stdlib_file(path: Path) -> bool:
    """``path`` is one of the standard library's files (under its folders, outside their site-packages)."""
    for root in _stdlib_roots():
        try:
            rel = path.relative_to(root)
        except ValueError:
            continue
        if not {"site-packages", "dist-packages"} & set(rel.parts):
            return True
    return False


def refused(ref: str, why: str) -> ProfileError:
    return ProfileError(f"'{ref}' is not a model factory of your own ({why}): {FIX}")


def _torchvision(ref: str, name: str) -> FactorySource:
    try:  # the library's version, from its metadata: nothing of it is imported here
        version = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        raise ProfileError(f"torchvision is not installed: install it, or use the torch.nn-only factory {EXAMPLE}"
                           ) from None
    return FactorySource(ref, "torchvision", "torchvision", name, "", "", f"torchvision {version} {name}")


def _file(ref: str, module: str, name: str, folder: Path) -> FactorySource:
    path = (folder / module).resolve()
    if not path.is_file():
        raise ProfileError(f"model factory file {path} does not exist (from '{ref}')")
    if (why := foreign_file(path)) is not None:
        raise refused(ref, why)
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise ProfileError(f"cannot read {path} (from '{ref}'): {exc.strerror}") from None
    return FactorySource(ref, "file", module, name, str(path), str(path.parent), hashlib.sha256(source).hexdigest())


def _find_top(top: str, folder: Path) -> ModuleSpec | None:
    # The order the import would take with ``folder`` first on sys.path: the folder, sys.path, then the
    # other finders (an editable install's). For a top-level name find_spec imports nothing.
    search = [str(folder), *(entry or str(Path.cwd()) for entry in sys.path)]
    found = PathFinder.find_spec(top, search)
    if found is None:
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            found = None
    return found


def _dotted(ref: str, module: str, name: str, folder: Path) -> FactorySource:
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        raise ProfileError(f"'{module}' is neither a file (path/models.py) nor a module name (pkg.mod) (from '{ref}')")
    top = _find_top(parts[0], folder)
    spec = top
    for i in range(1, len(parts)):  # each submodule in its parent's folders (no parent package is imported)
        locations = spec.submodule_search_locations if spec is not None else None
        spec = PathFinder.find_spec(".".join(parts[: i + 1]), list(locations)) if locations is not None else None
    origin = Path(spec.origin) if spec is not None and spec.has_location and spec.origin else None
    if top is None or origin is None or not origin.is_file():
        raise ProfileError(f"cannot find module '{module}' in {folder} or on the Python path (from '{ref}'); "
                           f"a file is written path/models.py:FACTORY")
    path = origin.resolve()
    if (why := foreign_file(path)) is not None:
        raise refused(ref, why)
    # the folder holding the top-level module or package (a namespace package has no file of its own)
    packages = list(top.submodule_search_locations or [])
    root = Path(packages[0]).resolve().parent if packages else Path(top.origin or path).resolve().parent
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise ProfileError(f"cannot read {path} (from '{ref}'): {exc.strerror}") from None
    return FactorySource(ref, "module", module, name, str(path), str(root), hashlib.sha256(source).hexdigest())


def resolve_factory(ref: str, base: Path | None = None) -> FactorySource:
    """``MODULE:FACTORY``: a file (``path/models.py:build``, relative to ``base`` or the current folder), an
    importable module (``pkg.mod:build``, looked up in ``base`` first), or ``torchvision:NAME``; nothing run."""
    module, sep, name = ref.rpartition(":")
    if not sep or not module or not name.isidentifier():
        raise ProfileError(f"'{ref}' is not MODULE:FACTORY (e.g. {EXAMPLE})")
    if module == "torchvision":
        return _torchvision(ref, name)
    folder = base or Path.cwd()
    if module.endswith(".py") or "/" in module:
        return _file(ref, module, name, folder)
    if (why := foreign_module(module)) is not None:
        own = Path(*module.split(".")).with_suffix(".py")
        if (folder / own).is_file():  # a file of the user's that shares the name: the import would not reach it
            why += f"; your {own} is named by its path: {own}:{name}"
        raise refused(ref, why)
    return _dotted(ref, module, name, folder)
