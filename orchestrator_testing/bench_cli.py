"""The benches' one way to run the CLI for real: in a home of its own, with its results DB beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def orchestrator(args: list[str], home: Path) -> str:
    """``orchestrator ARGS`` run in ``home``; its stdout. A non-zero exit ends the bench with both outputs."""
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "ORCHESTRATOR_DB_URL": f"sqlite:///{home / 'results.db'}"}
    out = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=home, env=env, text=True,
                         capture_output=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"orchestrator {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout
