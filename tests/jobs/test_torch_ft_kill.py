"""SIGKILL of one torchft replica group in the middle of an all-reduce: the survivors go on (jobs/torchjob/ft_step.py).

Three real processes (tests/jobs/ft_replica.py, gloo on CPU) train through one Lighthouse on this machine. Group 0
comes late to every gradient all-reduce, so the other two wait inside it; it is killed there. The survivors must
go on at the next step with the same processes, world 2, no committed step lost or repeated; a replacement for
group 0 then heals from a live peer (no checkpoint exists) and ends with the survivors' very weights.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchft")
from torchft.coordination import LighthouseServer  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS = 30


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _start(lighthouse: str, slot: int, out: Path, late_s: float = 0.0) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FT_LATE_S": str(late_s), "OMP_NUM_THREADS": "1",
           "FT_UNTIL_WORLD": "3"}  # the survivors train on until the replacement has joined them
    log = out.with_suffix(".log").open("wb")  # noqa: SIM115 - the child's, closed with the test's folder
    return subprocess.Popen([sys.executable, str(REPO / "tests/jobs/ft_replica.py"), lighthouse, str(slot),
                             str(slot + 1), str(STEPS), str(out)], env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait(pred: Any, timeout: float = 90.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_survivors_continue_after_a_sigkill_inside_an_allreduce(tmp_path: Path) -> None:
    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000, quorum_tick_ms=50,
                              heartbeat_timeout_ms=1000)
    lighthouse = "http://127.0.0.1:" + server.address().rsplit(":", 1)[1]
    outs = [tmp_path / f"r{s}.jsonl" for s in range(3)]
    procs = [_start(lighthouse, 0, outs[0], late_s=0.4), *(_start(lighthouse, s, outs[s]) for s in (1, 2))]
    try:
        # the victim announces it is late for step >= 5 (the survivors are inside that step's all-reduce)
        _wait(lambda: any(r.get("late", -1) >= 5 for r in _lines(outs[0])))
        time.sleep(0.2)
        procs[0].send_signal(signal.SIGKILL)
        killed = time.time()
        procs[0].wait()
        _wait(lambda: all(any(r.get("t", 0) > killed and "step" in r for r in _lines(o)) for o in outs[1:]))
        replacement = tmp_path / "r3.jsonl"
        procs.append(_start(lighthouse, 0, replacement))
        for p in procs[1:]:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            p.kill()
        server.shutdown()
    for out in outs[1:]:
        rows = [r for r in _lines(out) if "step" in r]
        assert len({r["pid"] for r in _lines(out)}) == 1  # the same process throughout
        # every step committed once, none lost (a group that joined late healed to its peers' step first)
        assert [r["step"] for r in rows] == list(range(rows[0]["step"], rows[-1]["step"] + 1))
        after = [r for r in rows if r["t"] > killed]
        assert after[0]["world"] == 2
        assert after[0]["t"] - killed < 10.0  # the survivors' pause: about the Lighthouse's heartbeat timeout
    healed = [r for r in _lines(replacement) if "step" in r]
    assert healed[0]["step"] > 1 and any(r["healed_s"] is not None for r in healed)  # from a peer, not step 0
    assert healed[-1]["w0"] == [r for r in _lines(outs[1]) if "step" in r][-1]["w0"]  # bit-identical
