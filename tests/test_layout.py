"""The package's shape: layers import one way (import-linter), no import cycles, no test doubles in the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.static
def test_import_linter_contracts_kept() -> None:
    """pyproject's [tool.importlinter]: core <- store <- transport|storage <- providers <- sim <- control <- cli."""
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:]


@pytest.mark.static
def test_no_import_cycles() -> None:
    out = subprocess.run([sys.executable, "tools/code_shape.py"], cwd=REPO, capture_output=True, text=True)
    assert "import cycles (function-level imports included): 0" in out.stdout, out.stdout[:3000]


@pytest.mark.static
def test_wheel_ships_no_test_doubles(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                          str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=600)
    if "No module named 'hatchling'" in out.stderr or "hatchling" in out.stderr and out.returncode != 0:
        out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(REPO)],
                             capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = tmp_path.glob("orchestrator-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("orchestrator/model/") for n in names)
    doubles = [n for n in names if "testing" in n or "emulator" in n or n.endswith("sshd.py")]
    assert not doubles, doubles
