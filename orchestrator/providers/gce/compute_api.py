"""google-cloud-compute's two packages, imported at the first use of a name in them.

Each of ``compute_v1`` and ``compute_v1beta`` costs ~0.9 s of CPU to import (its package ``__init__`` loads every
service client and one message module of several thousand types). What a dry run, a plan and a quota read need
builds API JSON (providers/gce/requests.py) and reads it back over google-auth's session, so they never pay it;
a call through a client does, once per process. The names are the real modules to mypy.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, cast

__all__ = ["compute_v1", "compute_v1beta", "message"]
M = TypeVar("M")


class _OnFirstUse:
    """Stands for a module until an attribute is read from it; then that attribute is the module's own."""

    def __init__(self, load: Callable[[], ModuleType]) -> None:
        self._load = load
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = self._load()
        return getattr(self._module, attr)


def _v1() -> ModuleType:
    from google.cloud import compute_v1 as module  # the import statement itself: no module is loaded by name

    return module


def _v1beta() -> ModuleType:
    from google.cloud import compute_v1beta as module

    return module


if TYPE_CHECKING:
    from google.cloud import compute_v1, compute_v1beta
else:
    compute_v1 = _OnFirstUse(_v1)
    compute_v1beta = _OnFirstUse(_v1beta)


def message(cls: type[M], body: Mapping[str, Any]) -> M:
    """A request body built as the API's JSON (providers/gce/requests.py) as the client's message ``cls``."""
    return cast(M, cls.from_json(json.dumps(body)))  # type: ignore[attr-defined]  # proto-plus's classmethod
