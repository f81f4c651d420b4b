"""Cross-GPU step-time prediction on public measurements, with whole model families (and GPUs) held out.

Truth: ../shared/public-throughput/throughput.csv (rows and fit: bench/cross_gpu_fit.py). A question is
"from a measured point of model M at precision P on GPU A (one table), what is its step on GPU B":
prediction = A's step x model(B) / model(A). Two protocols, both always reported:

  A  "new model": every fit leaves out the question's whole model family; the target GPU's
     efficiencies are fitted from OTHER families' public rows. This is the product's situation: the
     catalog GPUs are calibrated from public tables, the user's model is new and measured on one GPU.
  B  "new model and new GPU": every fit leaves out the family AND the target GPU (its architecture's
     efficiencies come from its other GPUs, or the mean over architectures).

  A-model: only the model itself is left out (its rows in every table); its family's other models
     stay in the fit (looser than A: a user's new CNN beside the public CNNs).
  A-model+family: A-model's questions, each GPU x precision's prediction corrected by the mean residual of
     the family's other models there (a trial, not the product's: 18.8% -> 16.8% mean, 2026-11-28; the
     product would need to know the user's model's family, and rnn has one model, so no neighbour).

Plus a leave-one-table-out check (each source's rows predicted by a fit on the other sources). The
interval widths (80th percentile of protocol A's held-out error, by kind of question and batch distance)
go to data/crossgpu_intervals.csv with --write; the fit on every row to data/crossgpu_fit.json.

    python bench/cross_gpu.py            # tables
    python bench/cross_gpu.py --write    # also data/crossgpu_fit.json and data/crossgpu_intervals.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cross_gpu_fit import PER_EXAMPLE, ROOT, TABLE, Model, Row, largest_batch, load_all_rows  # noqa: E402

from orchestrator.costmodel.crossgpu import INTERVAL_KINDS, Efficiencies, precision_class  # noqa: E402

Q = dict[str, Any]
GOAL_MEAN, GOAL_PAIR = 0.10, 0.15
WIDTH_QUANTILE = 80
MIN_QUESTIONS = 8  # a batch-distance band with fewer held-out questions is folded into the one below
COMMAND = "python bench/cross_gpu.py --write"


def pairs_of(rows: list[Row], same_gpu: bool = False) -> list[tuple[Row, Row]]:
    """(from, to) of one table and model: on two GPUs (any precision) or, ``same_gpu``, one GPU and
    precision at two batches."""
    by = defaultdict(list)
    for r in rows:
        by[r.group].append(r)
    return [(a, b) for rs in by.values() for a in rs for b in rs
            if (a.gpu == b.gpu and a.precision == b.precision and a.batch != b.batch) == same_gpu
            and (same_gpu or a.gpu != b.gpu)]


def answer(model: Model, pairs: list[tuple[Row, Row]], eff: Efficiencies, protocol: str) -> list[Q]:
    if not pairs:
        return []
    ta = model.times([a for a, _ in pairs], eff)
    tb = model.times([b for _, b in pairs], eff)
    out = []
    for (a, b), ta_, tb_ in zip(pairs, ta, tb, strict=True):
        kind = ("same-gpu" if a.gpu == b.gpu else "other-gpu") if a.precision == b.precision \
            else "other-gpu-precision"
        out.append({"protocol": protocol, "from": a.gpu, "to": b.gpu, "precision": b.precision,
                    "from_precision": a.precision, "family": b.family, "model": b.group[2],
                    "source": b.group[0].split(" ")[0], "kind": kind, "err": a.y * tb_ / ta_ / b.y - 1.0,
                    "doublings": abs(math.log2(b.batch / a.batch))})
    return out


def protocol_a(model: Model, rows: list[Row], every: list[Row]) -> tuple[list[Q], dict[str, np.ndarray]]:
    """Each family's questions from a fit on the other families (every GPU): cross-GPU, same-GPU at
    another batch, and with nothing measured (absolute)."""
    out: list[Q] = []
    starts = {}
    for f in sorted({r.family for r in rows}):
        eff, starts[f] = model.fit([r for r in rows if r.family != f])
        test = [r for r in rows if r.family == f]
        out += answer(model, pairs_of(test), eff, "A")
        out += answer(model, pairs_of([r for r in every if r.family == f], same_gpu=True), eff, "A")
        if f in PER_EXAMPLE:  # nothing measured; tok/s tables count tokens, the profiles sequences
            out += [{"protocol": "A", "kind": "none", "family": f, "err": float(e), "doublings": 0.0}
                    for e in model.times(test, eff) / np.array([r.y for r in test]) - 1.0]
    return out, starts


def protocol_model(model: Model, rows: list[Row], starts: dict[str, np.ndarray]) -> tuple[list[Q], list[Q]]:
    """Each model's questions from a fit without that model's rows in any table (its factory), the other
    models of its family kept: a user's new CNN next to the public CNNs. Second, the same questions with a
    per GPU x precision correction of the family (``family_correction``, from its other models' rows)."""
    out: list[Q] = []
    corrected: list[Q] = []
    for f in sorted({r.factory for r in rows}):
        test = [r for r in rows if r.factory == f]
        train = [r for r in rows if r.factory != f]
        eff, _ = model.fit(train, starts[test[0].family])
        qs = answer(model, pairs_of(test), eff, "A-model")
        out += qs
        corr = family_correction(model, [r for r in train if r.family == test[0].family], eff)
        key = lambda gpu, p: f"{gpu}/{precision_class(p)}"  # noqa: E731
        corrected += [{**q, "protocol": "A-model+family", "err": (1 + q["err"]) * math.exp(
            corr.get(key(q["to"], q["precision"]), 0.0) - corr.get(key(q["from"], q["from_precision"]), 0.0)) - 1}
            for q in qs]
    return out, corrected


def family_correction(model: Model, family_rows: list[Row], eff: Efficiencies, ridge: float = 0.5) -> dict[str, float]:
    """Per GPU x precision class, the mean log-time residual of the fitted model on a family's rows (each table
    cell's level removed; ridge toward 0): how much faster or slower the family runs there than the op
    classes say. Tried 2026-11-28 as a product feature; see the SUMMARY line it prints."""
    if not family_rows:
        return {}
    d = np.log([r.y for r in family_rows]) - np.log(model.times(family_rows, eff))
    cells: dict[tuple[object, str], list[int]] = defaultdict(list)
    for i, r in enumerate(family_rows):
        cells[(r.group, r.precision)].append(i)
    idx = [np.array(v) for v in cells.values() if len(v) > 1]
    keys = sorted({f"{r.gpu}/{precision_class(r.precision)}" for r in family_rows})
    gi = np.array([keys.index(f"{r.gpu}/{precision_class(r.precision)}") for r in family_rows])
    c, level, inside = np.zeros(len(keys)), np.zeros(len(family_rows)), np.zeros(len(family_rows), dtype=bool)
    for i in idx:
        inside[i] = True
    for _ in range(30):  # d = level(cell) + c(gpu, precision), alternating the two
        for i in idx:
            level[i] = (d[i] - c[gi[i]]).mean()
        for k in range(len(keys)):
            mine = (gi == k) & inside
            c[k] = (d[mine] - level[mine]).sum() / (mine.sum() + ridge)
    return dict(zip(keys, c.tolist(), strict=True))


def protocol_b(model: Model, rows: list[Row], starts: dict[str, np.ndarray]) -> list[Q]:
    """Each family's questions that end on GPU G, from a fit without the family and without G."""
    out: list[Q] = []
    for g in sorted({r.gpu for r in rows}):
        for f in sorted({r.family for r in rows}):
            test = [r for r in rows if r.family == f]
            if not any(r.gpu == g for r in test):
                continue
            eff, _ = model.fit([r for r in rows if r.gpu != g and r.family != f], starts[f])
            out += answer(model, [(a, b) for a, b in pairs_of(test) if b.gpu == g], eff, "B")
    return out


def leave_table_out(model: Model, rows: list[Row]) -> list[Q]:
    """Each source's questions from a fit on the other sources' rows (families not held out)."""
    src = lambda r: r.group[0].split(" ")[0]  # noqa: E731
    out: list[Q] = []
    for s in sorted({src(r) for r in rows}):
        eff, _ = model.fit([r for r in rows if src(r) != s])
        out += answer(model, pairs_of([r for r in rows if src(r) == s]), eff, "table")
    return out


def index_floor(rows: list[Row], per_family: bool) -> float:
    """In sample (NOT held out): the mean error left by a free speed index per GPU x precision (x family),
    fitted on every row with each table cell's level; how far any per-GPU scaling could go on these tables."""
    gk = [(r.gpu, r.precision) + ((r.family,) if per_family else ()) for r in rows]
    cell = [(r.group, r.precision) for r in rows]
    d = np.log([r.y for r in rows])
    index: dict[tuple[str, ...], float] = defaultdict(float)
    for _ in range(60):  # alternating least squares of log y = level(cell) + index(gpu, precision[, family])
        by_cell = defaultdict(list)
        for i, c in enumerate(cell):
            by_cell[c].append(d[i] - index[gk[i]])
        level = {c: float(np.mean(v)) for c, v in by_cell.items()}
        by_gpu = defaultdict(list)
        for i, g in enumerate(gk):
            by_gpu[g].append(d[i] - level[cell[i]])
        index = defaultdict(float, {g: float(np.mean(v)) for g, v in by_gpu.items()})
    at = {id(r): i for i, r in enumerate(rows)}
    errs = [math.expm1(d[at[id(a)]] - index[gk[at[id(a)]]] + index[gk[at[id(b)]]] - d[at[id(b)]])
            for a, b in pairs_of(rows) if a.precision == b.precision]
    return float(np.mean(np.abs(errs)))


def _table(title: str, head: list[str], rows: list[list[object]]) -> None:
    print(f"\n{title}")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    for line in [head, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=False)))


def _mean(qs: list[Q]) -> float:
    return float(np.mean(np.abs([q["err"] for q in qs]))) if qs else float("nan")


def _summ(qs: list[Q]) -> list[str]:
    a = np.abs([q["err"] for q in qs])
    return [str(len(qs)), f"{a.mean():.1%}", f"{np.percentile(a, 80):.1%}", f"{a.max():.1%}"]


def pair_means(qs: list[Q]) -> dict[tuple[str, str, str], float]:
    pairs = defaultdict(list)
    for q in qs:
        pairs[(q["from"], q["to"], q["precision"])].append(q["err"])
    return {k: float(np.mean(np.abs(v))) for k, v in pairs.items()}


def report(name: str, qs: list[Q], show_all: bool) -> dict[str, Any]:
    """Same-precision questions from one measured GPU to another: by precision, family, pair; worst."""
    same = [q for q in qs if q["kind"] == "other-gpu"]
    cross = [q for q in qs if q["kind"] == "other-gpu-precision"]
    head = ["n", "mean |err|", "p80", "max"]
    print(f"\n==== protocol {name}: {len(same)} same-precision questions, {len(cross)} cross-precision ====")
    _table("by precision", ["precision", *head], [[p, *_summ([q for q in same if q["precision"] == p])]
                                                  for p in sorted({q["precision"] for q in same})])
    _table("by model family", ["family", *head], [[f, *_summ([q for q in same if q["family"] == f])]
                                                  for f in sorted({q["family"] for q in same})])
    means = pair_means(same)
    under = sum(m < GOAL_PAIR for m in means.values())
    rows = sorted(([a, b, p, f"{m:.1%}"] for (a, b, p), m in means.items()), key=lambda r: -float(r[3][:-1]))
    _table(f"GPU pair x precision: {under} of {len(means)} under {GOAL_PAIR:.0%} mean "
           f"({'all' if show_all else 'the 10 worst; --all prints every pair'})", ["from", "to", "precision",
                                                                                    "mean |err|"],
           rows if show_all else rows[:10])
    worst = sorted(same, key=lambda q: -abs(q["err"]))[:10]
    _table("worst points", ["from", "to", "precision", "model", "source", "err"],
           [[q["from"], q["to"], q["precision"], q["model"], q["source"], f"{q['err']:+.1%}"] for q in worst])
    print(f"cross-precision questions: mean |err| {_mean(cross):.1%}")
    return {"mean": _mean(same), "by_precision": {p: _mean([q for q in same if q["precision"] == p])
                                                  for p in sorted({q["precision"] for q in same})},
            "by_family": {f: _mean([q for q in same if q["family"] == f]) for f in sorted({q["family"] for q in same})},
            "pairs": len(means), "pairs_under_15pct": under, "worst_pair": max(means.values()),
            "cross_precision_mean": _mean(cross)}


def widths(qs: list[Q]) -> list[dict[str, Any]]:
    """The interval half-width per kind and batch distance: the 80th percentile of |log(pred/true)|,
    as a relative width (true within step / (1 + w) .. step x (1 + w) for 80% of held-out questions)."""
    out = []
    for kind in INTERVAL_KINDS:
        mine = [q for q in qs if q["kind"] == kind]
        bands: dict[int, list[float]] = defaultdict(list)
        for q in mine:
            bands[min(round(q["doublings"]), 3)].append(abs(math.log1p(q["err"])))
        held: list[float] = []
        for d in sorted(bands):  # a thin band joins the next one out
            held += bands[d]
            if len(held) >= MIN_QUESTIONS or d == max(bands):
                w = math.expm1(float(np.percentile(held, WIDTH_QUANTILE)))
                out.append({"kind": kind, "batch_doublings": d, "half_width": round(w, 4), "n": len(held)})
                held = []
    return out


def write(model: Model, rows: list[Row], qs: list[Q], summary: dict[str, Any]) -> None:
    eff, _ = model.fit(rows)
    ws = widths(qs)
    at0 = {w["kind"]: w["half_width"] for w in sorted(ws, key=lambda w: -w["batch_doublings"])}
    doc = Efficiencies(eff.tensor, eff.memory, eff.default_tensor, eff.default_memory,
                       {k: at0.get(k, v) for k, v in Efficiencies().interval.items()},
                       {"by": COMMAND, "table": "../shared/public-throughput/throughput.csv", **summary},
                       eff.kernel_s, eff.conv, eff.gpu).to_dict()
    (ROOT / "data" / "crossgpu_fit.json").write_text(json.dumps(doc, indent=1) + "\n")
    method = (f"{WIDTH_QUANTILE}th percentile of |log(predicted/true)| over protocol A's held-out questions "
              "(the model family left out of the fit) of this kind, within this many batch doublings of the "
              "measured point (a band under {MIN_QUESTIONS} questions joins the next)").replace(
        "{MIN_QUESTIONS}", str(MIN_QUESTIONS))
    path = ROOT / "data" / "crossgpu_intervals.csv"
    with path.open(newline="") as fh:  # rows of other kinds are other benches' (cross_gpu_torchvision.py --write)
        kept = [r for r in csv.DictReader(fh) if r["kind"] not in INTERVAL_KINDS]
    with path.open("w", newline="") as fh:
        out = csv.DictWriter(fh, ["kind", "batch_doublings", "half_width", "n", "source", "method"])
        out.writeheader()
        for w in ws:
            out.writerow({**w, "source": f"{COMMAND} (bench/cross_gpu.py on ../shared/public-throughput)",
                          "method": method})
        out.writerows(kept)
    print("wrote data/crossgpu_fit.json and data/crossgpu_intervals.csv:")
    for w in ws:
        print(f"  {w['kind']:<20} within {w['batch_doublings']} doublings: +-{w['half_width']:.0%} (n={w['n']})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--write", action="store_true", help="write data/crossgpu_fit.json and the intervals")
    parser.add_argument("--all", action="store_true", help="print every GPU pair")
    args = parser.parse_args()
    every = load_all_rows(args.table)
    rows = largest_batch(every)
    print(f"{len(rows)} rows (largest batch per table cell; {len(every)} with every batch): "
          f"{len({r.gpu for r in rows})} GPUs, {len({r.group for r in rows})} tables x models, "
          f"families {sorted({r.family for r in rows})}")
    model = Model(rows)
    qa, starts = protocol_a(model, rows, every)
    qm, qf = protocol_model(model, rows, starts)
    qb = protocol_b(model, rows, starts)
    qt = leave_table_out(model, rows)
    summary = {"A": report("A (new model: family held out, target GPU fitted on other families' rows)", qa,
                           args.all),
               "A-model": report("A-model (only the model itself held out: its family's other models stay "
                                 "in the fit)", qm, args.all),
               "A-model+family": report("A-model+family (A-model, each GPU x precision corrected by the "
                                        "residual of the family's other models)", qf, args.all),
               "B": report("B (new model and new GPU: family and target GPU held out)", qb, args.all)}
    table = [q for q in qt if q["kind"] == "other-gpu"]
    print("\nleave-one-table-out (each source from a fit on the others; families not held out): "
          + ", ".join(f"{s} {_mean([q for q in table if q['source'] == s]):.1%}"
                      for s in sorted({q["source"] for q in table})) + f"; all {_mean(table):.1%}")
    same_gpu = [q for q in qa if q["kind"] == "same-gpu"]
    none = [q for q in qa if q["kind"] == "none"]
    print(f"same GPU, other batch (A): mean |err| {_mean(same_gpu):.1%} over {len(same_gpu)} questions; "
          f"nothing measured (A, absolute, {'/'.join(PER_EXAMPLE)} tables): mean |err| {_mean(none):.1%}")
    print(f"in-sample floor (not held out): a free speed index per GPU x precision fitted on every row leaves "
          f"{index_floor(rows, False):.1%} mean; one per GPU x precision x family {index_floor(rows, True):.1%}")
    print("\nSUMMARY (same precision, one measured GPU -> another; Habitat ATC'21 anchor 11.8% mean)")
    for name, s in summary.items():
        ok = s["mean"] < GOAL_MEAN and s["worst_pair"] < GOAL_PAIR
        print(f"  protocol {name}: mean |err| {s['mean']:.1%} (" + ", ".join(
            f"{p} {v:.1%}" for p, v in s["by_precision"].items()) + "; " + ", ".join(
            f"{f} {v:.1%}" for f, v in s["by_family"].items()) + f"); pairs x precision under 15%: "
            f"{s['pairs_under_15pct']}/{s['pairs']}; worst pair {s['worst_pair']:.1%}; "
            f"goal (< {GOAL_MEAN:.0%} mean, every pair < {GOAL_PAIR:.0%}) {'MET' if ok else 'NOT met'}")
    print("  the goal is judged on protocol A, the product's situation (catalog GPUs calibrated from public "
          "tables, the user's model and its family new); A-model is looser (a public model of the same family "
          "in the fit), B stricter (the GPU unseen as well); A-model+family was tried as a product feature and "
          "not kept: it needs the user's model's family, and gains about 2 points")
    if args.write:
        kept = {k: v for k, v in summary.items() if k != "A-model+family"}  # the trial is not the product's
        write(model, rows, qa, {"held_out": "A: model family; B: family and target GPU", **kept})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
