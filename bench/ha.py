"""High availability on PostgreSQL: 3 daemons share 30+ local jobs while a random daemon is `kill -9`ed
every N seconds (and restarted later), until every job has ended.

Truth comes from outside the controller: the local provider's own records (each instance's create and
delete times, written by the emulated cloud, in ``<home>/local``) and the daemons' processes, not from
the ledger being checked. Prints:

- takeover time after each kill: until every job the killed daemon held is leased again (renewed by
  another daemon, or by the restarted one) or has ended; goal <= lease TTL + one pass;
- instances created twice: provider-side instances per job slot beyond one (goal 0);
- ledger minus instance-seconds x price (from the provider's records; goal 0);
- jobs finished.

    python bench/ha.py [--jobs 32] [--job-seconds 40] [--kill-every 12] [--restart-after 25] [--interval 1]

Needs the PostgreSQL server of the tests (ORCHESTRATOR_TEST_PG, default postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from sqlalchemy import Engine, create_engine, text

from orchestrator_testing.teardown import Children, stopped_cleanly

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("ORCHESTRATOR_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
ACTIVE = ("pending", "provisioning", "running", "recovering", "tearing_down")


def spec_text(name: str, storage: Path, seconds: float) -> str:
    return f"""name: {name}
provider: {{kind: local, time_scale: 600, revocations: none, emulation_k80_step_s: 0}}
storage: {storage}
training: {{job: command, command: "sleep {seconds}", mode: sync, train_steps: 10}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: k80, count: 1, spot: false}}]
policy: {{on_revocation: replace, max_replacements: 2, deadline: 30m}}
pricing: {{book: 2019-02}}
"""


class Daemons:
    def __init__(self, n: int, env: dict[str, str], interval: float, logs: Path) -> None:
        self.env, self.interval, self.logs = env, interval, logs
        self.procs: dict[int, subprocess.Popen[bytes] | None] = {k: None for k in range(n)}
        for k in range(n):
            self.start(k)

    def owner(self, k: int) -> str:
        return f"daemon-ha-{k}"

    def start(self, k: int) -> None:
        log = (self.logs / f"daemon-{k}.log").open("ab")
        self.procs[k] = subprocess.Popen(  # a session of its own: a signal to the bench's group is ours to relay
            [sys.executable, "-m", "orchestrator.cli.main", "daemon", "--interval", str(self.interval),
             "--gc-every", "3600"], env={**self.env, "ORCHESTRATOR_DAEMON_ID": self.owner(k)}, cwd=REPO,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> list[int]:
        return [k for k, p in self.procs.items() if p is not None and p.poll() is None]

    def kill(self, k: int) -> None:
        proc = self.procs[k]
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.procs[k] = None

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            if proc is not None:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=32)
    ap.add_argument("--job-seconds", type=float, default=40.0, help="each job's command sleeps this long")
    ap.add_argument("--daemons", type=int, default=3)
    ap.add_argument("--kill-every", type=float, default=12.0)
    ap.add_argument("--restart-after", type=float, default=25.0, help="longer than the lease: others take over")
    ap.add_argument("--interval", type=float, default=1.0, help="each daemon's pass interval")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    db_name = f"orch_ha_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{db_name}"'))
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{db_name}"
    work = Path(tempfile.mkdtemp(prefix="ha-bench-"))
    env = {**os.environ, "ORCHESTRATOR_HOME": str(work / "home"), "ORCHESTRATOR_DB_URL": url}
    os.environ.update({k: env[k] for k in ("ORCHESTRATOR_HOME", "ORCHESTRATOR_DB_URL")})
    import yaml

    from orchestrator.control.launcher import create_job
    from orchestrator.control.lease import LEASE_S
    from orchestrator.model.paths import user_dir
    from orchestrator.model.spec import validate_spec
    from orchestrator.store.db import open_session

    user_dir()
    with open_session() as session:
        ids = [create_job(session, validate_spec(yaml.safe_load(spec_text(f"ha{i}", work / "runs",
                                                                           args.job_seconds)))).id
               for i in range(args.jobs)]
    engine = create_engine(url)
    daemons = Daemons(args.daemons, env, args.interval, work)
    try:
        # kill -TERM / timeout / Ctrl-C: daemons stopped, every instance they left deleted, DB dropped, exit 143.
        with stopped_cleanly(Children(), work / "home", before=daemons.stop):
            run(args, rng, engine, daemons, work, ids, LEASE_S)
    finally:
        engine.dispose()
        from orchestrator.store.db import get_engine

        get_engine(url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
    return 0


def run(args: argparse.Namespace, rng: random.Random, engine: Engine, daemons: Daemons, work: Path,
        ids: list[str], lease_s: float) -> None:
    print(f"{args.jobs} jobs, {args.daemons} daemons (pass every {args.interval}s, lease {lease_s:.0f}s); kill -9 "
          f"a random daemon every {args.kill_every}s, restarted {args.restart_after}s later; work dir {work}")
    takeovers: list[float] = []
    pending: list[tuple[float, str, dict[str, float]]] = []  # kill time, owner, job -> lease_until then
    restarts: list[tuple[float, int]] = []
    started = time.time()
    next_kill = started + args.kill_every
    try:
        while time.time() - started < args.timeout:
            now = time.time()
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT id, status, lease_owner, lease_until FROM jobs")).all()
            by_id = {r[0]: r for r in rows}
            if all(r[1] not in ACTIVE for r in rows):
                break
            for item in list(pending):
                killed_at, owner, held = item
                if all(by_id[j][1] not in ACTIVE or by_id[j][2] != owner or (by_id[j][3] or 0) > until
                       for j, until in held.items()):
                    takeovers.append(now - killed_at)
                    pending.remove(item)
            for at, k in list(restarts):
                if now >= at:
                    daemons.start(k)
                    restarts.remove((at, k))
            alive = daemons.running()
            if now >= next_kill and len(alive) >= 2:
                k = rng.choice(alive)
                owner = daemons.owner(k)
                held = {r[0]: r[3] or 0.0 for r in rows if r[2] == owner and r[1] in ACTIVE}
                daemons.kill(k)
                pending.append((time.time(), owner, held))
                restarts.append((time.time() + args.restart_after, k))
                print(f"t={now - started:6.1f}s kill -9 {owner} (holding {len(held)} jobs)", flush=True)
                next_kill = now + args.kill_every
            time.sleep(0.1)
        elapsed = time.time() - started
    finally:
        daemons.stop()
    report(engine, work, ids, takeovers, pending, elapsed, lease_s, args.interval)


def _provider_records(home: Path) -> list[dict[str, object]]:
    """The emulated cloud's own records: deleted instances' tombstones and any instance still there."""
    out = []
    for path in [*(home / "local" / "deleted").glob("*.json"), *(home / "local" / "instances").glob("*/instance.json")]:
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def report(engine: object, work: Path, ids: list[str], takeovers: list[float], pending: list[object],
           elapsed: float, lease_s: float, interval: float) -> None:
    assert isinstance(engine, Engine)
    with engine.connect() as conn:
        statuses = Counter(r[0] for r in conn.execute(text("SELECT status FROM jobs")))
        prices = {r[0]: r[1] for r in conn.execute(text("SELECT name, price_per_hour FROM instances"))}
        ledger_usd = float(conn.execute(text("SELECT COALESCE(SUM(usd), 0) FROM ledger")).scalar() or 0.0)
        ledger_s = float(conn.execute(text("SELECT COALESCE(SUM(seconds), 0) FROM ledger")).scalar() or 0.0)
    records = _provider_records(work / "home")
    slots = Counter((r["labels"]["orch-job"], r["role"], r["index"]) for r in records)  # type: ignore[index]
    twice = sum(n - 1 for n in slots.values() if n > 1)
    live = [r["name"] for r in records if "deleted_at" not in r]
    truth_s = sum(float(r["deleted_at"]) - float(r["created_at"]) for r in records  # type: ignore[arg-type]
                  if "deleted_at" in r)
    truth_usd = sum((float(r["deleted_at"]) - float(r["created_at"])) * prices.get(str(r["name"]), 0.0)  # type: ignore[arg-type]
                    / 3600 for r in records if "deleted_at" in r)
    print(f"\nran {elapsed:.0f}s; jobs finished: {statuses.get('succeeded', 0)}/{len(ids)} succeeded "
          f"({dict(statuses)})")
    if takeovers:
        print(f"takeover after kill -9: {len(takeovers)} kills, mean {statistics.mean(takeovers):.1f}s, "
              f"max {max(takeovers):.1f}s (goal <= lease {lease_s:.0f}s + one pass {interval:.1f}s); "
              f"still pending at the end: {len(pending)}")
    print(f"instances created twice (provider-side, per job slot beyond one): {twice}; provider instances "
          f"{len(records)}, DB instances {len(prices)}, left running: {len(live)}")
    print(f"ledger minus instance-seconds x price (provider's create..delete times): "
          f"${ledger_usd - truth_usd:+.6f} ({ledger_s - truth_s:+.2f} instance-seconds over {len(records)} "
          f"instances; ledger ${ledger_usd:.6f})")


if __name__ == "__main__":
    sys.exit(main())
