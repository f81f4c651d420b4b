"""The codebase stays ruff clean and mypy (strict) clean; the controller never imports TensorFlow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.static
def test_ruff_clean() -> None:
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:]


@pytest.mark.static
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


# ---------------------------------------------------------------- declared dependencies (deptry)

_UNDECLARED = {"DEP001", "DEP003", "DEP004"}  # missing, transitive only, dev-only used by the product


def _deptry(root: Path, out: Path) -> list[dict[str, object]]:
    deptry = Path(sys.executable).with_name("deptry")
    proc = subprocess.run([str(deptry), ".", "-o", str(out)], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.exists(), proc.stderr[-2000:]
    issues: list[dict[str, object]] = json.loads(out.read_text())
    return issues


@pytest.mark.static
def test_every_third_party_import_is_declared(tmp_path: Path) -> None:
    """`deptry .` with pyproject's [tool.deptry]: an import pyproject.toml does not declare fails CI.

    DEP002 (declared but not imported) is only printed: a dependency may be declared a little before
    the code that imports it lands, and psycopg is loaded by URL, not by import.
    """
    issues = _deptry(REPO, tmp_path / "deptry.json")
    bad = [f"{i['location']}: {i['error']}" for i in issues if i["error"]["code"] in _UNDECLARED]  # type: ignore[index]
    unused = [str(i["module"]) for i in issues if i["error"]["code"] == "DEP002"]  # type: ignore[index]
    if unused:
        print("declared but not imported:", ", ".join(unused))
    assert not bad, "\n".join(bad)


def test_deptry_catches_an_undeclared_import(tmp_path: Path) -> None:
    """The check has teeth: with our configuration, `import click` (only a transitive dependency) and an
    unknown package are both reported."""
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    pkg = tmp_path / "orchestrator"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import yaml\nimport click\nimport surely_not_a_declared_package\n")
    codes = {(str(i["module"]), i["error"]["code"]) for i in _deptry(tmp_path, tmp_path / "d.json")}  # type: ignore[index]
    assert ("click", "DEP003") in codes and ("surely_not_a_declared_package", "DEP001") in codes
    assert not any(module == "yaml" for module, _ in codes)  # PyYAML -> yaml is mapped
