"""The benches' one way to run the CLI for real: in a home of its own, with its results DB beside it; and the
tests' one way to import a bench script as a module."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/NAME.py as the module NAME (registered, so its dataclasses and pickles resolve)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def orchestrator(args: list[str], home: Path) -> str:
    """``orchestrator ARGS`` run in ``home``; its stdout. A non-zero exit ends the bench with both outputs."""
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "ORCHESTRATOR_DB_URL": f"sqlite:///{home / 'results.db'}"}
    out = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=home, env=env, text=True,
                         capture_output=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"orchestrator {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout
