"""Revocation detection latency and recovery time on the local provider (real TensorFlow training).

Runs one job with 1 PS + chief + 2 spot K80 workers and a schedule of injected revocations (default 12),
then prints, per revocation and as median / max:
  detection: notice -> REVOKED event row, and kill -> REVOKED event row (negative: seen during the notice window)
  recovery:  kill -> replacement task started, and kill -> replacement worker stepping again (from metrics)
Targets (issue 3): detection <= 1 s, recovery <= 10 s.

    python bench/recovery.py [--revocations 12] [--poll 0.5]
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
from pathlib import Path

from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--revocations", type=int, default=12)
    ap.add_argument("--gap", type=float, default=9.0, help="seconds between injected revocations")
    ap.add_argument("--poll", type=float, default=0.5, help="controller pass interval (s)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    env = {**os.environ, "ORCHESTRATOR_HOME": str(tmp / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp}/r.db"}
    spec = tmp / "job.yaml"
    spec.write_text(spec_text(tmp / "runs", args.revocations, args.gap, first_s=35.0))
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "launch", str(spec), "--quiet",
                          "--poll", str(args.poll)], env=env, capture_output=True, text=True, cwd=REPO)
    if out.returncode != 0:
        sys.exit(f"job failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    from orchestrator.providers.local import LocalProvider

    cloud = LocalProvider(tmp / "home" / "local")
    engine = create_engine(env["ORCHESTRATOR_DB_URL"])
    with engine.connect() as conn:
        insts = conn.execute(text("SELECT id, name, role, slot_index, generation, training_at FROM instances "
                                  "ORDER BY slot_index, generation")).mappings().all()
        revoked = {r[0]: r[1] for r in conn.execute(text(
            "SELECT instance_id, MIN(at) FROM events WHERE to_status = 'revoked' GROUP BY instance_id")).all()}
        worker_steps = conn.execute(text(
            "SELECT worker, at FROM metrics WHERE kind = 'worker' AND examples_per_s > 0 ORDER BY at")).all()
        status = conn.execute(text("SELECT status, accuracy, wall_time_s FROM job_summary")).one()
    rows = []
    for inst in insts:
        if inst["id"] not in revoked:
            continue
        hist = cloud.history(inst["name"]) or {}
        notice, killed = hist.get("notice_at"), hist.get("killed_at")
        nxt = next((i for i in insts if i["role"] == inst["role"] and i["slot_index"] == inst["slot_index"]
                    and i["generation"] == inst["generation"] + 1), None)
        if notice is None or killed is None or nxt is None or nxt["training_at"] is None:
            continue
        stepping = next((at for w, at in worker_steps if w == inst["slot_index"] and at > nxt["training_at"]), None)
        rows.append({
            "instance": inst["name"], "notice_to_event_s": revoked[inst["id"]] - notice,
            "kill_to_event_s": revoked[inst["id"]] - killed, "kill_to_task_s": nxt["training_at"] - killed,
            "kill_to_stepping_s": None if stepping is None else stepping - killed,
        })
    print(f"job: {status[0]}, accuracy {status[1]}, wall {status[2]:.0f}s (bench {time.time() - t0:.0f}s); "
          f"{len(rows)} revocations measured, controller pass every {args.poll}s")
    print(f"{'instance':36} {'notice->event':>14} {'kill->event':>12} {'kill->task':>11} {'kill->stepping':>15}")
    for r in rows:
        step = "n/a" if r["kill_to_stepping_s"] is None else f"{r['kill_to_stepping_s']:.2f}"
        print(f"{r['instance']:36} {r['notice_to_event_s']:14.2f} {r['kill_to_event_s']:12.2f} "
              f"{r['kill_to_task_s']:11.2f} {step:>15}")
    for key, label, target in [("notice_to_event_s", "detection (notice -> event row)", 1.0),
                               ("kill_to_event_s", "detection (kill -> event row)", 1.0),
                               ("kill_to_task_s", "recovery (kill -> replacement task started)", 10.0),
                               ("kill_to_stepping_s", "recovery (kill -> replacement stepping)", 10.0)]:
        vals = [r[key] for r in rows if r[key] is not None]
        if vals:
            print(f"{label:48} median {statistics.median(vals):6.2f}s  max {max(vals):6.2f}s  (target <= {target}s)")
    print(json.dumps({"revocations": len(rows)}))


if __name__ == "__main__":
    main()
