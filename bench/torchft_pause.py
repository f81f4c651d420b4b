"""What a lost replica group costs the survivors under torchft (jobs/torchjob/ft_step.py), on this machine.

Three groups (tests/jobs/ft_replica.py: the tiny ResNet, gloo on CPU, one process each) train through one in-process
Lighthouse. Each round SIGKILLs one group (round r: group r % 3) at whatever point of its step it is (the kill inside
an all-reduce is tests/jobs/test_torch_ft_kill.py), then starts its replacement, which heals from a live peer.
Printed per Lighthouse heartbeat timeout: the survivors' pause from the kill to their next committed step (median,
max over survivors and rounds), the replacement's seconds from its start to its first committed step, its heal
seconds, steps lost (committed step numbers a survivor skipped or repeated), and the wall time.

    python bench/torchft_pause.py [--rounds 3] [--heartbeat-ms 1000 500]

This measures the replica-group step alone. The side-by-side with torchrun's re-rendezvous on the same local job
and the same revocation, through the controller (issue 54 item 4), is bench/torchft_vs_torchrun.py (2026-12-03,
this host: survivors' pause 1.15 s under torchft against 20.3 s under torchrun, 0 steps lost against 62).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from torchft.coordination import LighthouseServer

REPO = Path(__file__).resolve().parents[1]
REPLICA = REPO / "tests/jobs/ft_replica.py"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _start(lighthouse: str, slot: int, out: Path, stop: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "FT_UNTIL_WORLD": "3", "FT_STOP_FILE": str(stop)}
    return subprocess.Popen([sys.executable, str(REPLICA), lighthouse, str(slot), str(slot + 1), "1000000", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(pred: Any, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("the replicas stopped making progress")
        time.sleep(0.02)


def _committed_after(out: Path, t: float) -> list[dict[str, Any]]:
    return [r for r in _lines(out) if "step" in r and r["t"] > t]


def run(rounds: int, heartbeat_ms: int, tmp: Path) -> dict[str, Any]:
    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000, quorum_tick_ms=50,
                              heartbeat_timeout_ms=heartbeat_ms)
    lighthouse = "http://127.0.0.1:" + server.address().rsplit(":", 1)[1]
    stop = tmp / f"stop-{heartbeat_ms}"
    t0 = time.monotonic()
    current: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}
    outs: list[Path] = []
    pauses, starts, heals = [], [], []
    try:
        for slot in range(3):
            out = tmp / f"hb{heartbeat_ms}-g{slot}-0.jsonl"
            current[slot] = (_start(lighthouse, slot, out, stop), out)
            outs.append(out)
        _wait(lambda: all(any(r.get("world") == 3 for r in _lines(o)) for _, o in current.values()))
        for r in range(rounds):
            victim = r % 3
            proc, vout = current.pop(victim)
            proc.kill()
            proc.wait()
            killed = time.time()
            _wait(lambda: all(_committed_after(o, killed) for _, o in current.values()))
            pauses += [_committed_after(o, killed)[0]["t"] - killed for _, o in current.values()]
            out = tmp / f"hb{heartbeat_ms}-g{victim}-{r + 1}.jsonl"
            started = time.time()
            current[victim] = (_start(lighthouse, victim, out, stop), out)
            outs.append(out)
            _wait(lambda: any("step" in x for x in _lines(out)))
            first = next(x for x in _lines(out) if "step" in x)
            starts.append(first["t"] - started)
            heals += [x["healed_s"] for x in _lines(out) if x.get("healed_s") is not None][:1]
            _wait(lambda: all(any(x.get("world") == 3 and x["t"] > started for x in _lines(o))
                              for _, o in current.values()))
        stop.write_text("")
        for proc, _ in current.values():
            proc.wait(timeout=60)
    finally:
        for proc, _ in current.values():
            proc.kill()
        server.shutdown()
    lost = 0
    for out in outs:
        steps = [x["step"] for x in _lines(out) if "step" in x]
        lost += sum(1 for a, b in zip(steps, steps[1:], strict=False) if b != a + 1)
    return {"heartbeat_ms": heartbeat_ms, "pause_median_s": statistics.median(pauses), "pause_max_s": max(pauses),
            "replacement_first_step_s": statistics.median(starts),
            "heal_s": statistics.median(heals) if heals else None,
            "steps_lost": lost, "wall_s": time.monotonic() - t0, "kills": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heartbeat-ms", type=int, nargs="+", default=[1000, 500])
    args = parser.parse_args()
    rows = []
    with TemporaryDirectory() as tmp:
        for hb in args.heartbeat_ms:
            rows.append(run(args.rounds, hb, Path(tmp)))
    print(f"{'heartbeat ms':>12} {'kills':>5} {'pause median s':>14} {'pause max s':>11} {'replacement s':>13} "
          f"{'heal s':>7} {'steps lost':>10} {'wall s':>7}")
    for r in rows:
        heal = f"{r['heal_s']:.3f}" if r["heal_s"] is not None else "-"
        print(f"{r['heartbeat_ms']:>12} {r['kills']:>5} {r['pause_median_s']:>14.3f} {r['pause_max_s']:>11.3f} "
              f"{r['replacement_first_step_s']:>13.2f} {heal:>7} {r['steps_lost']:>10} {r['wall_s']:>7.1f}")


if __name__ == "__main__":
    main()
