"""The codebase stays ruff clean and mypy (strict) clean; the controller never imports TensorFlow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_clean() -> None:
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:]


def test_mypy_strict_clean() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:]


def test_controller_imports_without_tensorflow() -> None:
    code = ("import sys, importlib, pkgutil, orchestrator\n"
            "for m in pkgutil.walk_packages(orchestrator.__path__, 'orchestrator.'):\n"
            "    if not m.name.endswith('__main__'):  # running the CLI is not importing it\n"
            "        importlib.import_module(m.name)\n"
            "assert 'tensorflow' not in sys.modules, 'the controller imported TensorFlow'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-4000:]
