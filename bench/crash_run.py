"""Crash run on PostgreSQL: one daemon drives local jobs and is `kill -9`ed at random moments (default 20
times; restarted at once each time) while jobs keep arriving and spot workers are revoked and replaced; then
every job is let finish.

A kill from outside at a random moment mostly finds the daemon waiting for its next pass, so most of the
daemon's starts (``--inside``) are armed as well: the daemon runs under a line counter of the bench (not of
the product) that SIGKILLs it before a random line (1..``--lines``) of the cloud calls' own functions
(operations' insert, resend and delete; the local provider's create and delete; the hypervisor's spawn),
counted from its start: often the resend of what the previous kill cut short (a crash loop). Where each of
those kills landed is printed.

Truth comes from outside the controller: the emulated cloud's own record of each instance (created_at, and
killed_at / deleted_at, written by the local provider in ``<home>/local``, also for deleted ones) and the
process table. Prints:

- orphan processes: hypervisors or job processes alive after the end whose instance is gone (goal 0),
  at the end and after a grace of a few hypervisor watch periods; and instances still there;
- per instance, the ledger's start-to-end minus the provider's (created_at to its preemption's hard off or
  deletion): max |difference| (goal <= 1 s), the sum, how many differ by more than 1 s; the same for the
  start and the end alone; instances billed that the provider never made, and made that were never billed;
- jobs finished, kills, instances.

    python bench/crash_run.py [--jobs 12] [--kills 20] [--inside 0.75] [--lines 40] [--seed 0]

The daemon's orphan sweep is off (``--gc-every 3600``): what is counted is what the daemon's own deletes
left. Needs the PostgreSQL server of the tests (ORCHESTRATOR_TEST_PG, default postgres@127.0.0.1:5432/test);
a fresh database per run, dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text

from orchestrator_testing.teardown import Children, stopped_cleanly

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("ORCHESTRATOR_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
ACTIVE = ("pending", "provisioning", "running", "recovering", "tearing_down")
HOST = "orchestrator.providers.local.host"

# The daemon, SIGKILLed by itself before the CRASH_RUN_KILL_AT-th line it runs in the cloud calls' own functions
# (none: 0); where, is appended to CRASH_RUN_KILLS.
ARMED = r"""
import itertools, os, runpy, signal, sys
at = int(os.environ.pop("CRASH_RUN_KILL_AT", "0"))
if at:
    from orchestrator.control import operations
    from orchestrator.providers.local import provider
    from orchestrator.transport import local
    calls = ("_insert", "_resend", "delete")
    codes = {getattr(operations, n).__code__ for n in calls} | {provider.LocalProvider.create.__code__,
             provider.LocalProvider.delete.__code__, local.spawn_detached.__code__}
    lines = itertools.count(1)

    def line(frame, event, arg):
        if event == "line" and next(lines) >= at:
            with open(os.environ["CRASH_RUN_KILLS"], "a") as fh:
                fh.write(f"{frame.f_code.co_name}:{frame.f_lineno}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return line

    def trace(frame, event, arg):
        return line if frame.f_code in codes else None

    def armed(call):
        def counted(*args, **kwargs):
            previous = sys.gettrace()
            sys.settrace(trace)  # this thread, this call and what it calls
            try:
                return call(*args, **kwargs)
            finally:
                sys.settrace(previous)
        return counted

    for name in calls:
        setattr(operations, name, armed(getattr(operations, name)))
sys.argv = ["orchestrator", *sys.argv[1:]]
runpy.run_module("orchestrator.cli.main", run_name="__main__", alter_sys=True)
"""


class CrashedDaemon:
    """The one daemon, restarted after each kill; each start armed (see ARMED) with probability ``inside``."""

    def __init__(self, env: dict[str, str], interval: float, logs: Path, rng: random.Random, inside: float,
                 lines: int) -> None:
        self.env, self.interval, self.logs = env, interval, logs
        self.rng, self.inside, self.lines = rng, inside, lines
        self.proc: subprocess.Popen[bytes] | None = None
        self.armed = 0
        self.last_armed = False
        self.start()

    def start(self) -> None:
        at = self.rng.randint(1, self.lines) if self.rng.random() < self.inside else 0
        self.armed += bool(at)
        self.last_armed = bool(at)
        log = (self.logs / "daemon.log").open("ab")
        self.proc = subprocess.Popen(  # a session of its own: a signal to the bench's group is ours to relay
            [sys.executable, "-c", ARMED, "daemon", "--interval", str(self.interval), "--gc-every", "3600"],
            env={**self.env, "ORCHESTRATOR_DAEMON_ID": "daemon-crash-run", "CRASH_RUN_KILL_AT": str(at),
                 "CRASH_RUN_KILLS": str(self.logs / "kills.txt")}, cwd=REPO,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def died(self) -> bool:
        """It killed itself (an armed start): counted as a kill, restarted."""
        if self.proc is None or self.proc.poll() is None:
            return False
        self.proc = None
        return True

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def spec_text(name: str, storage: Path, seconds: float, revoke_at_s: float) -> str:
    # One spot worker revoked (at_s after the job starts) and replaced: every job creates twice and deletes twice.
    return f"""name: {name}
provider:
  kind: local
  time_scale: 600
  revocations: schedule
  emulation_k80_step_s: 0
  schedule: [{{instance: worker-0, at_s: {revoke_at_s:.1f}}}]
storage: {storage}
training: {{job: command, command: "sleep {seconds}", mode: sync, train_steps: 10}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: k80, count: 1, spot: true}}]
policy: {{on_revocation: replace, max_replacements: 3, deadline: 30m}}
pricing: {{book: 2019-02}}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--inside", type=float, default=0.75, help="share of the daemon's starts armed to die in a call")
    ap.add_argument("--lines", type=int, default=40, help="an armed start dies at a line drawn from 1..LINES")
    ap.add_argument("--job-seconds", type=float, default=12.0, help="each job's command sleeps this long")
    ap.add_argument("--revoke-at", type=float, default=5.0, help="the spot worker's revocation, s after the start")
    ap.add_argument("--gap", type=float, nargs=2, default=(1.0, 5.0), metavar=("MIN", "MAX"),
                    help="seconds from a (re)start to the next kill -9, drawn uniformly")
    ap.add_argument("--interval", type=float, default=0.5, help="the daemon's pass interval")
    ap.add_argument("--grace", type=float, default=3.0, help="seconds after the end before orphans are counted again")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    db_name = f"orch_crash_run_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{db_name}"'))
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{db_name}"
    work = Path(tempfile.mkdtemp(prefix="crash-run-"))
    env = {**os.environ, "ORCHESTRATOR_HOME": str(work / "home"), "ORCHESTRATOR_DB_URL": url}
    os.environ.update({k: env[k] for k in ("ORCHESTRATOR_HOME", "ORCHESTRATOR_DB_URL")})
    from orchestrator.model.paths import user_dir
    from orchestrator.store.db import get_engine, open_session

    user_dir()
    with open_session():
        pass  # the schema, before the first daemon starts
    engine = create_engine(url)
    rng = random.Random(args.seed)
    daemons = CrashedDaemon({**env, "PYTHONPATH": str(REPO)}, args.interval, work, rng, args.inside, args.lines)
    try:
        with stopped_cleanly(Children(), work / "home", before=daemons.stop):
            run(args, rng, engine, daemons, work)
    finally:
        engine.dispose()
        get_engine(url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
    return 0


def _submit(k: int, work: Path, args: argparse.Namespace) -> str:
    import yaml

    from orchestrator.control.launcher import create_job
    from orchestrator.model.spec import validate_spec
    from orchestrator.store.db import open_session

    with open_session() as session:
        spec = validate_spec(yaml.safe_load(spec_text(f"crash{k}", work / "runs", args.job_seconds, args.revoke_at)))
        return create_job(session, spec).id


def run(args: argparse.Namespace, rng: random.Random, engine: Engine, daemons: CrashedDaemon, work: Path) -> None:
    print(f"{args.jobs} jobs arriving over the kills, 1 daemon (pass every {args.interval}s); {args.kills} kill -9: "
          f"from outside {args.gap[0]:g}-{args.gap[1]:g} s after each (re)start, or by itself in a cloud call "
          f"({args.inside:.0%} of starts armed); work dir {work}", flush=True)
    started = time.time()
    kills = inside = 0
    arrivals = sorted(rng.uniform(0, args.kills * sum(args.gap) / 2 * 0.8) for _ in range(args.jobs))
    ids: list[str] = []
    next_kill = started + rng.uniform(*args.gap)
    try:
        while time.time() - started < args.timeout:
            now = time.time()
            while arrivals and now - started >= arrivals[0]:
                arrivals.pop(0)
                ids.append(_submit(len(ids), work, args))
            died = daemons.died()
            if died or (kills < args.kills and now >= next_kill):
                if not died:
                    daemons.kill()
                kills += 1
                inside += died
                if kills >= args.kills:
                    daemons.inside = 0.0  # the last start runs to the end
                daemons.start()
                # an armed start is given time to reach a cloud call (killed from outside if it does not)
                next_kill = time.time() + rng.uniform(*args.gap) * (4 if daemons.last_armed else 1)
            elif kills >= args.kills and not arrivals:
                with engine.connect() as conn:
                    statuses = [r[0] for r in conn.execute(text("SELECT status FROM jobs"))]
                if all(s not in ACTIVE for s in statuses):
                    break
            time.sleep(0.02)
        elapsed = time.time() - started
    finally:
        daemons.stop()
    where = Counter((work / "kills.txt").read_text().split()) if (work / "kills.txt").exists() else Counter()
    print(f"kills: {kills} ({inside} by an armed daemon in a cloud call, {kills - inside} from outside); in the "
          f"calls, before: {', '.join(f'{k} x{n}' for k, n in sorted(where.items()))}")
    report(engine, work / "home", ids, kills, elapsed, args.grace)


def _records(home: Path) -> dict[str, dict[str, Any]]:
    """The emulated cloud's own record of each instance: a live one's state, else its tombstone."""
    out: dict[str, dict[str, Any]] = {}
    for path in [*(home / "local" / "deleted").glob("*.json"), *(home / "local" / "instances").glob("*/instance.json")]:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out.setdefault(record["name"], record)
    return out


def _processes(home: Path) -> tuple[list[str], list[str]]:
    """Live processes of the local provider under ``home``: (of an instance that is gone, of one still there)."""
    root = str(home / "local")
    gone: list[str] = []
    there: list[str] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cwd = os.readlink(proc / "cwd")
            argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0")[:-1]]
        except (OSError, IndexError):
            continue
        folder = argv[3] if len(argv) == 4 and argv[1:3] == ["-m", HOST] else cwd.removesuffix(" (deleted)")
        if not folder.startswith(root + "/"):
            continue
        parts = Path(folder).relative_to(root).parts
        name = parts[1] if len(parts) > 1 and parts[0] == "instances" else None
        alive = name is not None and (Path(root) / "instances" / name / "instance.json").exists()
        line = f"{proc.name} ({name or folder}): {' '.join(argv)[:100]}"
        (there if alive else gone).append(line)
    return gone, there


def _spread(diffs: list[float]) -> str:
    if not diffs:
        return "none"
    worst = max(diffs, key=abs)
    over = sum(abs(d) > 1 for d in diffs)
    return f"max |d| {abs(worst):.3f} s ({worst:+.3f}), sum {sum(diffs):+.3f} s, {over} over 1 s"


def report(engine: Engine, home: Path, ids: list[str], kills: int, elapsed: float, grace: float) -> None:
    with engine.connect() as conn:
        statuses = Counter(r[0] for r in conn.execute(text("SELECT status FROM jobs")))
        rows = conn.execute(text("SELECT i.name, i.status, i.end_reason, l.start_at, l.end_at, l.seconds "
                                 "FROM instances i LEFT JOIN ledger l ON l.instance_id = i.id")).all()
    gone, there = _processes(home)
    time.sleep(grace)  # not a pass/fail: a hypervisor that saw its folder go ends within its watch period
    gone_later, there_later = _processes(home)
    records = _records(home)
    starts, ends, lives = [], [], []
    billed_never_made, made_never_billed = [], []
    for name, status, _end_reason, start_at, end_at, seconds in rows:
        record = records.get(name)
        if record is None:
            if seconds:
                billed_never_made.append(f"{name} ({status}, {seconds:.2f} s)")
            continue
        if start_at is None:
            made_never_billed.append(f"{name} ({status})")
            continue
        stops = [float(record[k]) for k in ("killed_at", "deleted_at") if record.get(k) is not None]
        end = min(stops, default=None)  # a preemption's hard off comes before the delete
        if end is None:
            made_never_billed.append(f"{name} ({status}: still there)")
            continue
        starts.append(start_at - float(record["created_at"]))
        ends.append(end_at - end)
        lives.append(seconds - (end - float(record["created_at"])))
    print(f"\nran {elapsed:.0f}s, {kills} kill -9; jobs: {statuses.get('succeeded', 0)}/{len(ids)} succeeded "
          f"({dict(statuses)}); instances: {len(rows)} in the DB, {len(records)} made by the provider")
    print(f"orphan processes (instance gone): {len(gone)} at the end, {len(gone_later)} after {grace:g} s; "
          f"processes of instances still there: {len(there)} / {len(there_later)}; instances still there: "
          f"{sum(1 for r in records.values() if 'deleted_at' not in r)}")
    for line in gone_later + there_later:
        print(f"  {line}")
    print(f"ledger start-to-end minus the provider's, per instance ({len(lives)}): {_spread(lives)}")
    print(f"  start (ledger - provider's created_at): {_spread(starts)}")
    print(f"  end (ledger - provider's hard off or deletion): {_spread(ends)}")
    print(f"billed, never made by the provider: {len(billed_never_made)} {billed_never_made[:5]}; made, never "
          f"billed: {len(made_never_billed)} {made_never_billed[:5]}")


if __name__ == "__main__":
    sys.exit(main())
