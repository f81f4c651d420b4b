"""The built-in PyTorch job re-splitting itself on a real heterogeneous cluster: three ranks on one GPU under MPS.

    python3 bench/gpu/resplit_mps.py OUT [--pcts 100,25,10] [--batch 1024] [--steps 400] [--slow-at 200]
                                     [--factor 2] [--resplit-every 10] [--hparam resnet_cifar_32] [--budget S]

The cluster of ../shared/measurements/hetero.sh: three processes on one GPU, each capped by MPS
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) to its share of the SMs, synchronous DDP over gloo (NCCL refuses two ranks on
one GPU; TORCHJOB_BACKEND=gloo keeps the tensors on the GPU). Each rank is what the controller starts on a worker:
``jobs/torchjob/node.py --task task.json`` (torchrun agent, elastic c10d rendezvous on 127.0.0.1, 3 nodes). Data:
a CIFAR-10-format directory of 50,000 training images (the offline digits tiled; the job needs a training split
larger than its global batch), written once. Global batch 3 x --batch; rank 0 slows --factor x at --slow-at
(``torch.slowdowns``: the payload sleeps (F - 1) x its own measured GPU compute per step, as the local
provider's ``provider.slowdowns`` does).

Runs, all with the same slowdown, each timed by the job's own step lines (examples/s of the global batch):
1. ``resplit``: starts from the equal split and re-splits every --resplit-every steps (jobs/torchjob/rebalance.py),
   declining a re-split that would not repay its measured cost; with --always also ``resplit-always``
   (TORCHJOB_RESPLIT_COST=off: every re-split made, as before 2026-11-28);
2. ``static-equal``: the equal split all run long (sync pinned's rule before this issue);
3. ``static-before``: the split the re-split run settled on before the slowdown, all run long;
4. ``static-after``: the split it settled on after the slowdown, all run long.
The best of 2-4 over the whole run is the best static split found; 3 and 4 each know a phase of the run ahead.
Nothing is fitted: every figure is what the ranks measured. --budget skips a run whose predicted end is past it.

Writes OUT/summary.json (per run: exit, per-phase and whole-run examples/s, the re-splits) and OUT/metrics.jsonl
(every run's metrics lines) and OUT/runs.log. Standard library only; torch is the payload's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "jobs"))


def say(msg: str) -> None:
    print(f"[resplit_mps {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_data_dir(path: Path, n_train: int = 50_000, n_test: int = 2_000) -> Path:
    """CIFAR-10 pickles of the offline digits, tiled to n_train training images."""
    import numpy as np
    from tfjob.data import TEST_FILE, TRAIN_FILES, load_digits_32, write_cifar10_batch

    path.mkdir(parents=True, exist_ok=True)
    x, y = load_digits_32("train")
    reps = -(-n_train // len(y))
    x, y = np.concatenate([x] * reps)[:n_train], np.concatenate([y] * reps)[:n_train]
    per = -(-n_train // len(TRAIN_FILES))
    for i, name in enumerate(TRAIN_FILES):
        write_cifar10_batch(path / name, x[i * per:(i + 1) * per], y[i * per:(i + 1) * per])
    xt, yt = load_digits_32("test")
    write_cifar10_batch(path / TEST_FILE, xt[:n_test], yt[:n_test])
    return path


def task(job: str, index: int, storage: Path, data_dir: Path, port: int, a: argparse.Namespace,
         batches: list[int], resplit_every: int) -> dict[str, object]:
    """What orchestrator/model/task.py writes for worker slot ``index`` of a 3-node synchronous PyTorch job."""
    n = len(batches)
    slow = [[a.slow_at, a.factor]] if index == 0 and a.factor != 1 else []
    return {
        "version": 1, "job_id": job, "instance": f"{job}-worker-{index}-0", "mode": "sync", "role": "worker",
        "index": index, "cluster": {"worker": [f"127.0.0.1:{port}"] * n}, "storage": str(storage),
        "storage_uri": "",
        "training": {"model": "resnet", "hparam_set": a.hparam, "problem": "image_cifar10", "data_dir": str(data_dir),
                     "train_steps": a.steps, "batch_per_worker": batches, "checkpoint_every": 10**6,
                     "eval_every": 0, "log_every": a.log_every, "seed": 0},
        "emulation": {"step_sleep_s": 0.0}, "gpu": "h100",
        "torch": {"rdzv_endpoint": f"127.0.0.1:{port}", "is_rdzv_host": index == 0, "min_nodes": n,
                  "max_nodes": n, "max_restarts": 0, "threads": None, "sleep_table": [], "run": None, "setup": None,
                  "env": {}, "resplit_every": resplit_every, "slowdowns": slow},
    }


def read_jsonl(path: Path) -> list[dict[str, object]]:
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def throughput(steps: list[dict[str, object]], lo: int, hi: int, global_batch: int) -> float | None:
    """Examples/s of the global batch over the step windows ending in (lo, hi]."""
    win = [r for r in steps if lo < int(r["step"]) <= hi]  # type: ignore[call-overload]
    if not win:
        return None
    n = sum(int(next(iter(r["workers"].values()))["steps"]) for r in win)  # type: ignore[attr-defined]
    secs = sum(float(r["window_s"]) for r in win)  # type: ignore[arg-type]
    return round(global_batch * n / secs, 1) if secs > 0 else None


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(a.work or tempfile.mkdtemp(prefix="resplit_mps."))
        self.port = a.port
        self.t_start = time.time()
        self.pcts = [int(p) for p in a.pcts.split(",")]
        self.summary: dict[str, object] = {"args": vars(a), "runs": {}, "mps": False}
        self.mean_run_s: list[float] = []

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1) + "\n")

    def start_mps(self) -> bool:
        if not shutil.which("nvidia-cuda-mps-control") or self.a.no_mps:
            return False
        os.environ.update(CUDA_MPS_PIPE_DIRECTORY="/tmp/mps", CUDA_MPS_LOG_DIRECTORY="/tmp/mpslog")
        for d in ("/tmp/mps", "/tmp/mpslog"):
            Path(d).mkdir(parents=True, exist_ok=True)
        ok = subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False).returncode == 0
        self.summary["mps"] = ok
        return ok

    def stop_mps(self) -> None:
        if self.summary.get("mps"):
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, check=False)

    def run(self, label: str, batches: list[int], resplit_every: int,
            env: dict[str, str] | None = None) -> dict[str, object] | None:
        a = self.a
        left = a.budget - (time.time() - self.t_start)
        if self.mean_run_s and left < 1.2 * max(self.mean_run_s):
            say(f"{label}: skipped ({left:.0f}s of the budget left)")
            self.summary["runs"][label] = {"skipped": f"{left:.0f}s of the budget left"}  # type: ignore[index]
            self.save()
            return None
        self.port += 7
        storage = self.work / label / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        procs, logs = [], []
        t0 = time.time()
        for i, pct in enumerate(self.pcts):
            d = self.work / label / f"node{i}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "task.json").write_text(json.dumps(task(f"mps-{label}", i, storage, self.data_dir, self.port, a,
                                                         batches, resplit_every)))
            full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCHJOB_BACKEND": "gloo",
                        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct), **(env or {})}
            log = open(d / "node.log", "w")  # noqa: SIM115
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, str(REPO / "jobs" / "torchjob" / "node.py"), "--task",
                                           "task.json"], cwd=d, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                          start_new_session=True))
        say(f"{label}: 3 nodes at {self.pcts}% SMs, batches {batches}, resplit_every {resplit_every}")
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(5.0, a.timeout - (time.time() - t0))))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                codes.append(p.wait())
        secs = time.time() - t0
        self.mean_run_s.append(secs)
        for log in logs:
            log.close()
        with open(self.out / "runs.log", "a") as f:
            for i in range(len(procs)):
                text = (self.work / label / f"node{i}" / "node.log").read_text(errors="replace")
                f.write(f"===== {label} node {i} (exit {codes[i]})\n{text[-6000:]}\n")
        recs = read_jsonl(storage / "metrics.jsonl")
        with open(self.out / "metrics.jsonl", "a") as f:
            for r in recs:
                f.write(json.dumps({"run": label, **r}, separators=(",", ":")) + "\n")
        res = self.result(label, recs, codes, secs, batches)
        self.summary["runs"][label] = res  # type: ignore[index]
        self.save()
        say(f"{label}: {json.dumps({k: res[k] for k in ('exit', 'examples_per_s', 'before', 'after', 'seconds')})}")
        return res

    def result(self, label: str, recs: list[dict[str, object]], codes: list[int], secs: float,
               batches: list[int]) -> dict[str, object]:
        a = self.a
        g = sum(batches)
        steps = [r for r in recs if r.get("kind") == "step"]
        warm = a.log_every * a.warm_windows
        settle = a.slow_at + a.settle_steps
        resplits = [{"step": r["step"], "t": r["t"], "batches": r["batches"], "compute_s": r.get("compute_s")}
                    for r in recs if r.get("kind") == "resplit"]
        last_before = [r for r in resplits if int(r["step"]) <= a.slow_at]  # type: ignore[call-overload]

        def by_slot(r: dict[str, object]) -> list[int]:
            return [int(r["batches"][str(i)]) for i in range(len(batches))]  # type: ignore[index]

        step_ms = [round(1000 * float(r["window_s"]) / int(next(iter(r["workers"].values()))["steps"]), 2)  # type: ignore[attr-defined,arg-type]
                   for r in steps]
        return {
            "exit": codes, "seconds": round(secs, 1), "start_batches": batches, "global_batch": g,
            "examples_per_s": throughput(steps, warm, a.steps, g),
            "before": throughput(steps, warm, a.slow_at, g),
            "after": throughput(steps, a.slow_at, a.steps, g),
            "after_settled": throughput(steps, settle, a.steps, g),
            "step_ms_per_window": step_ms,
            "resplits": resplits,
            "settled_before": by_slot(last_before[-1]) if last_before else batches,
            "settled_after": by_slot(resplits[-1]) if resplits else batches,
            "errors": self.errors(label),
        }

    def errors(self, label: str) -> list[str]:
        lines = []
        for log in sorted((self.work / label).glob("node*/node.log")):
            lines += [f"{log.parent.name}: {ln}" for ln in log.read_text(errors="replace").splitlines()
                      if "Error" in ln or "Traceback" in ln]
        return lines[-8:]

    def main(self) -> int:
        a = self.a
        probe = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
                 "'device': torch.cuda.get_device_name(0) if c else 'cpu', 'cudnn': torch.backends.cudnn.version()}))")
        res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        self.summary["environment"] = res.stdout.strip()[-500:] or res.stderr[-500:]
        say(f"environment: {self.summary['environment']}")
        self.data_dir = write_data_dir(self.work / "data")
        self.start_mps()
        try:
            equal = [a.batch] * len(self.pcts)
            rs = self.run("resplit", equal, a.resplit_every)
            self.run("static-equal", equal, 0)
            if a.always:
                self.run("resplit-always", equal, a.resplit_every, {"TORCHJOB_RESPLIT_COST": "off"})
            if rs is not None:
                before = rs["settled_before"]
                after = rs["settled_after"]
                self.run("static-before", before, 0)  # type: ignore[arg-type]
                if after != before:
                    self.run("static-after", after, 0)  # type: ignore[arg-type]
        finally:
            self.stop_mps()
        self.table()
        return 0

    def table(self) -> None:
        runs = self.summary["runs"]
        say("run            start split         ex/s whole   before   after   after settled   exit")
        for label, r in runs.items():  # type: ignore[attr-defined]
            if "skipped" in r:
                say(f"{label:14} skipped")
                continue
            say(f"{label:14} {str(r['start_batches']):18} {r['examples_per_s']!s:>10} {r['before']!s:>8} "
                f"{r['after']!s:>8} {r['after_settled']!s:>10}   {r['exit']}")
        rs = runs.get("resplit", {})  # type: ignore[attr-defined]
        for x in rs.get("resplits", []):
            say(f"  resplit at step {x['step']}: {x['batches']} (compute s {x['compute_s']})")
        statics = {k: v for k, v in runs.items() if k.startswith("static") and v.get("examples_per_s")}  # type: ignore[attr-defined]
        if statics and rs.get("examples_per_s"):
            best = max(statics, key=lambda k: statics[k]["examples_per_s"])
            ratio = rs["examples_per_s"] / statics[best]["examples_per_s"]
            say(f"re-split / best static ({best}): {ratio:.3f} over the whole run")
            self.summary["resplit_over_best_static"] = {"best": best, "ratio": round(ratio, 4)}
            self.save()


def main() -> int:
    p = argparse.ArgumentParser(prog="resplit_mps.py")
    p.add_argument("out")
    p.add_argument("--pcts", default="100,25,10")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--slow-at", type=int, default=200)
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--resplit-every", type=int, default=10)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--warm-windows", type=int, default=2)
    p.add_argument("--settle-steps", type=int, default=60, help="after the slowdown: steps left out of after_settled")
    p.add_argument("--hparam", default="resnet_cifar_32")
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument("--timeout", type=float, default=150.0, help="one run's limit (s)")
    p.add_argument("--port", type=int, default=29610)
    p.add_argument("--work")
    p.add_argument("--no-mps", action="store_true")
    p.add_argument("--always", action="store_true",
                   help="also a re-split run that never declines (TORCHJOB_RESPLIT_COST=off), after static-equal")
    return Bench(p.parse_args()).main()


if __name__ == "__main__":
    sys.exit(main())
