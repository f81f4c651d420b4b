"""The task.json schema (orchestrator/model/task.py) for a payload run from a checkout or an installed wheel.

On an instance the controller pushes its own definition over this file (control/execute.py), so the
payload reads exactly the schema the controller wrote. Here, that same file is loaded from the package
beside jobs/: one definition, never a copy.
"""

import importlib.util
import sys
from pathlib import Path


def _definition() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "orchestrator" / "model" / "task.py",  # a checkout: jobs/ beside orchestrator/
                      here.parent.parent / "model" / "task.py"):  # the wheel: orchestrator/_bundled/jobs
        if candidate.is_file():
            return candidate
    raise ImportError(f"task_schema: orchestrator/model/task.py not found near {here}")


_spec = importlib.util.spec_from_file_location(__name__, _definition())
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _module  # dataclasses resolve their module while the file runs
_spec.loader.exec_module(_module)
