"""How long a daemon pass takes over 100 jobs / 1,000 instances when every Compute API call is slow.

    python bench/pass_time.py                          # 2 s per API request, then none (~3 minutes)
    python bench/pass_time.py --latency 2 --jobs 100 --workers 10

Each run starts the Compute API emulator as its own process on 127.0.0.1 (``--latency-s``: every request is
answered that many seconds late) and a fresh ORCHESTRATOR_HOME with its SQLite DB, records the jobs (command
jobs of ``--workers`` spot T4 workers) and runs the daemon's own tick every ``--interval`` seconds (the
daemon's: control/daemon.tick, which claims the jobs (at most driver.NEW_PER_PASS new ones a pass) and drives
each provider's jobs in a worker thread); a pass is timed from the tick's start until that worker has driven
every job once. Phases, each time-limited:

  launch    the creates are started and settled: every instance REQUESTED -> PROVISIONING
  steady    nothing to change: listing, polling, reconciling
  teardown  every job cancelled and the emulator's clock moved past the boot, so the inserts finish and the
            deletes start and settle (as far as the phase's time allows)

The VMs boot only when the teardown moves the clock, so no instance ever needs SSH: this measures the
cloud side of the pass (listing, operations, DB), which is what the API latency touches.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from sqlalchemy import func, select, update

from orchestrator.control import driver
from orchestrator.control.daemon import tick
from orchestrator.control.launcher import create_job
from orchestrator.model.spec import validate_spec
from orchestrator.model.status import FINAL_JOB
from orchestrator.providers.gce.provider import GceProvider
from orchestrator.providers.registry import backend_for
from orchestrator.store.db import open_session
from orchestrator.store.models import Instance, Job

REPO = Path(__file__).resolve().parents[1]
BOOT_S = 3600.0  # emulated: VMs stay PROVISIONING until the teardown advances the emulator's clock
PHASES = {"launch": 75.0, "steady": 20.0, "teardown": 30.0}  # seconds each phase may take at most


def spec_yaml(name: str, url: str, storage: Path, workers: int) -> str:
    return f"""name: {name}
provider: {{kind: gce, project: bench-project, zones: [us-central1-c, us-central1-a], api_endpoint: "{url}",
            ssh_source_ranges: ["127.0.0.1/32"], task_port: 0}}
storage: {storage}
training: {{job: command, command: "sleep 600", mode: sync, train_steps: 100}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: t4, count: {workers}, spot: true}}]
policy: {{on_revocation: replace, max_replacements: 0}}
pricing: {{book: 2026-11}}
"""


class Emulator:
    """The Compute API emulator in its own process (its threads never compete with the daemon's)."""

    def __init__(self, root: Path, latency_s: float) -> None:
        config = root / "emulator.json"
        config.write_text(json.dumps({"boot_delay_s": BOOT_S, "delete_delay_s": 1.0, "op_delay_s": 0.5}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator_testing.gce_emulator", "--host", "127.0.0.1", "--port", "0",
             "--config", str(config), "--latency-s", str(latency_s)],
            cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"the emulator did not start: {self.url!r}")

    def control(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}/_emulator/{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out: dict[str, Any] = json.loads(r.read() or b"{}")
            return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def stats(durations: list[float]) -> str:
    if not durations:
        return "no passes"
    a = np.array(durations)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return (f"{len(a):4d} passes  p50 {p50:6.3f}s  p95 {p95:6.3f}s  p99 {p99:6.3f}s  max {a.max():6.3f}s")


class Run:
    """One run: its emulator, its DB (in a fresh ORCHESTRATOR_HOME) and the passes' durations by phase."""

    def __init__(self, latency_s: float, interval_s: float) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="pass-time-"))
        os.environ["ORCHESTRATOR_HOME"] = str(self.home)  # read at each use: this run's DB lives here
        os.environ.pop("ORCHESTRATOR_DB_URL", None)
        self.latency_s = latency_s
        self.interval_s = interval_s
        self.emulator = Emulator(self.home, latency_s)
        self.times: dict[str, list[float]] = {phase: [] for phase in PHASES}
        self.provider: GceProvider | None = None

    def record(self, jobs: int, workers: int, threads: int) -> None:
        with open_session() as session:
            for k in range(jobs):
                text = spec_yaml(f"b{k:03d}", self.emulator.url, self.home / "runs", workers)
                spec = validate_spec(yaml.safe_load(text))
                create_job(session, spec)
        provider = backend_for(spec).provider  # every job shares it (one backend per provider settings)
        assert isinstance(provider, GceProvider)
        provider.background_threads = threads
        self.provider = provider

    @staticmethod
    def counts() -> dict[str, int]:
        with open_session() as session:
            rows = session.execute(select(Instance.status, func.count()).group_by(Instance.status)).all()
            final = session.scalar(select(func.count()).where(Job.status.in_([s.value for s in FINAL_JOB])))
        return {**{str(s): int(n) for s, n in rows}, "jobs final": int(final or 0)}

    def phase(self, name: str, done: Callable[[dict[str, int]], bool]) -> None:
        """Passes every ``interval_s`` until ``done(counts)`` or the phase's time limit."""
        deadline = time.monotonic() + PHASES[name]
        while True:
            started = time.perf_counter()
            tick("bench-daemon")  # the daemon's tick: the provider's jobs are driven in a worker thread ...
            for work in list(driver._inflight.values()):
                work.result()  # ... and the pass is over when that worker has driven them all
            self.times[name].append(time.perf_counter() - started)
            now = self.counts()
            if done(now) or time.monotonic() > deadline:
                print(f"  {name:9s} {stats(self.times[name])}   {now}", flush=True)
                return
            time.sleep(max(0.0, self.interval_s - (time.perf_counter() - started)))

    def close(self) -> None:
        if self.provider is not None:
            self.provider.close()  # queued background calls are dropped; those under way end against a live cloud
            time.sleep(self.latency_s + 1.0)
        self.emulator.stop()


def run(latency_s: float, jobs: int, workers: int, interval_s: float, threads: int) -> dict[str, list[float]]:
    bench = Run(latency_s, interval_s)
    try:
        bench.record(jobs, workers, threads)
        bench.phase("launch", lambda c: c.get("provisioning", 0) == jobs * workers)
        bench.phase("steady", lambda c: len(bench.times["steady"]) >= 20)
        with open_session() as session:
            session.execute(update(Job).values(cancel_requested=True))
        bench.emulator.control("POST", "advance", {"seconds": BOOT_S})  # the VMs boot: their inserts finish
        bench.phase("teardown", lambda c: c["jobs final"] == jobs)
        calls = bench.emulator.control("GET", "snapshot")["calls"]
        print(f"  API calls: {', '.join(f'{k} {v}' for k, v in sorted(calls.items()))}", flush=True)
    finally:
        bench.close()
    return bench.times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, nargs="*", default=[2.0, 0.0],
                        help="seconds added to every API request; one run each (default: 2 0)")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=10, help="instances per job")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds from one pass's start to the next")
    parser.add_argument("--threads", type=int, default=None,
                        help="the provider's background calls under way at once (default: 64 when the API is slow, "
                             "so 1,000 creates take a minute, else the provider's 16)")
    args = parser.parse_args()
    for latency in args.latency:
        threads = args.threads or (64 if latency >= 0.5 else 16)
        print(f"{args.jobs} jobs x {args.workers} instances, API latency {latency:g}s per request, "
              f"a pass every {args.interval:g}s, {threads} background calls at once:", flush=True)
        times = run(latency, args.jobs, args.workers, args.interval, threads)
        print(f"  all       {stats([t for ts in times.values() for t in ts])}\n", flush=True)


if __name__ == "__main__":
    main()
