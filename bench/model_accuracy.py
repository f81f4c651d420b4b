"""Cost-model accuracy on local heterogeneous runs: leave-one-GPU-out error of predicted step times.

What runs (real TensorFlow on this machine, local provider, no revocations, model ``resnet_tiny``,
async with one parameter server; sequentially, one job at a time):

* for each per-worker batch ``b`` in ``--batches`` (default 16 and 64): one job with one worker each
  of K80, P100 and V100 at batch ``b``, GPU speeds emulated (``emulation_k80_step_s``, default 0.6 s,
  reference batch ``batch_per_worker: 32``);
* for each ``b``: a *baseline* job, one worker at batch ``b`` with the emulation off
  (``emulation_k80_step_s: 0``): what this machine's CPU adds to every step whatever GPU is emulated
  (resnet_tiny's forward and backward pass, the parameter-server round trip, TensorFlow overheads).

Measured step time of a worker (from its job's metric rows): the chief logs a ``kind='step'`` row every
10 steps with, per worker, ``step_time_s`` = window seconds / steps that worker finished in the window.
Each window's steps are split among the workers in proportion to 1 / ``step_time_s``; a worker's step
time is the sum of the window lengths divided by its steps, over the steady windows (those after the
first window in which every worker has stepped: the warm-up, with graph tracing, is left out).

Emulated GPU step time = measured step time - baseline step time at the same batch (measured, not taken
from the emulation's formula).

Mapping to the cost model (the emulated workload). ``control/driver.emulation`` makes a local worker
of GPU ``g`` at batch ``b`` sleep ``k80_s * T(g, 128 b / 32) / T(k80, 128)`` each step, with ``T`` the
cost model's ResNet-32 step time: an emulated GPU stands for ResNet-32 on CIFAR-10 at batch ``128 b / 32``
on that GPU, in units where a K80's batch-128 step takes ``k80_s``. Each measurement is
therefore written as a ``resnet_cifar_32`` row at the emulated batch ``128 * b / 32``, its time in
wall seconds (a global time scale, which the fitted efficiencies absorb; the MAPE does not depend on it).

Validation: ``orchestrator.costmodel.leave_one_gpu_out``: fit the calibration on the other GPUs' rows,
predict the held-out GPU from its datasheet specs, mean absolute percentage error over every held-out
row. The measurements CSV written here (``model,gpu,batch,step_time_s``, plus informational columns)
reproduces the figure with ``orchestrator model validate --measurements FILE``.

Also printed: the same validation without the baseline subtracted, and on the emulation's own formula
(no execution at all), which is the error left even with perfect measurements, i.e. the part due to the
emulation not being a workload the cost model can represent.

    python bench/model_accuracy.py [--batches 16,64] [--k80-step-s 0.6] [--seconds 35] [--out FILE.csv]
    python bench/model_accuracy.py --workdir DIR --analyze-only     # re-analyse the jobs of an earlier run
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.costmodel import (  # noqa: E402
    Measurement,
    Validation,
    fit_calibration,
    leave_one_gpu_out,
    predict_step_time,
)
from orchestrator.costmodel.calibration import predict  # noqa: E402

GPUS = ("k80", "p100", "v100")
MODEL = "resnet_cifar_32"  # the workload the emulation is built from (orchestrator.slots.EMULATED_MODEL)
MODEL_BATCH = 128  # ... at this batch (control/driver.REFERENCE_BATCH)
REFERENCE_BATCH = 32  # the jobs' batch_per_worker: the emulation's reference batch
CPU_GUESS_S = 0.03  # only to size the jobs


@dataclass(frozen=True)
class WorkerTime:
    gpu: str
    batch: int
    step_time_s: float
    steps: float  # steps it finished in the steady windows


def spec_text(name: str, storage: Path, workers: list[tuple[str, int]], k80_s: float, steps: int) -> str:
    wl = "".join(f"\n    - {{gpu: {g}, count: 1, spot: false, batch: {b}}}" for g, b in workers)
    return f"""name: {name}
provider: {{kind: local, revocations: none, emulation_k80_step_s: {k80_s}}}
storage: {storage}
training: {{job: resnet-cifar, hparam_set: resnet_tiny, mode: async, train_steps: {steps},
            batch_per_worker: {REFERENCE_BATCH}, checkpoint_every: {steps}, log_every: 10}}
cluster:
  parameter_servers: {{count: 1}}
  workers:{wl}
pricing: {{book: 2019-02}}
"""


def emulated_sleep_s(gpu: str, batch: int, k80_s: float) -> float:
    """The emulation's per-step sleep (control/driver.emulation), for sizing jobs and the floor only."""
    emulated = max(1, round(MODEL_BATCH * batch / REFERENCE_BATCH))
    return k80_s * predict_step_time(MODEL, gpu, emulated) / predict_step_time(MODEL, "k80", MODEL_BATCH)


def run_job(workdir: Path, name: str, workers: list[tuple[str, int]], k80_s: float, seconds: float) -> None:
    rate = sum(1.0 / (emulated_sleep_s(g, b, k80_s) + CPU_GUESS_S) for g, b in workers)
    steps = max(100, int(seconds * rate))
    spec = workdir / f"{name}.yaml"
    spec.write_text(spec_text(name, workdir / "runs", workers, k80_s, steps))
    env = {**os.environ, "ORCHESTRATOR_HOME": str(workdir / "home"),
           "ORCHESTRATOR_DB_URL": f"sqlite:///{workdir / 'results.db'}"}
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "launch", str(spec), "--quiet"],
                         env=env, capture_output=True, text=True, cwd=REPO)
    if out.returncode != 0:
        sys.exit(f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    print(f"  {name}: {steps} steps, {time.time() - t0:.0f} s", flush=True)


def steady_step_times(db_url: str, job_name: str) -> dict[int, WorkerTime]:
    """Per worker of the latest job called ``job_name``: steady step time (see the module docstring)."""
    with create_engine(db_url).connect() as conn:
        job_id = conn.execute(text("SELECT id FROM jobs WHERE name = :n AND status = 'succeeded' "
                                   "ORDER BY created_at DESC LIMIT 1"), {"n": job_name}).scalar()
        if job_id is None:
            sys.exit(f"no succeeded job '{job_name}' in {db_url}")
        steps = conn.execute(text("SELECT step, at FROM metrics WHERE job_id = :j AND kind = 'step' "
                                  "ORDER BY at, id"), {"j": job_id}).all()
        rows = conn.execute(text("SELECT step, at, worker, gpu, batch, step_time_s FROM metrics "
                                 "WHERE job_id = :j AND kind = 'worker'"), {"j": job_id}).all()
    times: dict[tuple[int, float], dict[int, float]] = defaultdict(dict)
    info: dict[int, tuple[str, int]] = {}
    for step, at, worker, gpu, batch, step_time in rows:
        info[int(worker)] = (str(gpu), int(batch))
        if step_time:
            times[(int(step), float(at))][int(worker)] = float(step_time)
    secs: dict[int, float] = defaultdict(float)
    done: dict[int, float] = defaultdict(float)
    warm = True
    for (s0, a0), (s1, a1) in zip(steps, steps[1:], strict=False):
        window = times.get((int(s1), float(a1)), {})
        if warm:  # the warm-up lasts until every worker has stepped in one window
            warm = set(window) != set(info)
            continue
        inverse = sum(1.0 / st for st in window.values())
        if inverse == 0:
            continue  # no step attributed to any worker (outputs lost with a worker): nothing to split
        for w in info:
            secs[w] += a1 - a0
            if w in window:
                done[w] += (s1 - s0) * (1.0 / window[w]) / inverse
    if not secs:
        sys.exit(f"job '{job_name}' logged too few steps to measure a steady step time; raise --seconds")
    return {w: WorkerTime(info[w][0], info[w][1], secs[w] / done[w], done[w]) for w in info if done[w] > 0}


def logo_predictions(rows: list[Measurement]) -> dict[tuple[str, int], float]:
    """(gpu, batch) -> the step time predicted with that GPU left out of the fit."""
    out = {}
    for gpu in sorted({m.gpu for m in rows}):
        calib = fit_calibration([m for m in rows if m.gpu != gpu])
        for m in rows:
            if m.gpu == gpu:
                out[(m.gpu, m.batch)] = predict(m, calib)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="16,64", help="per-worker batches, comma-separated (default 16,64)")
    ap.add_argument("--k80-step-s", type=float, default=0.6, help="emulation_k80_step_s of the GPU jobs")
    ap.add_argument("--seconds", type=float, default=35.0, help="approximate training seconds per job")
    ap.add_argument("--workdir", type=Path, help="the jobs' directory and results DB (default: a temp dir)")
    ap.add_argument("--analyze-only", action="store_true", help="re-analyse the jobs already in --workdir")
    ap.add_argument("--out", type=Path, help="measurements CSV (default: WORKDIR/model_accuracy.csv)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-model-accuracy-"))
    workdir.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{workdir / 'results.db'}"
    if not args.analyze_only:
        print(f"running {2 * len(batches)} local jobs in {workdir} (one at a time)", flush=True)
        for b in batches:
            run_job(workdir, f"acc-b{b}", [(g, b) for g in GPUS], args.k80_step_s, args.seconds)
            run_job(workdir, f"base-b{b}", [("k80", b)], 0.0, args.seconds * 0.6)

    measured: dict[tuple[str, int], WorkerTime] = {}
    baseline: dict[int, float] = {}
    for b in batches:
        for wt in steady_step_times(db_url, f"acc-b{b}").values():
            measured[(wt.gpu, wt.batch)] = wt
        (base,) = steady_step_times(db_url, f"base-b{b}").values()
        baseline[b] = base.step_time_s

    def emulated_batch(b: int) -> int:
        return MODEL_BATCH * b // REFERENCE_BATCH

    rows = [Measurement(MODEL, g, emulated_batch(b), measured[(g, b)].step_time_s - baseline[b])
            for g in GPUS for b in batches]
    raw = [Measurement(MODEL, g, emulated_batch(b), measured[(g, b)].step_time_s)
           for g in GPUS for b in batches]
    formula = [Measurement(MODEL, g, emulated_batch(b), emulated_sleep_s(g, b, args.k80_step_s))
               for g in GPUS for b in batches]
    if any((m.step_time_s or 0.0) <= 0 for m in rows):
        sys.exit("a baseline is not below the emulated step time; raise --k80-step-s")
    validation = leave_one_gpu_out(rows)
    predicted = logo_predictions(rows)

    out = args.out or workdir / "model_accuracy.csv"
    with out.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["model", "gpu", "batch", "step_time_s", "per_worker_batch", "measured_s",
                         "cpu_baseline_s", "steady_steps"])
        for m in rows:
            b = m.batch * REFERENCE_BATCH // MODEL_BATCH
            wt = measured[(m.gpu, b)]
            writer.writerow([m.model, m.gpu, m.batch, f"{m.step_time_s:.6f}", b, f"{wt.step_time_s:.6f}",
                             f"{baseline[b]:.6f}", f"{wt.steps:.0f}"])

    print(f"\nemulation: K80 sleeps {args.k80_step_s} s a step at batch {REFERENCE_BATCH}; rows are {MODEL} "
          f"at batch 128 * b / {REFERENCE_BATCH}; times = measured - CPU baseline (one worker, no emulation)")
    print(f"{'GPU':5} {'b':>4} {'as batch':>8} {'measured':>9} {'baseline':>9} {'emulated':>9} "
          f"{'predicted':>9} {'error':>7} {'steps':>6}")
    for m in rows:
        b = m.batch * REFERENCE_BATCH // MODEL_BATCH
        wt, p = measured[(m.gpu, b)], predicted[(m.gpu, m.batch)]
        t = m.step_time_s or 0.0
        print(f"{m.gpu:5} {b:4d} {m.batch:8d} {wt.step_time_s:9.4f} {baseline[b]:9.4f} {t:9.4f} {p:9.4f} "
              f"{(p - t) / t:+7.1%} {wt.steps:6.0f}")

    def line(label: str, v: Validation) -> str:
        per = ", ".join(f"{p.gpu} {p.mape:.1%}" for p in v.per_gpu)
        return f"{label}: {v.mape:.1%} ({per}; in-sample {v.in_sample_mape:.1%})"

    print("\nleave-one-GPU-out MAPE (fit on the other GPUs, predict this one from its specs)")
    print(line("  measured, CPU baseline subtracted", validation))
    print(line("  measured, raw (CPU time included)", leave_one_gpu_out(raw)))
    print(line("  the emulation's own formula (perfect measurements)", leave_one_gpu_out(formula)))
    print(f"\nwrote {out}; reproduce: orchestrator model validate --measurements {out}")


if __name__ == "__main__":
    main()
