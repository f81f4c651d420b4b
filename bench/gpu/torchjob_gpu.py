"""The project's own PyTorch payload (jobs/torchjob) on one GPU: step times, checkpoint on notice, resume.

    python3 bench/gpu/torchjob_gpu.py OUT [--hparam resnet_cifar_32] [--batches 128,512] [--steps 400]
                                      [--cross-bn] [--baseline DIR] [--notice-batch 128] [--notice-at 100]

Every run is what the controller starts on an instance: a task.json for a single-node job (one worker slot,
``--nproc-per-node=1``, elastic c10d rendezvous on 127.0.0.1) and ``python jobs/torchjob/node.py --task
task.json`` in the run's own directory, which execs torchrun; worker.py picks NCCL when CUDA is there (gloo
otherwise, or with TORCHJOB_DEVICE=cpu). Data: the offline digits (``data_dir`` null), upsampled to 32x32x3.

1. One training run per batch in --batches (``train_steps`` = --steps, ``log_every`` = --log-every, no
   periodic checkpoint before the end). The payload's own ``step`` lines (metrics.jsonl) give the step time
   of each logging window; the first --warm-windows windows (CUDA start, cuDNN autotuning) are left out and
   ``step_ms`` is the median window's seconds per step.
2. --cross-bn: the same runs with TORCHJOB_BN=cross (the cross-rank batch-norm statistics that a world of
   several ranks uses, here at world 1: its cost on one GPU); --variant SUFFIX:NAME=VALUE likewise with any
   of the payload's environment knobs (e.g. nchw:TORCHJOB_MEMORY_FORMAT=contiguous).
3. Preemption: a run at --notice-batch; once a ``step`` line reaches --notice-at, the driver writes
   ``storage/notices/<instance>`` as the controller does; the rank must save a torch.distributed.checkpoint
   and take its torchrun agent down. Then a replacement instance (a new instance name, the same job and
   storage) resumes from that checkpoint and trains to the end.
4. --baseline DIR: DIR holds an older payload (DIR/jobs/torchjob/node.py); one short run of it, its exit
   code and log tail recorded (to show what failed before a fix).

Writes into OUT (at most 6 files): summary.json, metrics.jsonl (every run's metrics lines, with "run"),
runs.log (every run's torchrun / payload output), rows.csv (one row per batch of step 1, in the columns of
data/measurements/h100-torch-resnet-cifar.csv). Run directories live under --work (default: a temp dir).
Standard library only (torch is imported by the payload, and once for the environment line).

Reproduce (2026-11-24, one lent H100 80GB HBM3, torch 2.11.0+cu130, NCCL 2.28.9, cuDNN 9.19; $OUT is the
device tool's output folder; each command ran in about 5 minutes):

    set -o pipefail; PYTHONUNBUFFERED=1 python3 bench/gpu/torchjob_gpu.py $OUT --cross-bn \
        --variant nchw:TORCHJOB_MEMORY_FORMAT=contiguous --work /tmp/tjg 2>&1 | tee $OUT/driver.log

gives data/measurements/h100-torchjob-payload.csv. An earlier call ran the payload before it used
channels_last, plus ``--baseline build/torchjob_orig`` with the payload of commit 0d32d14 copied there
(jobs/torchjob, jobs/tfjob, jobs/task_schema.py and orchestrator/model/task.py, carried to the device):
that one failed at its first step line with ``RuntimeError: No backend type associated with device type
cpu`` (a CPU tensor all-reduced over NCCL). Test here on CPU first (gloo), e.g.
``--hparam resnet_tiny --batches 32 --steps 40 --log-every 10 --warm-windows 1 --notice-steps 60 --notice-at 20``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPTH = {"resnet_tiny": 8, "resnet_cifar_15": 14, "resnet_cifar_32": 32, "resnet_cifar_56": 56}
NO_PERIODIC = 10**6  # checkpoint_every: only the final checkpoint (after the loop), none inside a timed window
CSV_COLUMNS = ["gpu", "framework", "runtime", "model", "depth", "batch", "precision", "step_ms", "peak_gb", "ps_count",
               "workers", "steps_per_s", "ps_machine_type", "source", "method"]


def say(msg: str) -> None:
    print(f"[torchjob_gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def task_json(job: str, instance: str, storage: Path, port: int, hparam: str, batch: int, steps: int,
              log_every: int, checkpoint_every: int) -> dict[str, object]:
    """What orchestrator/model/task.py's TaskConfig.to_dict writes for one worker slot of a PyTorch job."""
    return {
        "version": 1, "job_id": job, "instance": instance, "mode": "sync", "role": "worker", "index": 0,
        "cluster": {"worker": [f"127.0.0.1:{port}"]}, "storage": str(storage), "storage_uri": "",
        "training": {"model": "resnet", "hparam_set": hparam, "problem": "image_cifar10", "data_dir": None,
                     "train_steps": steps, "batch_per_worker": [batch], "checkpoint_every": checkpoint_every,
                     "eval_every": 0, "log_every": log_every, "seed": 0},
        "emulation": {"step_sleep_s": 0.0}, "gpu": "h100",
        "torch": {"rdzv_endpoint": f"127.0.0.1:{port}", "is_rdzv_host": True, "min_nodes": 1, "max_nodes": 1,
                  "max_restarts": 0, "threads": None, "sleep_table": [], "run": None, "setup": None, "env": {}},
    }


class Run:
    """One node.py process (torchrun agent + its rank) in a directory of its own."""

    def __init__(self, driver: Driver, label: str, task: dict[str, object], env: dict[str, str] | None = None,
                 jobs_dir: Path | None = None) -> None:
        self.driver, self.label, self.task = driver, label, task
        self.dir = driver.work / label
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "task.json").write_text(json.dumps(task, indent=1))
        self.storage = Path(str(task["storage"]))
        self.log_path = self.dir / "node.log"
        node = (jobs_dir or REPO / "jobs") / "torchjob" / "node.py"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        say(f"{label}: start {node} (batch {task['training']['batch_per_worker']}, "  # type: ignore[index]
            f"steps {task['training']['train_steps']}, env {env or {}})")  # type: ignore[index]
        self.t0 = time.time()
        self._log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, str(node), "--task", "task.json"], cwd=self.dir,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=full_env,
                                     start_new_session=True)

    def metrics(self) -> list[dict[str, object]]:
        try:
            lines = (self.storage / "metrics.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line being written
            if float(rec.get("t", 0)) >= self.t0:  # this run's lines (a resumed job shares the file)
                out.append(rec)
        return out

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            say(f"{self.label}: still running after {timeout:.0f}s: killing its process group")
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
            self.timed_out = True
        self._log.close()
        self.seconds = time.time() - self.t0
        say(f"{self.label}: exit {code} after {self.seconds:.1f}s")
        text = self.log_path.read_text(errors="replace")
        with open(self.driver.out / "runs.log", "a") as f:
            f.write(f"===== {self.label} (exit {code}, {self.seconds:.1f}s)\n{text}\n")
        with open(self.driver.out / "metrics.jsonl", "a") as f:
            for rec in self.metrics():
                f.write(json.dumps({"run": self.label, **rec}, separators=(",", ":")) + "\n")
        return code

    def log_lines(self, *needles: str) -> list[str]:
        text = self.log_path.read_text(errors="replace")
        return [ln for ln in text.splitlines() if any(n in ln for n in needles)]


def timing(recs: list[dict[str, object]], warm_windows: int, t0: float) -> dict[str, object]:
    steps = [r for r in recs if r.get("kind") == "step"]
    windows = []
    for r in steps:
        w = r.get("workers", {}).get("0", {})  # type: ignore[union-attr]
        n = w.get("steps") if isinstance(w, dict) else None
        if n:
            windows.append((int(r["step"]), float(r["window_s"]) / int(n), int(n), float(r["window_s"])))
    timed = windows[warm_windows:]
    start = next((r for r in recs if r.get("kind") == "start"), None)
    out: dict[str, object] = {
        "windows": len(windows), "timed_windows": len(timed),
        "first_step_line_after_s": round(float(steps[0]["t"]) - t0, 2) if steps else None,
        "start_line_after_s": round(float(start["t"]) - t0, 2) if start else None,  # type: ignore[arg-type]
        "warm_ms_per_step": [round(1000 * w[1], 3) for w in windows[:warm_windows]],
    }
    if timed:
        per = [w[1] for w in timed]
        out.update({
            "step_ms": round(1000 * statistics.median(per), 3), "step_ms_min": round(1000 * min(per), 3),
            "step_ms_max": round(1000 * max(per), 3),
            "spread_pct": round(100 * (max(per) - min(per)) / statistics.median(per), 2),
            "step_ms_mean": round(1000 * sum(w[3] for w in timed) / sum(w[2] for w in timed), 3),
            "timed_steps": sum(w[2] for w in timed),
            "examples_per_s_median": statistics.median(float(r["examples_per_s"]) for r in steps[warm_windows:]),
        })
    last = steps[-1] if steps else {}
    out["gpu_peak_gb"] = last.get("gpu_peak_gb")
    out["last_loss"] = last.get("loss")
    ev = [r for r in recs if r.get("kind") == "eval"]
    out["eval"] = {k: ev[-1].get(k) for k in ("step", "accuracy", "loss")} if ev else None
    return out


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        for name in ("runs.log", "metrics.jsonl"):
            (self.out / name).unlink(missing_ok=True)
        self.work = Path(args.work or tempfile.mkdtemp(prefix="torchjob_gpu."))
        self.port = args.port
        self.summary: dict[str, object] = {"args": vars(args), "work": str(self.work), "runs": {}}

    def next_port(self) -> int:
        self.port += 1
        return self.port

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str) + "\n")

    def environment(self) -> None:
        probe = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
                 "'cuda': torch.version.cuda, 'cuda_available': c, 'cudnn': torch.backends.cudnn.version(), "
                 "'nccl': str(torch.cuda.nccl.version()) if c else None, "
                 "'device': torch.cuda.get_device_name(0) if c else 'cpu', "
                 "'torchjob_device': __import__('os').environ.get('TORCHJOB_DEVICE', '')}))")
        res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        try:
            env = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            env = {"error": res.stderr[-2000:]}
        env["python"] = sys.version.split()[0]
        self.summary["environment"] = env
        say(f"environment: {env}")

    def train(self, label: str, batch: int, env: dict[str, str] | None = None) -> dict[str, object]:
        a = self.args
        storage = self.work / label / "storage"
        task = task_json(f"gpu-{label}", f"gpu-{label}-worker-0-0", storage, self.next_port(), a.hparam, batch,
                         a.steps, a.log_every, NO_PERIODIC)
        run = Run(self, label, task, env)
        code = run.wait(a.timeout)
        res = {"exit": code, "batch": batch, "seconds": round(run.seconds, 2), "env": env or {},
               **timing(run.metrics(), a.warm_windows, run.t0),
               "errors": run.log_lines("Error", "error:", "Traceback")[-8:]}
        self.summary["runs"][label] = res  # type: ignore[index]
        say(f"{label}: {json.dumps({k: res.get(k) for k in ('exit', 'step_ms', 'spread_pct', 'gpu_peak_gb')})}")
        self.save()
        return res

    def preemption(self) -> None:
        a = self.args
        job, storage = "gpu-notice", self.work / "notice" / "storage"
        first = f"{job}-worker-0-0"
        task = task_json(job, first, storage, self.next_port(), a.hparam, a.notice_batch, a.notice_steps,
                         a.log_every, NO_PERIODIC)
        run = Run(self, "notice", task)
        noticed_at, notice_step = None, None
        deadline = time.time() + a.timeout
        while time.time() < deadline and run.proc.poll() is None:
            steps = [int(r["step"]) for r in run.metrics() if r.get("kind") == "step"]  # type: ignore[arg-type]
            if steps and steps[-1] >= a.notice_at:
                (storage / "notices").mkdir(parents=True, exist_ok=True)
                (storage / "notices" / first).write_text("preempted by torchjob_gpu.py\n")
                noticed_at, notice_step = time.time(), steps[-1]
                say(f"notice: wrote notices/{first} after the step-{steps[-1]} line")
                break
            time.sleep(0.05)
        code = run.wait(max(10.0, deadline - time.time()))
        recs = run.metrics()
        ck = [r for r in recs if r.get("kind") == "checkpoint" and r.get("reason") == "notice"]
        events = []
        with contextlib.suppress(FileNotFoundError, ValueError):
            events = [json.loads(ln) for ln in (storage / "torch_events.jsonl").read_text().splitlines() if ln]
        ckdirs = sorted(p.name for p in (storage / "checkpoints").glob("step-*") if (p / ".metadata").exists())
        ck_bytes = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
                    for p in (storage / "checkpoints").glob("step-*")}
        notice = {
            "exit": code, "exit_note": "-9: the rank SIGKILLs its own torchrun agent (leave_with_agent)",
            "notice_written_after_step_line": notice_step,
            "checkpoint_line": ck[-1] if ck else None,
            "checkpoint_line_after_notice_s": round(float(ck[-1]["t"]) - noticed_at, 3)  # type: ignore[arg-type]
            if ck and noticed_at else None,
            "process_gone_after_notice_s": round(run.t0 + run.seconds - noticed_at, 2) if noticed_at else None,
            "events": events, "complete_checkpoints": ckdirs, "checkpoint_bytes": ck_bytes,
            "log": run.log_lines("checkpoint at step", "was noticed", "world ", "Traceback", "Error"),
            **timing(recs, a.warm_windows, run.t0),
        }
        self.summary["runs"]["notice"] = notice  # type: ignore[index]
        self.save()
        say(f"notice: exit {code}; checkpoint line {notice['checkpoint_line']}; complete {ckdirs}")
        # The replacement: a new instance of the same slot (the controller's naming), same job and storage.
        task = task_json(job, f"{job}-worker-0-1", storage, self.next_port(), a.hparam, a.notice_batch,
                         a.notice_steps, a.log_every, NO_PERIODIC)
        rerun = Run(self, "resume", task)
        code = rerun.wait(a.timeout)
        recs = rerun.metrics()
        starts = [r for r in recs if r.get("kind") == "start"]
        result = None
        with contextlib.suppress(FileNotFoundError, ValueError):
            result = json.loads((storage / "result.json").read_text())
        first_steps = [r for r in recs if r.get("kind") == "step"]
        resume = {
            "exit": code, "start_lines": starts, "result": result,
            "first_step_line": {k: first_steps[0].get(k) for k in ("step", "loss")} if first_steps else None,
            "log": rerun.log_lines("world ", "checkpoint at step", "done:", "Traceback", "Error"),
            **timing(recs, a.warm_windows, rerun.t0),
        }
        self.summary["runs"]["resume"] = resume  # type: ignore[index]
        self.save()
        say(f"resume: exit {code}; start {starts[-1] if starts else None}; result {result}")

    def baseline(self) -> None:
        a = self.args
        label = "baseline"
        storage = self.work / label / "storage"
        task = task_json(f"gpu-{label}", f"gpu-{label}-worker-0-0", storage, self.next_port(), a.hparam,
                         a.notice_batch, 2 * a.log_every, a.log_every, 2 * a.log_every)
        run = Run(self, label, task, jobs_dir=Path(a.baseline).resolve() / "jobs")
        code = run.wait(min(a.timeout, 120.0))
        res = {"exit": code, "jobs_dir": a.baseline, "metrics": run.metrics()[-4:],
               "log_tail": run.log_path.read_text(errors="replace").splitlines()[-25:]}
        self.summary["runs"][label] = res  # type: ignore[index]
        self.save()
        say(f"baseline: exit {code}")

    def rows(self) -> None:
        a, env = self.args, self.summary.get("environment", {})
        rows = []
        for b in a.batch_list:
            r = self.summary["runs"].get(f"b{b}")  # type: ignore[union-attr]
            if not r or r.get("step_ms") is None:
                continue
            variants = {k[len(f"b{b}-"):]: v["step_ms"] for k, v in self.summary["runs"].items()  # type: ignore[union-attr]
                        if k.startswith(f"b{b}-") and v.get("step_ms")}
            fmt = "channels_last" if env.get("cuda_available") else "NCHW"
            rows.append({
                "gpu": "h100", "framework": f"pytorch {env.get('torch', '?')}", "runtime": "pytorch-eager",
                "model": a.hparam, "depth": DEPTH.get(a.hparam, ""), "batch": b, "precision": "fp32",
                "step_ms": r["step_ms"], "peak_gb": r.get("gpu_peak_gb") or "", "ps_count": "", "workers": 1,
                "steps_per_s": round(1000 / float(r["step_ms"]), 3), "ps_machine_type": "",
                "source": "measured by this project on a lent H100, 2026-11-24, jobs/torchjob via "
                          "bench/gpu/torchjob_gpu.py",
                "method": (f"the payload itself (node.py -> torchrun --nproc-per-node=1, c10d rendezvous, NCCL, "
                           f"DDP world 1, CrossRankBatchNorm -> native BN at world 1, {fmt}, cudnn.benchmark, "
                           f"true fp32), offline digits 32x32x3 held on the GPU; {a.steps} steps, its own "
                           f"step lines every {a.log_every} steps; step_ms = median window of the last "
                           f"{r['timed_windows']} (first {a.warm_windows} windows left out; spread "
                           f"{r['spread_pct']}%); includes the per-step control all-reduce + sync"
                           + "".join(f"; variant {k}: {ms} ms" for k, ms in variants.items())),
            })
        with open(self.out / "rows.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            w.writerows(rows)
        say(f"rows.csv: {len(rows)} rows")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--hparam", default="resnet_cifar_32")
    p.add_argument("--batches", default="128,512")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--warm-windows", type=int, default=3)
    p.add_argument("--cross-bn", action="store_true", help="also run each batch with TORCHJOB_BN=cross")
    p.add_argument("--variant", action="append", default=[], metavar="SUFFIX:NAME=VALUE",
                   help="also run each batch with the payload's environment variable NAME=VALUE (repeatable)")
    p.add_argument("--variant-batches", default="", help="the batches of the variants (default: --batches)")
    p.add_argument("--notice-batch", type=int, default=128)
    p.add_argument("--notice-steps", type=int, default=300)
    p.add_argument("--notice-at", type=int, default=100, help="write the notice after this step's line")
    p.add_argument("--no-notice", action="store_true")
    p.add_argument("--baseline", help="a folder holding an older jobs/ (jobs/torchjob/node.py) to run briefly")
    p.add_argument("--timeout", type=float, default=100.0, help="seconds per run")
    p.add_argument("--port", type=int, default=29400)
    p.add_argument("--work")
    args = p.parse_args()
    args.batch_list = [int(b) for b in args.batches.split(",") if b]
    args.variant_batch_list = [int(b) for b in args.variant_batches.split(",") if b]
    d = Driver(args)
    t0 = time.time()
    d.environment()
    ok = True
    for b in args.batch_list:
        ok = ok and d.train(f"b{b}", b)["exit"] == 0  # after a failure only the baseline runs (fail fast)
    variants = [*(["crossbn:TORCHJOB_BN=cross"] if args.cross_bn else []), *args.variant]
    for v in variants if ok else []:
        suffix, _, assign = v.partition(":")
        name, _, value = assign.partition("=")
        for b in args.variant_batch_list or args.batch_list:
            d.train(f"b{b}-{suffix}", b, {name: value})
    if not args.no_notice and ok:
        d.preemption()
    if args.baseline:
        d.baseline()
    d.rows()
    d.summary["driver_seconds"] = round(time.time() - t0, 1)
    d.save()
    runs = d.summary["runs"]
    say("summary: " + json.dumps({k: {f: v.get(f) for f in ("exit", "step_ms", "spread_pct", "gpu_peak_gb")}
                                   for k, v in runs.items()}))  # type: ignore[union-attr]
    return 0


if __name__ == "__main__":
    sys.exit(main())
