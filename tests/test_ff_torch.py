"""The daemon's PyTorch decisions, fast-forwarded (tests/fastforward.py with tests/fastforward_torch.py, the torchrun
payload's protocol): what tests/test_torch_e2e.py and tests/test_local_deadline_elastic_e2e.py check with real
torchrun training (minutes each, load-dependent), on a virtual clock, in seconds, the same every run. Those stay for
the payload's own contract (DDP, DCP, the rendezvous); these assert the same daemon-side outcomes: the events, the
world sizes, the splits, the deadline met, the job succeeded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import ELASTIC_DEADLINE_S, elastic_spec
from fastforward import Run, example_spec, fast_forward, spec_of
from sqlalchemy import create_engine, text

from orchestrator.cli.deadline_report import deadline_section
from orchestrator.cli.torch_report import resplits, training_section, worker_batches
from orchestrator.clock import VirtualClock
from orchestrator.store import queries
from orchestrator.store.db import open_session


def _notes(tmp_path: Path) -> list[tuple[str, str, float]]:
    with create_engine(f"sqlite:///{tmp_path}/results.db").connect() as conn:
        rows = conn.execute(text("SELECT to_status, reason, at FROM events WHERE entity = 'note' ORDER BY at, id"))
        return [(str(k), str(r or ""), float(at)) for k, r, at in rows]


def _report(tmp_path: Path, run: Run) -> tuple[dict[str, Any], list[str], list[str]]:
    """The job's summary row, and `orchestrator report`'s training and deadline sections (read as the CLI does)."""
    with open_session(f"sqlite:///{tmp_path}/results.db", clock=VirtualClock(run.job["ended_at"])) as session:
        rows = queries.job_summaries(session, [run.job["id"]])
        return rows[0], training_section(session, rows), deadline_section(session, rows)


def test_torch_hetero_shrinks_and_grows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/local-torch-hetero.yaml, 400 steps, the spot P100 revoked at step 30: every rank checkpoints on the
    notice, the world shrinks 3 -> 2, the replacement joins and it grows 2 -> 3."""
    spec = example_spec("local-torch-hetero", tmp_path, training={"train_steps": 400},
                        provider={"schedule": [{"instance": "worker-1", "at_step": 30}]})
    run = fast_forward(spec, tmp_path, monkeypatch)
    summary, training, _ = _report(tmp_path, run)
    assert summary["status"] == "succeeded" and summary["accuracy"] > 0.5, run.timeline()
    assert summary["revocations"] == 1 and summary["replacements"] == 1, run.timeline()
    notes = _notes(tmp_path)
    kinds = [k for k, _, _ in notes]
    assert "ckpt_on_notice" in kinds, run.timeline()
    shrink = [r for k, r, _ in notes if k == "shrink"]
    grow = [r for k, r, _ in notes if k == "grow"]
    assert shrink and shrink[0].startswith("world 3 -> 2"), run.timeline()
    assert grow and grow[0].startswith("world 2 -> 3") and kinds.index("shrink") < kinds.index("grow")
    noticed = next(r for k, r, _ in notes if k == "ckpt_on_notice")
    resumed = int(shrink[0].split(" at step ")[1].split(";")[0])
    assert f"at step {resumed}:" in noticed  # the survivors resumed from the notice's checkpoint: no step lost
    assert '"1"' not in shrink[0] and '"1"' in grow[0]  # the P100's slot left the world, then came back
    assert run.instances[run.started[1]]["end_reason"] == "preempted"  # worker-1's first instance
    with create_engine(f"sqlite:///{tmp_path}/results.db").connect() as conn:
        instances = conn.execute(text("SELECT COUNT(*) FROM instances")).scalar()
        ledger = conn.execute(text("SELECT COUNT(*), SUM(seconds) FROM ledger")).one()
    assert ledger[0] == instances == 4 and ledger[1] > 0  # every instance billed, the revoked one included
    report = "\n".join(training)
    assert "3@0 → 2@" in report and "pytorch" in report, report


def test_a_running_job_resplits_when_a_worker_slows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/local-torch-resplit.yaml, shorter: worker 0 (the V100) slows 4x at step 30, worker 1 is 1.25x slower
    from step 0; the ranks probe their compute every 10 steps and move examples off the slow ones."""
    slowdowns = [{"worker": 0, "at_step": 30, "factor": 4}, {"worker": 1, "at_step": 0, "factor": 1.25}]
    spec = example_spec("local-torch-resplit", tmp_path, provider={"slowdowns": slowdowns},
                        training={"train_steps": 150, "resplit_every": 10, "checkpoint_every": 150})
    run = fast_forward(spec, tmp_path, monkeypatch)
    assert run.job["status"] == "succeeded", run.timeline()
    with open_session(f"sqlite:///{tmp_path}/results.db", clock=VirtualClock(run.job["ended_at"])) as session:
        split, batches = resplits(session, run.job["id"]), worker_batches(session, run.job["id"])
    before = [r for r in split if r["step"] <= 30]
    after = [r for r in split if r["step"] > 30]
    assert after, split
    planned = batches["0"]["planned"]
    assert planned is not None and after[-1]["batches"]["0"] < planned, (planned, after)  # the V100 gave examples
    assert before and before[0]["batches"]["1"] < before[0]["previous"]["1"], before  # ... as the slow P100 did
    assert all(sum(r["batches"].values()) == 96 for r in split)  # the global batch never changes
    assert batches["0"]["reported"] == after[-1]["batches"]["0"]
    assert all(r["compute_s"] and r["compute_s"]["0"] > r["compute_s"]["2"] for r in after[:1]), after


def _lose_stage_1(example: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Run, dict[str, Any]]:
    """``example`` (a 3-stage pipeline), 120 steps, its P100 stage (worker-1) revoked at step 30: the run and its
    summary row."""
    spec = example_spec(example, tmp_path, training={"train_steps": 120, "checkpoint_every": 60},
                        provider={"schedule": [{"instance": "worker-1", "at_step": 30}]})
    run = fast_forward(spec, tmp_path, monkeypatch)
    return run, _report(tmp_path, run)[0]


def test_a_pipeline_re_partitions_over_the_survivors_where_waiting_is_dearer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/local-pipeline-repartition.yaml, shorter: the P100 stage is revoked at step 30; waiting for its
    replacement is predicted dearer than going on over the V100 and the K80, so the controller records both
    options, replaces nothing, and restarts the survivors as a 2-stage pipeline from the notice's checkpoint."""
    run, summary = _lose_stage_1("local-pipeline-repartition", tmp_path, monkeypatch)
    assert summary["status"] == "succeeded" and summary["revocations"] == 1 and summary["replacements"] == 0, (
        run.timeline())
    assert summary["accuracy"] > 0.5
    notes = _notes(tmp_path)
    kinds = [k for k, _, _ in notes]
    decided = [r for k, r, _ in notes if k == "repartition"]
    assert len(decided) == 1 and "Predicted: wait" in decided[0], run.timeline()
    assert "re-partition over worker-0, worker-2" in decided[0], decided
    assert "ckpt_on_notice" in kinds and kinds.index("ckpt_on_notice") < kinds.index("restart"), run.timeline()
    shrink = [r for k, r, _ in notes if k == "shrink"]  # the 2-stage world, stages worker-0 and worker-2
    assert shrink and shrink[-1].startswith("world 3 -> 2") and '"1"' not in shrink[-1], run.timeline()
    assert "grow" not in kinds, run.timeline()
    noticed = [r for k, r, _ in notes if k == "ckpt_on_notice"][0]
    resumed = int(shrink[-1].split(" at step ")[1].split(";")[0])
    assert resumed > 0 and f"at step {resumed}:" in noticed, (noticed, shrink)  # from the notice's checkpoint
    assert sorted(i["slot"] for i in run.instances.values()) == ["worker-0", "worker-1", "worker-2"]  # none new


def test_a_pipeline_waits_for_the_replacement_of_a_lost_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/local-pipeline.yaml (stage_loss: wait), shorter: the P100 stage is revoked at step 30; every stage
    checkpoints on the notice, the two survivors wait (a pipeline needs every stage), and the replacement's stage
    joins a 3-stage world that resumes from the notice's checkpoint (tests/test_torch_e2e.py's
    test_a_pipeline_survives_the_revocation_of_a_stage, daemon-side)."""
    run, summary = _lose_stage_1("local-pipeline", tmp_path, monkeypatch)
    assert summary["status"] == "succeeded" and summary["revocations"] == 1 and summary["replacements"] == 1, (
        run.timeline())
    notes = _notes(tmp_path)
    kinds = [k for k, _, _ in notes]
    assert "ckpt_on_notice" in kinds and "repartition" not in kinds and "shrink" not in kinds, run.timeline()
    worlds = [r for k, r, _ in notes if k in ("world", "grow")]
    assert [w.split(" at ")[0] for w in worlds] == ["world 0 -> 3", "world 3 -> 3"], run.timeline()
    noticed = next(r for k, r, _ in notes if k == "ckpt_on_notice")
    resumed = int(worlds[-1].split(" at step ")[1].split(";")[0])
    assert resumed > 0 and f"at step {resumed}:" in noticed, (noticed, worlds)


DEADLINE_S = ELASTIC_DEADLINE_S


def test_a_preemption_of_one_worker_shrinks_the_world_and_the_job_meets_its_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the trace's count falls to one spot VM the provider revokes the worker of rank 2; the daemon's elastic
    policy keeps the survivor and tops up with on-demand as the deadline needs, the world re-forms, and the job
    finishes by its deadline."""
    run = fast_forward(spec_of(elastic_spec("elastic-ff", tmp_path / "runs")), tmp_path, monkeypatch)
    summary, _, deadline = _report(tmp_path, run)
    assert summary["status"] == "succeeded", run.timeline()
    notes = _notes(tmp_path)
    counts = [n for n in notes if n[0] == "spot-count"]
    assert [r.split()[0] for _, r, _ in counts[:2]] == ["16", "1"], run.timeline()
    revoked = sorted((i for i in run.instances.items() if i[1]["end_reason"] == "preempted"),
                     key=lambda i: next(e[4] for e in run.events if e[1] == "revoked" and e[3] == i[0]))
    assert revoked and revoked[0][0].endswith("worker-1-0"), run.timeline()
    after = next(n for n in notes if n[0] == "elastic-choice" and n[2] >= counts[1][2])
    assert after[1].startswith("1 spot + "), run.timeline()  # the survivor rides on, topped up with on-demand
    shrink = [r for k, r, _ in notes if k == "shrink"]
    assert shrink and shrink[0].startswith("world 2 -> 1"), run.timeline()
    section = "\n".join(deadline)
    assert f"deadline {DEADLINE_S}s met" in section, section
    assert "(2 of 2 workers)" in section, section
    assert "spot + on-demand (1 spot + 1 on-demand" in section or "spot (1 of 2 workers)" in section, section
    assert run.wall_s <= DEADLINE_S
