"""bench/cross_gpu_torchvision.py on a tiny subset: the held-out folds, the report, no GPU and no torchvision
(the profiles come from the committed bench/torchvision_work.json)."""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from orchestrator_testing.bench_cli import load_bench

MODELS = ("resnet18", "vgg11", "mnasnet0_5", "squeezenet1_1", "shufflenet_v2_x0_5")
GPUS = {"TitanXp": (2e-4, 1.3, 1.1), "RTX2080Ti": (1.5e-4, 1.2, 0.9), "TitanRTX": (1.8e-4, 1.0, 1.0),
        "A100-40GB-SXM": (1e-4, 0.8, 1.2)}  # per machine: (host s per layer, compute, memory factors)


def _bench() -> ModuleType:
    return load_bench("cross_gpu_torchvision")


def _table(bench: ModuleType, path: Path) -> Path:
    """The source table's columns, with steps made by the host predictor's own form (exact coefficients)."""
    work = bench.load_work()
    rows = [bench.Row(m, bench.arch_gpu(g).key, p, 1.0) for m in MODELS for g in GPUS for p in ("tf32", "amp")]
    feats = bench.features(rows, work, bench.load_efficiencies())
    label = {v: k for k, v in bench.PRECISIONS.items()}
    with path.open("w", newline="") as fh:
        out = csv.DictWriter(fh, ["model", "gpu", "num_gpus", "precision", "median_ms"])
        out.writeheader()
        for g, coef in GPUS.items():
            for m in MODELS:
                for p in ("tf32", "amp"):
                    step = float(feats[(m, bench.arch_gpu(g).key, p)] @ np.array(coef))
                    out.writerow({"model": f"tv-{m}", "gpu": g, "num_gpus": 1, "precision": label[p],
                                  "median_ms": step * 1e3})
                    out.writerow({"model": f"tv-{m}", "gpu": g, "num_gpus": 2, "precision": label[p],
                                  "median_ms": 1.0})  # multi-GPU rows are not questions
    return path


def test_held_out_evaluation_on_a_tiny_subset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    table = _table(bench, tmp_path / "steptime.csv")
    rows = bench.load_rows(table)
    assert len(rows) == len(MODELS) * len(GPUS) * 2
    results = bench.evaluate(rows, bench.load_work(), bench.eager_kernels())
    assert set(results) == {"naive", "model", "shipped", "host A-model", "host A", "host B", "calibrated A-model",
                            "calibrated A-model whole ratio", "calibrated A", "calibrated B", "calibrated B prior"}
    assert all(len(qs) == len(MODELS) * 2 * 4 * 3 for qs in results.values())  # ordered pairs of 4 GPUs
    summary = {n: bench.summary(qs) for n, qs in results.items()}
    # steps made by the host form: its held-out folds recover them (A: whole sub-family out), naive cannot
    assert summary["host A-model"]["mean"] < 0.01 and summary["host A"]["mean"] < 0.01
    assert summary["naive"]["mean"] > 0.1
    # the product's per-machine calibration (host_fit, other models' rows) beats its uncalibrated prior
    assert summary["calibrated A-model"]["mean"] < summary["shipped"]["mean"]
    # a GPU never measured: the other machines' host (host_fit.fit_for) beats the runtime prior's
    assert summary["calibrated B"]["mean"] < summary["calibrated B prior"]["mean"]
    assert set(summary["host A"]["subfamily"]) == {"resnet", "vgg", "mnasnet", "squeezenet", "shufflenet"}
    assert bench.main(["--table", str(table), "--models", "resnet18,vgg11,mnasnet0_5,squeezenet1_1"]) == 0
    out = capsys.readouterr().out
    assert "32 rows: 4 models x 4 GPUs x 2 precisions" in out and "SUMMARY" in out and "worst 5 (host A)" in out
    assert "host ms/layer" in out
    # the fitted-machines interval: calibrated A's 80th percentile, replacing only its own row of the file
    row = bench.interval_row(results)
    assert row["kind"] == "other-gpu-fitted" and row["n"] == len(results["calibrated A"]) and row["half_width"] > 0
    intervals = tmp_path / "intervals.csv"
    intervals.write_text(bench.INTERVALS.read_text())
    before = [r for r in csv.DictReader(intervals.open()) if r["kind"] != row["kind"]]
    bench.write_interval(row, intervals)
    bench.write_interval(row, intervals)
    after = list(csv.DictReader(intervals.open()))
    assert after[:-1] == before and float(after[-1]["half_width"]) == row["half_width"]


def test_the_source_table_names_gpus_with_facts() -> None:
    bench = _bench()
    if not bench.TABLE.exists():
        pytest.skip("../shared/public-throughput/steptime_ryujaehun.csv is not beside this checkout")
    rows = bench.load_rows()
    assert {r.gpu for r in rows} == {"titanxp", "rtx2080ti", "titanrtx", "a100"}
    assert {r.model for r in rows} == set(bench.load_work())  # every model of the table is profiled


def test_the_cached_profiles_mark_the_depthwise_convolutions() -> None:
    # host_fit scales depthwise layers apart; a work file rebuilt without them would silently fold them back
    work = _bench().load_work()
    with_dw = {m for m, w in work.items() if w.depthwise is not None and w.depthwise.any()}
    assert with_dw == {m for m in work if m.startswith(("mnasnet", "mobilenet", "shufflenet"))}
    assert int(work["mobilenet_v2"].depthwise.sum()) == 17  # one per inverted-residual block


def test_the_h200_rows_load_as_a_fifth_gpu_of_the_table() -> None:
    # bench/h200_torchvision_heldout.py: the lent H200's rows, by the table's protocol, held out as a fifth GPU
    heldout = load_bench("h200_torchvision_heldout")
    rows, timings = heldout.load_h200()
    assert len(rows) == 25 and {r.gpu for r in rows} == {"h200"}
    assert sum(r.precision == "tf32" for r in rows) == 20 and sum(r.precision == "amp" for r in rows) == 5
    assert {r.model for r in rows} <= set(_bench().load_work())
    twice = timings[("mobilenet_v2", "amp")]
    assert len(twice) == 2  # timed in both calls: the first is the row
    assert next(r for r in rows if (r.model, r.precision) == ("mobilenet_v2", "amp")).step_s == twice[0] / 1e3
