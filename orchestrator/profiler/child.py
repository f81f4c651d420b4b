"""``python -P -m orchestrator.profiler.child FOLDER``: profile one user's factory, in its own process.

Started by ``sandbox.profile_in_child`` with a scrubbed environment; ``FOLDER/request.json`` says what to
profile and the limits. The limits are set before anything of the user's is imported (soft = hard, so the
factory cannot raise them); the answer goes to ``FOLDER/result.json`` (``{"profile": ...}`` or
``{"error": ...}``), written whole and renamed into place, so nothing the factory prints is read as it.
Anything that ends the process otherwise (SystemExit, ``os._exit``, a signal) is for the parent to name.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import threading
from pathlib import Path
from typing import Any

from orchestrator.clock import WALL

MEMORY_ERROR_EXIT = 90  # a MemoryError that escaped even the error report (sandbox names it)


def _limit(kind: int, value: int) -> None:
    _, hard = resource.getrlimit(kind)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    # a platform without this limit (macOS and RLIMIT_AS): the wall clock still holds
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(kind, (value, value))


def _watchdog(timeout_s: float) -> None:
    """Exit when the parent is gone (killed while it waited) or past the wall-time limit (a backstop: the
    parent kills the child's process group at the limit)."""
    parent, deadline = os.getppid(), WALL.monotonic() + timeout_s + 5.0  # a real process's limit: real time

    def watch() -> None:
        while os.getppid() == parent and WALL.monotonic() < deadline:
            WALL.sleep(0.5)
        os._exit(124)

    threading.Thread(target=watch, name="profile-watchdog", daemon=True).start()


def _write(folder: Path, doc: dict[str, Any]) -> None:
    tmp = folder / "result.json.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, folder / "result.json")


def _profile(request: dict[str, Any]) -> dict[str, Any]:
    from orchestrator.profiler.factory_ref import FactorySource, ProfileError  # lazy: after the limits are set
    from orchestrator.profiler.torch_profile import import_factory, profile_factory  # lazy: after the limits

    try:
        import torch  # noqa: F401  (torch first: a user's folder put on sys.path later cannot stand in for it)
    except ImportError:
        return {"error": "PyTorch is not installed: `pip install torch` (CPU wheels are enough)"}
    try:
        ref = import_factory(FactorySource.from_dict(request["source"]))
        return {"profile": profile_factory(ref, int(request["default_batch"])).to_dict()}
    except ProfileError as exc:
        return {"error": str(exc)}
    except MemoryError:
        return {"error": f"the factory '{request['source']['ref']}' ran out of memory while being profiled "
                         f"(the limit is {request['memory_mb']} MiB; {request['memory_env']} raises it)"}


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    request = json.loads((folder / "request.json").read_text())
    _limit(resource.RLIMIT_AS, int(request["memory_mb"]) * 2**20)
    _limit(resource.RLIMIT_CORE, 0)  # a crash leaves no core file in the spec's folder
    _limit(resource.RLIMIT_FSIZE, int(request["file_mb"]) * 2**20)  # the output log among them
    _watchdog(float(request["timeout_s"]))
    try:
        doc = _profile(request)
    except MemoryError:
        os._exit(MEMORY_ERROR_EXIT)
    _write(folder, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
