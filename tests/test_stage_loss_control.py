"""The controller's side of a pipeline's lost stage: the inputs it puts in the job view (the partitioner's pipelines
over the members and over each set of survivors, the local provider's delays), the re-partition decision read back
from its event, and the survivors' tasks built over the live stages only (2 stages, torchrun's nodes 2:2)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.torch_report import stage_losses, training_section
from orchestrator.control import stage_loss
from orchestrator.control.driver import job_view
from orchestrator.control.torch_task import torch_section
from orchestrator.costmodel.slots import expand
from orchestrator.model.spec import JobSpec, validate_spec
from orchestrator.model.status import InstanceStatus, JobStatus
from orchestrator.store.db import session_factory
from orchestrator.store.models import Instance, Job

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "local-pipeline-repartition.yaml"


def _spec(**policy: object) -> tuple[JobSpec, str]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["policy"].update(policy)
    return validate_spec(doc), yaml.safe_dump(doc)


def test_the_inputs_are_the_partitioner_s_pipelines_and_the_local_delays() -> None:
    spec, text = _spec()
    got = stage_loss.stage_loss_inputs(spec, text, expand(spec), frozenset(), step=40)
    assert got is not None and got.mode == "auto" and got.remaining_steps == 260
    steps = dict(got.survivor_step_s)
    assert set(steps) == {"worker-0", "worker-1", "worker-2"}
    # The partitioner's steps over the emulated GPUs' measured curves (providers/local/emulation.py) and this host's CPU
    # step: without the P100 the two stages left (V100 + K80) step about 29% slower than the three.
    assert got.full_step_s == pytest.approx(0.335, abs=0.01)
    assert steps["worker-1"] == pytest.approx(0.431, abs=0.01)
    # 70 s boot / time_scale 2, then the PyTorch start-up this host measured (data/local_host.csv: 9.19 s)
    assert got.replacement_s == pytest.approx(35.0 + 9.19, abs=0.01) and got.spot_extra_s == 0.0
    assert got.leave_s == 15.0  # the 30 s notice window / time_scale 2: the survivors restart once it is over
    # Once worker-1 is gone, the members are the other two; a loss of either would leave one stage: it waits.
    after = stage_loss.stage_loss_inputs(spec, text, expand(spec), frozenset({"worker-1"}), step=40)
    assert after is not None and after.survivor_step_s == (("worker-0", None), ("worker-2", None))
    assert after.full_step_s == pytest.approx(steps["worker-1"])
    wait_spec, wait_text = _spec(stage_loss="wait")
    assert stage_loss.stage_loss_inputs(wait_spec, wait_text, expand(wait_spec), frozenset(), step=40) is None


def test_the_survivors_tasks_are_a_pipeline_over_the_live_stages() -> None:
    spec, _ = _spec()
    slots = expand(spec)
    inst = Instance(name="j-worker-0-1", role="worker", slot_index=0, generation=0, gpu="v100", batch=32)
    whole = torch_section(spec, slots, [], inst, 96, lambda gpu, batch: 0.0)
    assert whole.pipeline is not None and sorted(whole.pipeline.stage_slots) == [0, 1, 2]
    assert (whole.min_nodes, whole.max_nodes) == (3, 3)
    part = torch_section(spec, slots, [], inst, 96, lambda gpu, batch: 0.0, frozenset({"worker-1"}))
    assert part.pipeline is not None and sorted(part.pipeline.stage_slots) == [0, 2]
    assert (part.min_nodes, part.max_nodes) == (2, 2) and part.is_rdzv_host
    assert part.pipeline.modules[0][0] == 0 and part.pipeline.modules[-1][1] == whole.pipeline.modules[-1][1]


def test_a_recorded_repartition_reaches_the_job_view_and_the_report(tmp_path: Path) -> None:
    spec, text = _spec()
    now = time.time()
    with session_factory(f"sqlite:///{tmp_path / 'results.db'}")() as session:
        job = Job(id="pipe-1", name="pipe", provider="local", mode="sync", cluster_shape="3", spec_yaml=text,
                  storage_uri=str(tmp_path), price_book="2019-02", status=JobStatus.RUNNING.value, train_steps=300,
                  restarts=0, metrics_offset=0, cancel_requested=False, created_at=now, updated_at=now)
        session.add(job)
        for i, gpu in enumerate(("v100", "p100", "k80")):
            session.add(Instance(job_id=job.id, name=f"pipe-1-worker-{i}-0", role="worker", slot_index=i,
                                 generation=0, gpu=gpu, machine_type="local", zone="local", spot=i == 1,
                                 price_per_hour=1.0, status=InstanceStatus.TRAINING.value, requested_at=now,
                                 updated_at=now))
        session.commit()
        view = job_view(session, job, spec, expand(spec), now)
        assert view.stage_loss is not None and view.repartitioned == ()
        long = ("worker-1 lost: re-partition over the survivors (cheaper). Predicted: wait 130 s, $0.1231; "
                "re-partition over worker-0, worker-2: 81 s, $0.0646")
        stage_loss.record(session, job, "pipe-1-worker-1-0", "repartition", long)
        stage_loss.record(session, job, "pipe-1-worker-2-0", "wait", "worker-2 lost: wait ...")
        view = job_view(session, job, spec, expand(spec), now)
        assert [name for name, _ in view.repartitioned] == ["worker-1"]
        assert view.stage_loss is not None and [n for n, _ in view.stage_loss.survivor_step_s] == ["worker-0",
                                                                                                    "worker-2"]
        assert stage_loss.dropped_slots(session, job) == frozenset({"worker-1"})
        assert [(d["instance"], d["action"]) for d in stage_losses(session, job.id)] == [
            ("pipe-1-worker-1-0", "repartition"), ("pipe-1-worker-2-0", "wait")]
        lines = training_section(session, [{"job_id": job.id, "accuracy": None, "cost_usd": None}])
        assert max(len(ln) for ln in lines) <= 80 and "re-partition over worker-0, worker-2: 81 s" in " ".join(lines)
