"""The public rows and the fit of crossgpu.py's efficiencies, for bench/cross_gpu.py.

Rows: ../shared/public-throughput/throughput.csv with duplicate == 0, not SUSPECT, one GPU, a model that
bench/public_models.py builds and a GPU of data/gpu_arch.csv. Lambda's "fp32" is TF32 on Ampere (NGC
containers enable it; on older GPUs the TF32 peak falls back to FP32) and its "fp16" is AMP. Per table
cell the largest batch is the cross-GPU row (the GPU saturated); the other batches of the same cell are
kept apart for the same-GPU-other-batch questions.

The fit: per architecture x precision class, the tensor efficiency (matmuls), the memory efficiency and
the convolution / matmul speed ratio (``crossgpu.Efficiencies``), least squares in log time on the
ratios within each table x model x precision (a table's absolute level, its unit and its software
cancel), pulled toward the priors where the rows do not identify a parameter.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from public_models import PUBLIC_MODELS
from scipy.optimize import least_squares

from orchestrator.costmodel.crossgpu import (
    WEIGHT_PASSES,
    Efficiencies,
    arch_gpu,
    class_work,
    load_arch,
    precision_class,
)
from orchestrator.profiler.cache import torch_profile

ROOT = Path(__file__).resolve().parent.parent
TABLE = next((p / "shared" / "public-throughput" / "throughput.csv" for p in ROOT.parents
              if (p / "shared" / "public-throughput" / "throughput.csv").exists()), Path("throughput.csv"))
PRIOR_WEIGHT = 0.05  # pulls unidentified efficiencies toward the priors (log space)
CONV_PRIOR_WEIGHT = 0.05  # the conv / matmul ratio's pull toward 1
GPU_RIDGE: float | None = 1.0  # per-GPU deviations' pull toward 0 (None: architecture level only)
PER_EXAMPLE = ("cnn", "bert")  # families whose tables count examples (img/s, seq/s), not tokens


@dataclass(frozen=True)
class Row:
    group: tuple[str, str, str]  # (source, framework, model)
    precision: str
    gpu: str  # arch key
    batch: int
    y: float  # seconds per example (1 / throughput, in the table's unit)
    family: str
    factory: str

    @property
    def key(self) -> str:
        return f"{arch_gpu(self.gpu).arch}/{precision_class(self.precision)}"


def load_all_rows(path: Path) -> list[Row]:
    """Every usable single-GPU row, every batch."""
    publics = {g.public_name: g.key for g in load_arch().values() if g.public_name}
    out = []
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            if r["duplicate"] != "0" or "SUSPECT" in r["notes"] or r["num_gpus"] != "1":
                continue
            if r["model"] not in PUBLIC_MODELS or r["gpu"] not in publics or not r["batch_per_gpu"].isdigit():
                continue
            p = r["precision"]
            if r["source"].startswith(("lambdal", "LambdaColdStorage")):
                p = {"fp32": "tf32", "fp16": "amp"}.get(p, p)
            if p not in ("fp32", "tf32", "amp"):
                continue
            factory, family = PUBLIC_MODELS[r["model"]]
            out.append(Row((r["source"], r["framework"], r["model"]), p, publics[r["gpu"]], int(r["batch_per_gpu"]),
                           1.0 / float(r["throughput"]), family, factory))
    return out


def largest_batch(rows: list[Row]) -> list[Row]:
    """One row per table cell (table x model x precision x GPU): its largest batch."""
    best: dict[tuple[tuple[str, str, str], str, str], Row] = {}
    for row in rows:
        k = (row.group, row.precision, row.gpu)
        if k not in best or row.batch > best[k].batch:
            best[k] = row
    return list(best.values())


class Model:
    """Per-example model time of every row as a function of the log-efficiency vector
    ``[tensor (n), memory (n), conv ratio (n)]`` over ``keys`` (architecture / precision class)."""

    def __init__(self, rows: list[Row]) -> None:
        self.work = {f: class_work(torch_profile(f"{ROOT}/bench/public_models.py:{f}")[0])
                     for f in sorted({r.factory for r in rows})}
        self.keys = sorted({r.key for r in rows})
        self.n = len(self.keys)
        prior = Efficiencies()
        self.prior = np.log(np.array([prior.default_tensor[k.split("/")[1]] for k in self.keys]
                                     + [prior.default_memory] * self.n + [1.0] * self.n))

    def effs(self, x: np.ndarray) -> Efficiencies:
        n = self.n
        z = lambda v: dict(zip(self.keys, np.exp(v), strict=True))  # noqa: E731
        return Efficiencies(z(x[:n]), z(x[n:2 * n]), conv=z(x[2 * n:]))

    def times(self, rows: list[Row], eff: Efficiencies) -> np.ndarray:
        """Per-example seconds of each row (crossgpu.layer_seconds, vectorised over the rows of a model)."""
        return self.parts(rows, eff)[0]

    def parts(self, rows: list[Row], eff: Efficiencies) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(per-example seconds, the part in tensor-bound layers' tensor ops, the part bound by memory)."""
        out, tens, mem = np.empty(len(rows)), np.empty(len(rows)), np.empty(len(rows))
        by: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            by[r.factory].append(i)
        for f, idx in by.items():
            w = self.work[f]
            gs = [arch_gpu(rows[i].gpu) for i in idx]
            ps = [rows[i].precision for i in idx]
            gp = list(zip(gs, ps, strict=True))
            tensor = np.array([eff.tensor_eff(g.arch, p) * eff.gpu_tensor(g.key, p) * g.tensor_peak(p) for g, p in gp])
            conv = tensor * np.array([eff.conv_ratio(g.arch, p) for g, p in gp])
            bw = np.array([eff.memory_eff(g.arch, p) * eff.gpu_memory(g.key, p) * g.memory_bw_gbs * 1e9 for g, p in gp])
            scale = np.array([g.byte_scale(p) for g, p in zip(gs, ps, strict=True)])
            fp32 = np.array([g.fp32_tflops * 1e12 for g in gs])
            batch = np.array([rows[i].batch for i in idx], dtype=float)
            c = (np.outer(1 / tensor, w.tensor_flops - w.conv_flops) + np.outer(1 / conv, w.conv_flops)
                 + np.outer(1 / fp32, w.vector_flops))
            t = np.outer(1 / tensor, w.tensor_flops - w.conv_flops) + np.outer(1 / conv, w.conv_flops)
            m = np.outer(scale / bw, w.bytes)
            weights = WEIGHT_PASSES * w.weight_bytes.sum() / (bw * batch)
            out[idx] = np.maximum(c, m).sum(axis=1) + weights + eff.kernel_s * w.ops.sum() / batch
            tens[idx] = np.where(c >= m, t, 0.0).sum(axis=1)
            mem[idx] = np.where(c >= m, 0.0, m).sum(axis=1) + weights
        return out, tens, mem

    def fit(self, rows: list[Row], start: np.ndarray | None = None) -> tuple[Efficiencies, np.ndarray]:
        """(efficiencies scaled to the rows' absolute level, the log vector to warm-start a nearby fit)."""
        groups = defaultdict(list)
        for i, r in enumerate(rows):
            groups[(r.group, r.precision)].append(i)
        idx = [np.array(v) for v in groups.values() if len(v) > 1]
        logy = np.log([r.y for r in rows])
        used = {r.key for r in rows}
        conv_used = {r.key for r in rows if any(self.work[r.factory].conv_flops)}
        # an unidentified parameter is held near its prior; a conv ratio without a conv model stays at 1
        weight = np.concatenate([PRIOR_WEIGHT * np.array([0.2 + (k in used) for k in self.keys] * 2),
                                 CONV_PRIOR_WEIGHT * np.array([0.2 + (k in conv_used) for k in self.keys])])
        weight[2 * self.n:][[k not in conv_used for k in self.keys]] = 10.0

        def resid(x: np.ndarray) -> np.ndarray:
            d = logy - np.log(self.times(rows, self.effs(x)))
            return np.concatenate([d[i] - d[i].mean() for i in idx] + [weight * (x - self.prior)])

        x = least_squares(resid, self.prior if start is None else start, diff_step=1e-3, max_nfev=60).x
        eff = self.effs(x)
        if GPU_RIDGE is not None:
            eff = replace(eff, gpu=self.gpu_deviations(rows, eff, idx, logy))
        # the absolute level from the tables that count examples (img/s, seq/s); tok/s counts tokens
        level = [r for r in rows if r.family in PER_EXAMPLE] or rows
        scale = float(np.median(self.times(level, eff) / np.array([r.y for r in level])))
        return _scaled(eff, scale, used), x


    def gpu_deviations(self, rows: list[Row], eff: Efficiencies, idx: list[np.ndarray],
                       logy: np.ndarray) -> dict[str, float]:
        """Per GPU x precision class, how far its tensor and memory speeds sit from its architecture's:
        the log-time residual linearised in the two (d log t = -tensor share x dT - memory share x dM),
        ridge toward 0, alternating with each table cell's level. Closed form, so the per-fit cost stays
        that of the architecture fit; twice, re-linearised at the first answer."""
        keys = sorted({f"{r.gpu}/{precision_class(r.precision)}" for r in rows})
        at = {k: i for i, k in enumerate(keys)}
        gi = np.array([at[f"{r.gpu}/{precision_class(r.precision)}"] for r in rows])
        dev = np.zeros((len(keys), 2))
        for _ in range(2):
            e = replace(eff, gpu=_gpu_map(keys, dev))
            t, tens, mem = self.parts(rows, e)
            d = logy - np.log(t)
            s = np.stack([tens / t, mem / t], axis=1)  # d log t / d log(speed) = -share
            step = np.zeros_like(dev)
            level = np.zeros(len(rows))
            inside = np.zeros(len(rows), dtype=bool)  # rows of a cell with a second GPU: ratios exist
            for i in idx:
                inside[i] = True
            for _ in range(20):  # d = level(cell) - share . step(gpu), alternating the two
                for i in idx:
                    level[i] = (d[i] + (s[i] * step[gi[i]]).sum(axis=1)).mean()
                for k in range(len(keys)):
                    mine = (gi == k) & inside
                    a = s[mine]
                    step[k] = np.linalg.solve(a.T @ a + GPU_RIDGE * np.eye(2), -a.T @ (d[mine] - level[mine]))
            dev += step
        return _gpu_map(keys, dev)


def _gpu_map(keys: list[str], dev: np.ndarray) -> dict[str, float]:
    out = {}
    for k, (dt, dm) in zip(keys, dev, strict=True):
        out[f"{k}/tensor"], out[f"{k}/memory"] = float(np.exp(dt)), float(np.exp(dm))
    return out


def _scaled(eff: Efficiencies, scale: float, used: set[str]) -> Efficiencies:
    """Efficiencies x scale (same ratios, absolute level matched to the training rows); unmeasured
    architectures get the geometric mean of the measured ones."""
    t = {k: v * scale for k, v in eff.tensor.items() if k in used}
    m = {k: v * scale for k, v in eff.memory.items() if k in used}
    dt = {}
    for pc in ("fp32", "tf32", "fp16"):
        vals = [v for k, v in t.items() if k.endswith("/" + pc)]
        dt[pc] = float(np.exp(np.mean(np.log(vals)))) if vals else Efficiencies().default_tensor[pc]
    dm = float(np.exp(np.mean(np.log(list(m.values()))))) if m else 0.6
    conv = {k: v for k, v in eff.conv.items() if k in used and abs(v - 1.0) > 1e-6}
    return replace(Efficiencies(t, m, dt, dm, kernel_s=eff.kernel_s / scale), conv=conv, gpu=dict(eff.gpu))
