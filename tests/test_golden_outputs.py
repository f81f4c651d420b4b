"""`plan --format json`, `launch --dry-run` and `simulate --json` of every example (and the deadline policies'
replay of each example's availability trace) print what they printed before the planning redesign (issue 52):
tests/golden/, recorded at 7a6c5fd by `python -m tests.golden --write`. A change that is meant re-records the
files and names the change in its commit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator_testing.gce_emulator import GceEmulator
from tests.cli_inproc import run_cli
from tests.golden import EXAMPLES, VERBS, args_for, env_for, golden_path, render, stage


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    emu = GceEmulator({"boot_delay_s": 0.05, "op_delay_s": 0.01, "operation_wait_max_s": 5.0})
    emu.start()
    yield emu.url
    emu.stop()


def test_every_example_has_its_golden_files() -> None:
    assert EXAMPLES
    for example in EXAMPLES:
        for verb in ("plan", "dry-run", "simulate"):
            assert golden_path(example, verb).is_file(), golden_path(example, verb)
    assert len(list(Path(golden_path(EXAMPLES[0], "replay").parent).glob("*.replay.txt"))) >= 5


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_output_is_the_recorded_one(example: Path, verb: str, endpoint: str, tmp_path: Path) -> None:
    spec = stage(example, tmp_path, endpoint)
    args = args_for(verb, spec)
    if args is None:
        assert not golden_path(example, verb).exists()
        return
    out = run_cli(args, env_for(tmp_path), spec.parent)
    got = render(out.returncode, out.stdout, out.stderr, tmp_path, endpoint)
    assert got == golden_path(example, verb).read_text()
