"""Revocation detection latency and recovery time (real TensorFlow training).

Runs one job with 1 PS + chief + 2 spot K80 workers and injected revocations (default 12), then prints,
per revocation and as median / max:
  detection: notice -> REVOKED event row, and kill -> REVOKED event row (negative: seen in the notice window)
  recovery:  -> replacement task started, and -> replacement worker stepping again

``--provider local`` (default): the local provider's revocation schedule; a revocation's notice and kill
times come from its tombstone. Recovery is measured from the kill.

``--provider gce``: the job runs with provider gce against an ``EmulatedCloud`` (Compute API emulator,
sshd, GCS emulator); every ``--gap`` seconds a spot worker that is training is preempted with
``cloud.compute.preempt``. Boots take ``--boot-delay`` emulated seconds (GCE measured: ~70 s) and
GCE's 30 s notice window is kept, both divided by ``--time-scale``. The preemption is the notice;
the kill is when the VM's processes died (the hard off). Recovery is measured from the preemption.

"Stepping" is read from the chief's metrics.jsonl: the first window that starts after the kill
(``t - window_s >= kill``) with steps > 0 for the slot's worker index; a window straddling the kill
would credit the dead instance's steps to its replacement.
Targets (issue 3): detection <= 1 s, recovery <= 10 s (local).

    python bench/recovery.py [--revocations 12] [--poll 0.5]
    python bench/recovery.py --provider gce --revocations 4 [--boot-delay 70 --time-scale 20]

Stopped with SIGTERM (`kill`, `timeout`) or Ctrl-C, it tears its job down (no instance left) and exits 143 / 130.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text

from orchestrator_testing.teardown import Children, stopped_cleanly

REPO = Path(__file__).resolve().parent.parent
GCE_NOTICE_WINDOW_S = 30.0  # soft off -> hard off after a preemption


@dataclass(frozen=True)
class Revocation:
    instance: str
    notice: float
    killed: float
    event: float  # the REVOKED event row
    task: float | None  # the replacement's task started
    stepping: float | None  # end of the first metrics window after the kill in which its worker stepped


def spec_text(storage: Path, revocations: int, gap_s: float, first_s: float) -> str:
    entries = []
    for k in range(revocations):
        slot = f"worker-{k % 2}"
        entries.append(f"    - {{instance: {slot}, at_s: {first_s + k * gap_s:.1f}}}")
    steps = int((first_s + revocations * gap_s + 20) * 12)
    return f"""name: bench-recovery
provider:
  kind: local
  time_scale: 60
  revocations: schedule
  emulation_k80_step_s: 0.1
  schedule:
{chr(10).join(entries)}
storage: {storage}
training: {{job: resnet-cifar, hparam_set: resnet_tiny, train_steps: {steps}, batch_per_worker: 32,
            checkpoint_every: 200, log_every: 5}}
cluster:
  parameter_servers: {{count: 1}}
  workers: [{{gpu: k80, count: 2, spot: true}}]
policy: {{on_revocation: replace, max_replacements: {revocations + 2}, deadline: 30m}}
pricing: {{book: 2019-02}}
"""


def gce_spec_text(url: str, storage: str, revocations: int) -> str:
    from orchestrator_testing.cloud import provider_yaml  # the emulator's VMs are this machine

    zone = "us-central1-c"
    return f"""name: bench-recovery
provider: {{kind: gce, project: bench-project, zones: [{zone}], {provider_yaml(url)}}}
storage: {storage}
training: {{job: resnet-cifar, hparam_set: resnet_tiny, train_steps: 1000000, batch_per_worker: 32,
            checkpoint_every: 200, log_every: 5}}
cluster:
  parameter_servers: {{count: 1, machine_type: n1-standard-4, zone: {zone}}}
  chief: {{machine_type: n1-standard-4, zone: {zone}}}
  workers: [{{gpu: k80, count: 2, spot: true, zone: {zone}}}]
policy: {{on_revocation: replace, max_replacements: {revocations + 2}, deadline: 30m}}
pricing: {{book: 2019-02}}
"""


def stepping_after(metrics_text: str, worker: int, kill: float) -> float | None:
    """End of the first window that starts at or after ``kill`` in which ``worker`` made steps."""
    for line in metrics_text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("kind") != "step" or "window_s" not in rec:
            continue
        t = float(rec["t"])
        steps = ((rec.get("workers") or {}).get(str(worker)) or {}).get("steps") or 0
        if t - float(rec["window_s"]) >= kill and steps > 0:
            return t
    return None


def db_rows(engine: Engine) -> tuple[str, list[Mapping[str, Any]], dict[int, float]]:
    with engine.connect() as conn:
        job_id = str(conn.execute(text("SELECT id FROM jobs")).scalar())
        insts: list[Mapping[str, Any]] = [dict(r) for r in conn.execute(text(
            "SELECT id, name, role, slot_index, generation, training_at FROM instances "
            "ORDER BY slot_index, generation")).mappings()]
        revoked = {int(r[0]): float(r[1]) for r in conn.execute(text(
            "SELECT instance_id, MIN(at) FROM events WHERE to_status = 'revoked' "
            "GROUP BY instance_id")).all()}
    return job_id, insts, revoked


def measure(insts: Sequence[Mapping[str, Any]], revoked: Mapping[int, float],
            times: Mapping[str, tuple[float | None, float | None]], metrics_text: str) -> list[Revocation]:
    """``times``: instance -> (notice / preemption time, kill time)."""
    rows = []
    for inst in insts:
        if inst["id"] not in revoked:
            continue
        notice, killed = times.get(inst["name"], (None, None))
        if notice is None or killed is None:
            continue
        nxt = next((i for i in insts if i["role"] == inst["role"] and i["slot_index"] == inst["slot_index"]
                    and i["generation"] == inst["generation"] + 1), None)
        task = None if nxt is None else nxt["training_at"]
        rows.append(Revocation(inst["name"], notice, killed, revoked[inst["id"]], task,
                               stepping_after(metrics_text, inst["slot_index"], killed)))
    return rows


def _delta(end: float | None, start: float) -> float | None:
    return None if end is None else end - start


def report(rows: list[Revocation], *, gce: bool) -> None:
    # Local: recovery from the kill (the notice window is part of the schedule). GCE: from the preemption,
    # since the replacement is created as soon as the notice is seen, during the 30 s window.
    notice = "preempt" if gce else "notice"
    origin = notice if gce else "kill"

    def since(r: Revocation) -> float:
        return r.notice if gce else r.killed

    cols: list[tuple[str, str, float, Callable[[Revocation], float | None]]] = [
        (f"{notice}->event", f"detection ({notice} -> event row)", 1.0, lambda r: r.event - r.notice),
        ("kill->event", "detection (kill -> event row)", 1.0, lambda r: r.event - r.killed),
        (f"{origin}->task", f"recovery ({origin} -> replacement task started)", 10.0,
         lambda r: _delta(r.task, since(r))),
        (f"{origin}->stepping", f"recovery ({origin} -> replacement stepping)", 10.0,
         lambda r: _delta(r.stepping, since(r))),
    ]
    if gce:
        cols.append(("kill->stepping", "recovery (kill -> replacement stepping)", 10.0,
                     lambda r: _delta(r.stepping, r.killed)))
    print(f"{'instance':36} " + " ".join(f"{c[0]:>16}" for c in cols))
    for r in rows:
        vals = [c[3](r) for c in cols]
        print(f"{r.instance:36} " + " ".join(f"{'n/a' if v is None else f'{v:.2f}':>16}" for v in vals))
    for _, label, target, value in cols:
        present = [v for v in map(value, rows) if v is not None]
        if present:
            print(f"{label:52} median {statistics.median(present):6.2f}s  max {max(present):6.2f}s  "
                  f"(target <= {target}s)")
    print(json.dumps({"revocations": len(rows)}))


def run_local(args: argparse.Namespace, tmp: Path, children: Children) -> None:
    env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp}/r.db"}
    spec = tmp / "job.yaml"
    spec.write_text(spec_text(tmp / "runs", args.revocations, args.gap, first_s=35.0))
    t0 = time.time()
    out = children.run([sys.executable, "-m", "orchestrator.cli.main", "launch", str(spec), "--quiet",
                        "--poll", str(args.poll)], env=env, cwd=REPO)
    if out.returncode != 0:
        sys.exit(f"job failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    from orchestrator.providers.local.provider import LocalProvider
    from orchestrator.storage import open_storage
    from orchestrator.storage.base import METRICS

    cloud = LocalProvider(tmp / "home" / "local")
    engine = create_engine(env["ORCHESTRATOR_DB_URL"])
    job_id, insts, revoked = db_rows(engine)
    times: dict[str, tuple[float | None, float | None]] = {}
    for inst in insts:
        hist = cloud.history(inst["name"]) or {}
        times[inst["name"]] = (hist.get("notice_at"), hist.get("killed_at"))
    metrics = open_storage(str(tmp / "runs"), job_id).read_text(METRICS) or ""
    rows = measure(insts, revoked, times, metrics)
    with engine.connect() as conn:
        status = conn.execute(text("SELECT status, accuracy, wall_time_s FROM job_summary")).one()
    print(f"job: {status[0]}, accuracy {status[1]}, wall {status[2]:.0f}s (bench {time.time() - t0:.0f}s); "
          f"{len(rows)} revocations measured, controller pass every {args.poll}s")
    report(rows, gce=False)


def run_gce(args: argparse.Namespace, tmp: Path, children: Children) -> None:
    from orchestrator.storage import open_storage
    from orchestrator.storage.base import METRICS
    from orchestrator_testing.cloud import EmulatedCloud
    from orchestrator_testing.gce_emulator_model import ApiError

    config = {"boot_delay_s": args.boot_delay, "time_scale": args.time_scale}
    with EmulatedCloud(tmp / "cloud", config=config, notice_window_s=GCE_NOTICE_WINDOW_S) as cloud:
        assert cloud.compute is not None
        db_url = f"sqlite:///{tmp}/r.db"
        env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp / "home"), "ORCHESTRATOR_DB_URL": db_url}
        storage_uri = cloud.gcs.uri("runs")
        spec = tmp / "job.yaml"
        spec.write_text(gce_spec_text(cloud.url, storage_uri, args.revocations))
        t0 = time.time()
        log = (tmp / "launch.log").open("w")
        argv = [sys.executable, "-m", "orchestrator.cli.main", "launch", str(spec), "--quiet",
                "--poll", str(args.poll)]
        proc = children.popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        engine = create_engine(db_url)

        def scalar(sql: str) -> Any:
            try:
                with engine.connect() as conn:
                    return conn.execute(text(sql)).scalar()
            except Exception:  # the DB appears with the launch
                return None

        def wait(what: str, predicate: Any, timeout: float) -> bool:
            deadline = time.time() + timeout
            while time.time() < deadline:
                if proc.poll() is not None:
                    sys.exit(f"the launch exited ({proc.returncode}) waiting for {what}; see {log.name}")
                if predicate():
                    return True
                time.sleep(0.25)
            print(f"gave up waiting for {what} after {timeout:.0f}s", file=sys.stderr)
            return False

        try:
            if not wait("training", lambda: (scalar("SELECT final_step FROM jobs") or 0) >= 20, 600):
                sys.exit(f"no training; see {log.name}")
            print(f"training after {time.time() - t0:.0f}s; a spot worker preempted every >= {args.gap:.0f}s")
            job_id = str(scalar("SELECT id FROM jobs"))
            storage = open_storage(storage_uri, job_id)
            last = 0.0
            victims: list[tuple[str, int]] = []
            for k in range(args.revocations):
                index = k % 2
                query = (f"SELECT name FROM instances WHERE role = 'worker' AND slot_index = {index} "
                         "AND status = 'training'")
                if not wait(f"worker {index} training", lambda q=query: scalar(q) is not None, 300):
                    break
                time.sleep(max(0.0, last + args.gap - time.time()))
                name = str(scalar(query))
                try:
                    cloud.compute.preempt(name)
                except ApiError as exc:  # not RUNNING any more (e.g. being replaced): next round
                    print(f"could not preempt {name}: {exc.message}", file=sys.stderr)
                    continue
                last = time.time()
                victims.append((name, index))
                print(f"{last - t0:7.1f}s preempted {name}")
            if victims:  # let the last replacement step before ending the job
                name, index = victims[-1]
                wait(f"{name}'s replacement stepping", lambda: name in cloud.killed_at and stepping_after(
                    storage.read_text(METRICS) or "", index, cloud.killed_at[name]) is not None, 300)
            with engine.begin() as conn:
                conn.execute(text("UPDATE jobs SET cancel_requested = 1"))
            proc.wait(timeout=300)
        finally:
            children.stop()  # SIGTERM: the launch tears its VMs down while the emulated cloud is still up
            log.close()
        job_id, insts, revoked = db_rows(engine)
        metrics = open_storage(storage_uri, job_id).read_text(METRICS) or ""
        times: dict[str, tuple[float | None, float | None]] = {
            name: (cloud.preempted_at.get(name), cloud.killed_at.get(name)) for name, _ in victims}
        rows = measure(insts, revoked, times, metrics)
    with engine.connect() as conn:
        status = conn.execute(text("SELECT status, wall_time_s FROM job_summary")).one()
    scale = args.time_scale
    print(f"job: {status[0]} (cancelled once measured), wall {status[1]:.0f}s "
          f"(bench {time.time() - t0:.0f}s); {len(rows)} of {len(victims)} preemptions measured; "
          f"boot {args.boot_delay:.0f}s and notice window "
          f"{GCE_NOTICE_WINDOW_S:.0f}s emulated at x{scale:g} ({args.boot_delay / scale:.2f}s, "
          f"{GCE_NOTICE_WINDOW_S / scale:.2f}s real); controller pass every {args.poll}s")
    report(rows, gce=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--provider", choices=["local", "gce"], default="local")
    ap.add_argument("--revocations", type=int, default=12)
    ap.add_argument("--gap", type=float, default=9.0, help="seconds between injected revocations")
    ap.add_argument("--poll", type=float, default=0.5, help="controller pass interval (s)")
    ap.add_argument("--boot-delay", type=float, default=70.0, help="gce: emulated s from insert to RUNNING")
    ap.add_argument("--time-scale", type=float, default=20.0, help="gce: emulated seconds per real second")
    ap.add_argument("--work", type=Path, default=None, help="work directory (default: a new temporary one)")
    args = ap.parse_args()
    tmp = args.work or Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    tmp.mkdir(parents=True, exist_ok=True)
    children = Children()
    # kill -TERM / timeout / Ctrl-C: the launch tears its instances down, then the bench exits 143 / 130.
    with stopped_cleanly(children, tmp / "home"):
        if args.provider == "gce":
            run_gce(args, tmp, children)
        else:
            run_local(args, tmp, children)


if __name__ == "__main__":
    main()
