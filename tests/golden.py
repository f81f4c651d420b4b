"""Golden outputs: `plan --format json`, `launch --dry-run` and `simulate --json` of every example, and
`simulate --availability-trace ... --policy all --json` of every example that replays a trace, recorded
before a redesign moves code (issue 52) and compared after it.

What changes from run to run is taken out, and nothing else: the planner's own `elapsed_s`, the host's load
average, the emulator's port and the temporary folder; `plan` runs at `--host-load 0` (an idle host) so the
host's load does not move the local figures. Floats are kept to 6 significant digits: a move that sums the
same terms in another order (or a BLAS that splits a sum over its threads) may change the last bits, not
the figure.

    python -m tests.golden --write     # record (or, after an intended change, re-record) tests/golden/
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
VOLATILE_KEYS = frozenset({"elapsed_s", "loadavg_1m"})  # the planner's own time; the host's load average
ENDPOINT = "http://compute.emulator.invalid"  # what the emulator's URL reads as in a golden file


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_round(v) for v in value]
    return value


def _text(out: str, tmp: Path, endpoint: str | None) -> str:
    out = out.replace(str(tmp), "<tmp>").replace(str(REPO), "<repo>")
    if endpoint:
        out = out.replace(endpoint, ENDPOINT)
    out = re.sub(r"load average [0-9.]+", "load average <n>", out)
    return re.sub(r"[ \t]+$", "", out, flags=re.M)


def normalise(stdout: str, tmp: Path, endpoint: str | None) -> str:
    """The output with its volatile parts taken out: JSON re-dumped with rounded floats, text as printed."""
    text = _text(stdout, tmp, endpoint)
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    return json.dumps(_round(doc), indent=1, sort_keys=True) + "\n"


def stage(example: Path, tmp: Path, endpoint: str | None) -> Path:
    """A copy of ``example`` in ``tmp/examples`` beside copies of the examples' folders and a link to data/ (the
    paths a spec names stay as they are); a gce spec talks to ``endpoint``."""
    data = yaml.safe_load(example.read_text())
    if data.get("provider", {}).get("kind") == "gce" and endpoint:
        data["provider"]["api_endpoint"] = endpoint
    folder = tmp / "examples"
    folder.mkdir()
    for entry in example.parent.iterdir():  # copies: a spec's files must lie inside its folder
        if entry.is_dir():
            shutil.copytree(entry, folder / entry.name)
    (tmp / "data").symlink_to(REPO / "data")
    spec = folder / example.name
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


VERBS = ("plan", "dry-run", "simulate", "replay")


def args_for(verb: str, spec: Path) -> list[str] | None:
    """The command line of ``verb`` for ``spec`` (run in the spec's folder); None where it does not apply:
    `replay` is the deadline policies on the spec's own availability trace (and its other markets')."""
    if verb == "plan":
        return ["plan", "--format", "json", "--host-load", "0", str(spec)]
    if verb == "dry-run":
        return ["launch", "--dry-run", str(spec)]
    if verb == "simulate":
        return ["simulate", "--json", "--runs", "200", "--seed", "0", str(spec)]
    doc = yaml.safe_load(spec.read_text())
    provider = doc.get("provider", {})
    zones = list((provider.get("zone_availability_traces") or {}).values())
    own = provider.get("availability_trace") or (zones[0] if zones else None)
    if own is None:
        return None
    gpu = doc["cluster"]["workers"][0]["gpu"]  # another zone's trace is another market of the same GPU type
    also = [f"{g}={path}" for g, path in (provider.get("gpu_availability_traces") or {}).items()]
    also += [f"{gpu}={path}" for path in zones[1:]]
    extra = [a for item in also for a in ("--also-trace", item)]
    start = ["--start-tick", str(provider["availability_start_tick"])] if "availability_start_tick" in provider else []
    return ["simulate", str(spec), "--availability-trace", own, *start, "--policy", "all", "--json", *extra]


def golden_path(example: Path, verb: str) -> Path:
    return GOLDEN / f"{example.stem}.{verb}.txt"


def env_for(tmp: Path) -> dict[str, str]:
    return {"ORCHESTRATOR_DB_URL": f"sqlite:///{tmp}/results.db", "ORCHESTRATOR_HOME": str(tmp / "home"),
            "PATH": "/usr/bin:/bin", "COLUMNS": "160", "HOME": str(tmp / "userhome"),
            "DEMO_TOKEN": "golden"}  # examples/local-own-script.yaml's secret: a dry run reads it as the launch does


def render(rc: int, stdout: str, stderr: str, tmp: Path, endpoint: str | None) -> str:
    """What a golden file holds: the exit code, then stdout normalised (stderr only where it failed)."""
    body = normalise(stdout, tmp, endpoint)
    tail = "" if rc == 0 else "--- stderr\n" + _text(stderr, tmp, endpoint)
    return f"rc {rc}\n{body}{tail}"


@contextmanager
def _emulator() -> Iterator[str]:
    from orchestrator_testing.gce_emulator import GceEmulator

    emu = GceEmulator({"boot_delay_s": 0.05, "op_delay_s": 0.01, "operation_wait_max_s": 5.0})
    emu.start()
    try:
        yield emu.url
    finally:
        emu.stop()


def outputs(verbs: tuple[str, ...]) -> dict[Path, str]:
    """What every example prints for ``verbs`` now, by golden file."""
    import tempfile

    from tests.cli_inproc import run_cli

    found: dict[Path, str] = {}
    with _emulator() as url:
        for example in EXAMPLES:
            for verb in verbs:
                with tempfile.TemporaryDirectory() as d:
                    tmp = Path(d)
                    spec = stage(example, tmp, url)
                    args = args_for(verb, spec)
                    if args is not None:
                        out = run_cli(args, env_for(tmp), spec.parent)
                        found[golden_path(example, verb)] = render(out.returncode, out.stdout, out.stderr, tmp, url)
    return found


def write_all() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for path, text in outputs(VERBS).items():
        path.write_text(text)
        print(f"wrote {path.name}", file=sys.stderr)


FLOAT_REL_TOL = 1e-4  # numpy's vectorised exp/log differ by ulps between CPUs (AVX-512 or not): Monte Carlo tails move


def _same(old: Any, new: Any) -> bool:
    """Equal, floats to FLOAT_REL_TOL (a structure, key or string that changed still differs)."""
    if isinstance(old, float) or isinstance(new, float):
        return (isinstance(old, int | float) and isinstance(new, int | float)
                and math.isclose(old, new, rel_tol=FLOAT_REL_TOL, abs_tol=1e-9))
    if isinstance(old, dict) and isinstance(new, dict):
        return old.keys() == new.keys() and all(_same(old[k], new[k]) for k in old)
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(old, new, strict=True))
    return bool(old == new)


def _matches(old: str, new: str) -> bool:
    """The same file (see render): its rc line equal, its JSON body the same to FLOAT_REL_TOL."""
    if old == new:
        return True
    (old_rc, _, old_body), (new_rc, _, new_body) = old.partition("\n"), new.partition("\n")
    try:
        return old_rc == new_rc and _same(json.loads(old_body), json.loads(new_body))
    except ValueError:
        return False


def check(verb: str) -> int:
    """Compare one verb's outputs with the golden files (in a fresh process: what a user's command starts from);
    print each file that differs, with the first differing lines."""
    import difflib

    bad = 0
    for path, text in outputs((verb,)).items():
        old = path.read_text() if path.exists() else ""
        if not _matches(old, text):
            bad += 1
            diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), "golden", "now", lineterm="", n=1))
            print(f"DIFFERS {path.name}\n" + "\n".join(diff[:12]))
    return 1 if bad else 0


if __name__ == "__main__":
    os.chdir(REPO)
    if sys.argv[1:] == ["--write"]:
        write_all()
    elif len(sys.argv) == 3 and sys.argv[1] == "--check" and sys.argv[2] in VERBS:
        sys.exit(check(sys.argv[2]))
    else:
        sys.exit(f"usage: python -m tests.golden --write | --check {{{','.join(VERBS)}}}")
