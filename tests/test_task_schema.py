"""task.json is one typed, versioned schema (orchestrator/model/task.py) shared by the controller and jobs/:
what the controller writes validates, and a payload given a version it does not know exits fatal (2)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, processes_under, wait_until
from test_control_poison import local_spec

from orchestrator.control.driver import run_pass
from orchestrator.control.launcher import create_job
from orchestrator.control.torch_task import joins, torch_section
from orchestrator.costmodel.slots import expand
from orchestrator.model import exits
from orchestrator.model import task as schema
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import validate_spec
from orchestrator.model.status import FINAL_JOB, InstanceStatus, JobStatus
from orchestrator.store.db import open_session
from orchestrator.store.models import Instance, Job

JOBS = REPO / "jobs"


def _controller_task_json(tmp_path: Path) -> dict[str, object]:
    """A real local job whose command copies the task.json the controller wrote for it."""
    seen = tmp_path / "seen.json"
    user_dir()
    spec = validate_spec(yaml.safe_load(local_spec("schema", tmp_path / "runs", f"cp task.json {seen}; exit 0")))
    with open_session() as session:
        job_id = create_job(session, spec).id
        deadline = time.time() + 60
        while time.time() < deadline:
            run_pass(session, "test", [job_id])
            session.expire_all()
            job = session.get(Job, job_id)
            assert job is not None
            if job.status in FINAL_JOB:
                break
            time.sleep(0.1)
        assert job.status == JobStatus.SUCCEEDED.value, job.status_reason
    wait_until(lambda: processes_under(tmp_path) == [], timeout=10)
    raw: dict[str, object] = json.loads(seen.read_text())
    return raw


def test_the_task_json_the_controller_writes_validates_against_the_schema(tmp_path: Path) -> None:
    raw = _controller_task_json(tmp_path)
    assert raw["version"] == schema.TASK_VERSION
    task = schema.from_dict(raw)
    assert (task.mode, task.role, task.index, task.training.batch_per_worker) == ("sync", "worker", 0, (128,))
    assert schema.from_dict(task.to_dict()) == task  # the typed value and its JSON agree both ways
    # and the TF payload's own reader (jobs/tfjob) accepts it
    sys.path.insert(0, str(JOBS))
    try:
        from tfjob.task import parse_task

        assert parse_task(raw).training.train_steps == 10
    finally:
        sys.path.remove(str(JOBS))


def _write(tmp_path: Path, **over: object) -> Path:
    raw: dict[str, object] = {
        "version": schema.TASK_VERSION, "job_id": "j", "instance": "j-worker-0-0", "mode": "sync", "role": "worker",
        "index": 0, "cluster": {"worker": ["127.0.0.1:0"]}, "storage": str(tmp_path / "storage"),
        "storage_uri": str(tmp_path / "storage"),
        "training": {"hparam_set": "resnet_tiny", "train_steps": 5, "batch_per_worker": [4]},
        "torch": {"rdzv_endpoint": "127.0.0.1:29500", "min_nodes": 1, "max_nodes": 1},
    }
    raw.update(over)
    (tmp_path / "task.json").write_text(json.dumps(raw))
    return tmp_path / "task.json"


@pytest.mark.parametrize("entry", ["train.py", "torchjob/node.py"])
def test_a_payload_given_an_unknown_version_exits_fatal(tmp_path: Path, entry: str) -> None:
    _write(tmp_path, version=999)
    out = subprocess.run([sys.executable, str(JOBS / entry), "--task", "task.json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == exits.EXIT_FATAL == schema.EXIT_FATAL, out.stderr[-2000:]
    assert "task.json version 999" in out.stderr and "Traceback" not in out.stderr


def test_schema_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(schema.UnknownVersionError, match="version None"):
        schema.load(_write(tmp_path, version=None))
    with pytest.raises(schema.TaskSchemaError, match="index has type str"):
        schema.load(_write(tmp_path, index="0"))
    with pytest.raises(schema.TaskSchemaError, match="training.train_steps is missing"):
        schema.load(_write(tmp_path, training={"batch_per_worker": [4]}))
    with pytest.raises(schema.TaskSchemaError, match="mode must be one of"):
        schema.load(_write(tmp_path, mode="both"))


def test_the_payload_reads_the_controllers_definition() -> None:
    """jobs/task_schema.py holds no schema of its own: it loads orchestrator/model/task.py (and on an
    instance the controller pushes that file over it)."""
    code = ("import sys; sys.path.insert(0, 'jobs'); import task_schema; "
            "print(task_schema.__file__, task_schema.TASK_VERSION)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    path, version = out.stdout.split()
    assert Path(path).resolve() == (REPO / "orchestrator" / "model" / "task.py").resolve(), out.stderr
    assert int(version) == schema.TASK_VERSION


def test_a_remote_replica_group_s_addresses_reach_its_process(tmp_path: Path) -> None:
    """torchft on a remote worker: task.json's Lighthouse (the worker's end of its SSH forward) and its own address
    (``torch.replica_host``) go through the schema to the payload, and to a ``run:`` script's environment."""
    code = ("import json, sys; sys.path.insert(0, 'jobs'); from torchjob.node import torchft_env; "
            "from torchjob.task import parse; t = parse(json.load(open(sys.argv[1]))); "
            "print(json.dumps([t.lighthouse, t.replica_host, t.join, torchft_env(t)]))")
    torch = schema.TorchSection(rdzv_endpoint="10.0.0.2:29500", is_rdzv_host=False, min_nodes=1, max_nodes=3,
                                max_restarts=0, threads=None, sleep_table=(), run=None, setup=None,
                                fault_tolerance="torchft", lighthouse="http://127.0.0.1:40123",
                                replica_host="10.128.0.7", join=True)
    cfg = schema.TaskConfig(job_id="j", instance="j-worker-1-0", mode="sync", role="worker", index=1,
                            cluster={"worker": ()}, storage=str(tmp_path), storage_uri="gs://b/j",
                            training=schema.TrainingSection(model="resnet", hparam_set="resnet_tiny",
                                                            problem="image_cifar10", data_dir=None, train_steps=10,
                                                            batch_per_worker=(8, 8, 8), checkpoint_every=5,
                                                            eval_every=0, log_every=1, seed=0),
                            gpu="t4", torch=torch)
    assert schema.from_dict(json.loads(cfg.to_json())).torch == torch
    (tmp_path / "task.json").write_text(cfg.to_json())
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "task.json")], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    env = {"TORCHFT_LIGHTHOUSE": "http://127.0.0.1:40123", "REPLICA_GROUP_ID": "1",
           "ORCHESTRATOR_REPLICA_HOST": "10.128.0.7"}
    assert json.loads(out.stdout) == ["http://127.0.0.1:40123", "10.128.0.7", True, env]


def test_a_replica_group_started_beside_training_ones_joins() -> None:
    """``torch.join``: the task of a worker started while another worker trains, past the job's start (a
    replacement, a grown worker), says so, and only on replica groups (jobs/torchjob/ft_worker.FtTrainer)."""
    spec = validate_spec(yaml.safe_load((REPO / "examples" / "local-torch-ft.yaml").read_text()))
    slots = [s for s in expand(spec) if s.role.value == "worker"]

    def worker(i: int, status: InstanceStatus) -> Instance:
        return Instance(name=f"j-worker-{i}-0", role="worker", slot_index=i, generation=0,
                        status=status.value, batch=slots[i].batch)

    replacement = [worker(0, InstanceStatus.PROVISIONING), worker(1, InstanceStatus.TRAINING)]
    assert joins(JobStatus.RECOVERING, replacement, replacement[0]) is True
    assert joins(JobStatus.RUNNING, replacement, replacement[0]) is True
    # a fresh job starts its tasks one after the other in one pass: worker 0 trains as worker 1's starts
    assert joins(JobStatus.PROVISIONING, replacement, replacement[0]) is False
    assert joins(JobStatus.RECOVERING, [worker(0, InstanceStatus.READY), worker(1, InstanceStatus.READY)],
                 worker(0, InstanceStatus.READY)) is False  # every group lost: none to join

    def section(join: bool, lighthouse: str | None) -> bool:
        return torch_section(spec, slots, replacement, replacement[0], 96, lambda gpu, batch: 0.0,
                             lighthouse=lighthouse, join=join).join

    assert section(True, "http://127.0.0.1:1") is True and section(True, None) is False  # torchrun: never
