"""`orchestrator simulate` (simulate_command) and the DB replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.simulate_cmd import simulate_command
from orchestrator.model.errors import UserError

REPO = Path(__file__).resolve().parent.parent
K80 = REPO / "examples" / "reproduce-icac19.yaml"  # the 2019 GPUs: local provider / simulator, 2019-02 book
HETERO = REPO / "examples" / "gce-mixed-t4-l4-a100.yaml"  # today's GCE GPUs, 2026-11 book


def run(capsys: pytest.CaptureFixture[str], specs: list[Path], **kw: object) -> str:
    args: dict[str, object] = {
        "runs": 200,
        "seed": 1,
        "price_book": None,
        "trace": None,
        "json_out": False,
        "plot": None,
        "fit": False,
        "replay": None,
        "cloud": True,  # reproduce-icac19 is a local spec: simulate the 2019 cloud cluster it emulates
    }
    args.update(kw)
    simulate_command(specs, **args)  # type: ignore[arg-type]
    return capsys.readouterr().out


def test_json_for_one_and_several_specs(capsys: pytest.CaptureFixture[str]) -> None:
    one = json.loads(run(capsys, [K80], json_out=True))
    assert one["spec"] == "reproduce-icac19" and one["runs"] == 200
    for key in ("time_s", "cost_usd"):
        assert set(one[key]) == {"mean", "p10", "p50", "p90"}
    assert one["preemptible_24h_cap"] is True
    assert 0.0 <= one["p_miss_deadline"] <= 1.0 and 0.0 <= one["p_over_budget"] <= 1.0
    both = json.loads(run(capsys, [K80, HETERO], json_out=True))
    assert [s["spec"] for s in both] == ["reproduce-icac19", "mixed-t4-l4-a100"]
    assert both[1]["preemptible_24h_cap"] is False  # today's spot VMs: no 24 h cap
    assert "fitted to its own rows" in both[0]["revocation_model_by_gpu"]["k80"]
    assert "not in gce-preemptible-lifetimes-2019.csv" in both[1]["revocation_model_by_gpu"]["l4"]
    again = json.loads(run(capsys, [K80], json_out=True))
    assert again == one  # same seed, same numbers


def test_table_plot_and_fit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "cdf.png"
    out = run(capsys, [K80, HETERO], plot=png, fit=True)
    assert "reproduce-icac19" in out and "mixed-t4-l4-a100" in out and "P(miss deadline)" in out
    assert "revocation model for l4: not in" in out and "no 24 h cap" in out
    assert "bathtub" in out and "us-central1-c" in out  # the fit tables
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fit_json_only(capsys: pytest.CaptureFixture[str]) -> None:
    out = json.loads(run(capsys, [], fit=True, json_out=True))
    k80 = [f for f in out["fits"] if f["gpu"] == "k80" and f["zone"] is None]
    assert {f["kind"] for f in k80} == {"empirical", "exponential", "weibull", "bathtub"}


def test_user_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(UserError, match="give one or more job specs"):
        run(capsys, [])
    with pytest.raises(UserError, match="--runs"):
        run(capsys, [K80], runs=0)
    search = yaml.safe_load((REPO / "examples" / "gce-plan-search.yaml").read_text())
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(search))
    with pytest.raises(UserError, match="orchestrator plan"):
        run(capsys, [path])
    bad = tmp_path / "trace.csv"
    bad.write_text("gpu,zone\nk80,a\n")
    with pytest.raises(UserError, match="missing column"):
        run(capsys, [K80], trace=bad)


def test_replay_job_from_the_results_db(sqlite_url: str) -> None:
    from orchestrator.sim.replay_db import replay_job
    from orchestrator.store import db
    from orchestrator.store.models import Instance, Job, Metric

    spec = yaml.safe_load(K80.read_text())
    spec["training"]["train_steps"] = 2000
    t0 = 1000.0
    with db.open_session(sqlite_url) as session:
        session.add(
            Job(
                id="k80x4-spot-abc",
                name="k80x4-spot",
                provider="gce",
                mode="async",
                cluster_shape="1ps+chief+4xk80(spot)",
                spec_yaml=yaml.safe_dump(spec),
                storage_uri="gs://b/x",
                price_book="2019-02",
                status="succeeded",
                outcome="succeeded",
                train_steps=2000,
                final_step=2000,
                created_at=t0,
                started_at=t0,
                ended_at=t0 + 400.0,
                updated_at=t0 + 400.0,
            )
        )
        session.flush()

        def inst(role: str, index: int, gen: int, requested: float, revoked: float | None = None) -> None:
            session.add(
                Instance(
                    job_id="k80x4-spot-abc",
                    name=f"k80x4-spot-abc-{role}-{index}-{gen}",
                    role=role,
                    slot_index=index,
                    generation=gen,
                    gpu="k80" if role == "worker" else None,
                    machine_type="n1-standard-4",
                    zone="us-central1-c",
                    spot=role == "worker",
                    price_per_hour=0.256 if role == "worker" else 0.143,
                    status="deleted",
                    requested_at=requested,
                    ready_at=requested + 60.0,
                    revoked_at=revoked,
                    end_reason="preempted" if revoked else "job_finished",
                    deleted_at=revoked or t0 + 400.0,
                    updated_at=t0,
                )
            )

        inst("ps", 0, 0, t0)
        inst("chief", 0, 0, t0)
        for i in range(4):
            inst("worker", i, 0, t0, revoked=t0 + 150.0 if i == 2 else None)
        inst("worker", 2, 1, t0 + 150.0)
        for w in range(4):
            session.add(
                Metric(
                    job_id="k80x4-spot-abc",
                    kind="worker",
                    worker=w,
                    gpu="k80",
                    step=100,
                    step_time_s=0.5,
                    batch=128,
                    at=t0 + 100.0,
                )
            )
        session.flush()
        result = replay_job(session, "k80x4-spot-abc")
        with pytest.raises(UserError, match="no job"):
            replay_job(session, "nope")
    assert result["schedule"] == [{"slot": "worker-2", "at_s": 150.0}]
    assert result["boot_delay_s"] == 60.0
    assert result["step_rates"] == {f"worker-{w}": 2.0 for w in range(4)}
    sim = result["simulated"]
    assert sim["finished"] and sim["revocations"] == 1 and sim["replacements"] == 1
    assert result["measured"]["revocations"] == 1 and result["measured"]["replacements"] == 1
    # 4 workers x 2 steps/s from 60 s; worker-2 gone 150-210 s; checkpoints at 1000 steps
    assert 300.0 < sim["wall_time_s"] < 400.0
