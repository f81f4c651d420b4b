"""Check a built wheel: the package is in it, the test doubles are not (`python tools/check_wheel.py DIR`)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path


def problems(wheel: Path) -> list[str]:
    names = zipfile.ZipFile(wheel).namelist()
    out = [] if any(n.startswith("orchestrator/cli/") for n in names) else ["the package is not in the wheel"]
    doubles = [n for n in names if "testing" in n or "emulator" in n or n.endswith("sshd.py")]
    return out + [f"a test double is in the wheel: {n}" for n in doubles]


def main(folder: str) -> int:
    wheels = sorted(Path(folder).glob("orchestrator-*.whl"))
    if len(wheels) != 1:
        print(f"expected one orchestrator wheel in {folder}, found {len(wheels)}")
        return 1
    found = problems(wheels[0])
    for p in found:
        print(p)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else "usage: python tools/check_wheel.py WHEEL_FOLDER")
