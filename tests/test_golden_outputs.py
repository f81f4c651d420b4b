"""`plan --format json`, `launch --dry-run` and `simulate --json` of every example (and the deadline policies'
replay of each example's availability trace) print what they printed before the planning redesign (issue 52):
tests/golden/, recorded at 7a6c5fd by `python -m tests.golden --write`. A change that is meant re-records the
files and names the change in its commit.

Each verb's commands run in one fresh interpreter (`python -m tests.golden --check VERB`), as a user's command
starts: in a test worker that other tests have used, a module-level cache they filled moved the Monte Carlo
figures in the 6th digit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden import EXAMPLES, REPO, VERBS, golden_path


def test_every_example_has_its_golden_files() -> None:
    assert EXAMPLES
    for example in EXAMPLES:
        for verb in ("plan", "dry-run", "simulate"):
            assert golden_path(example, verb).is_file(), golden_path(example, verb)
    assert len(list(Path(golden_path(EXAMPLES[0], "replay").parent).glob("*.replay.txt"))) >= 5


@pytest.mark.parametrize("verb", VERBS)
def test_output_is_the_recorded_one(verb: str) -> None:
    out = subprocess.run([sys.executable, "-m", "tests.golden", "--check", verb], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
