"""`orchestrator simulate --strategies`: one spec's cluster as data parallel, pipeline and hybrid, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.cli.model_torch import prepare_spec
from orchestrator.cli.render import console, money, table
from orchestrator.costmodel import Calibration
from orchestrator.costmodel.revocation.model import RevocationModel
from orchestrator.model.errors import UserError
from orchestrator.model.spec import TrainingMode, load_spec
from orchestrator.planning.calibration import planning_calibration
from orchestrator.sim.from_spec import SimSpecError
from orchestrator.sim.strategies import compare_strategies


def strategies_command(specs: list[Path], runs: int, seed: int, price_book: str | None,
                       calibration: Calibration | None, cloud: bool, model: RevocationModel, kind: str,
                       json_out: bool) -> None:
    docs = []
    for path in specs:
        prepare_spec(path)
        spec = load_spec(path)
        if spec.mode != TrainingMode.SYNC:  # pipeline and hybrid split one synchronous step
            raise UserError(f"{path}: --strategies compares ways to run a synchronous job; this one is "
                            f"training.mode: {spec.mode.value} (drop --strategies, or set mode: sync)")
        try:
            calib = calibration if calibration is not None else planning_calibration(spec, as_cloud=cloud)
            outcomes = compare_strategies(spec, runs, seed, model=model, kind=kind, calibration=calib,
                                          price_book=price_book, as_cloud=cloud)
        except SimSpecError as exc:
            raise UserError(f"{path}: {exc}") from None
        docs.append({"path": str(path), "spec": spec.name, "runs": runs, "seed": seed,
                     "strategies": [o.to_dict() for o in outcomes]})
    if json_out:
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
        return
    for doc in docs:
        _print(doc)


def _print(doc: dict[str, Any]) -> None:
    def h(x: float | None) -> str:
        return "" if x is None else f"{x:.3g} h"

    rows = []
    for s in doc["strategies"]:
        loss = "" if s["strategy"] == "data" else s["stage_loss"]  # data parallel survivors train on
        planned = f"{h(s.get('plan_expected_hours'))}, {money(s['plan_expected_usd'])}" \
            if s.get("plan_expected_usd") is not None else ""
        if not s["fits"]:
            rows.append([s["strategy"], loss, "does not fit", planned, "", "", ""])
            continue
        rows.append([s["strategy"], loss, "yes", planned,
                     f"{h(s['hours']['mean'])} (p90 {h(s['hours']['p90'])})",
                     f"{money(s['usd']['mean'])} (p90 {money(s['usd']['p90'])})", f"{s['revocations_mean']:.2f}"])
    title = (f"{doc['spec']}: {doc['runs']} simulated runs per strategy (seed {doc['seed']}); "
             "pipeline 'wait': a lost stage waits for its replacement, 'auto': or re-partitions over the survivors")
    console.print(table(title, ["strategy", "stage loss", "fits", "plan (analytic)", "time mean", "cost mean",
                                "revocations"], rows))
