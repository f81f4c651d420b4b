"""`launch --dry-run` admits a spec once: one read of the spec file, one check of the provider's set-up, one planner
run, for a local and a gce example (issue 52: before the planning layer, two reads, two set-up checks and up to
four planner runs).

Calls are counted by the functions' code objects under a profile hook, so every caller is seen, however it
imported the function."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
import yaml

from orchestrator.costmodel import planner
from orchestrator.model.spec import load
from orchestrator.providers import registry
from orchestrator_testing.gce_emulator import GceEmulator
from tests.cli_inproc import run_cli

REPO = Path(__file__).resolve().parent.parent
COUNTED: dict[CodeType, str] = {
    planner.plan.__code__: "planner runs",
    load.read_spec_document.__code__: "spec reads",
    registry.check_setup.__code__: "set-up checks",
}


@contextmanager
def counting() -> Iterator[Counter[str]]:
    seen: Counter[str] = Counter()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and (name := COUNTED.get(frame.f_code)) is not None:
            seen[name] += 1

    sys.setprofile(hook)
    try:
        yield seen
    finally:
        sys.setprofile(None)


@pytest.fixture(scope="module")
def emu() -> Iterator[GceEmulator]:
    emulator = GceEmulator({"boot_delay_s": 0.05, "op_delay_s": 0.01})
    emulator.start()
    yield emulator
    emulator.stop()


def _dry_run(spec: Path, tmp_path: Path) -> Counter[str]:
    env = {"ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/x.db", "PATH": "/usr/bin:/bin",
           "ORCHESTRATOR_HOME": str(tmp_path / "home")}
    with counting() as seen:
        out = run_cli(["launch", "--dry-run", str(spec)], env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return seen


def test_a_local_dry_run_reads_checks_and_plans_once(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "examples" / "local-hetero.yaml").read_text())
    data["storage"] = str(tmp_path / "runs")
    spec = tmp_path / "local-hetero.yaml"
    spec.write_text(yaml.safe_dump(data))
    assert _dry_run(spec, tmp_path) == {"planner runs": 1, "spec reads": 1, "set-up checks": 1}


def test_a_gce_dry_run_reads_checks_and_plans_once(emu: GceEmulator, tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "examples" / "gce-current-gpus.yaml").read_text())
    data["provider"]["api_endpoint"] = emu.url  # the quota read goes to the emulator, not GCE
    spec = tmp_path / "gce-current-gpus.yaml"
    spec.write_text(yaml.safe_dump(data))
    assert _dry_run(spec, tmp_path) == {"planner runs": 1, "spec reads": 1, "set-up checks": 1}
