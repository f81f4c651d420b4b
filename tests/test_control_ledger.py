"""The ledger runs from the provider's own creation of an instance (the send, whichever daemon made it) to its
own deletion / preemption time, so the controller's downtime never changes a bill; a restarted daemon keeps
its owner id (it does not wait out its own lease)."""

from __future__ import annotations

import signal
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
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import validate_spec
from orchestrator.model.status import FINAL_JOB
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.providers.registry import backend_for
from orchestrator.store.db import open_session
from orchestrator.store.models import Event, Instance, Job, LedgerEntry, Operation
from orchestrator_testing.processes import stop

DOWN_S = 3.0


def _passes_until(session: object, job_id: str, done: object, timeout: float = 60) -> Job:
    deadline = time.time() + timeout
    while time.time() < deadline:
        run_pass(session, "ledger-test", [job_id])  # type: ignore[arg-type]
        session.expire_all()  # type: ignore[attr-defined]
        job = session.get(Job, job_id)  # type: ignore[attr-defined]
        if done(job):  # type: ignore[operator]
            return job  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_an_instance_deleted_while_the_controller_was_down_is_billed_to_the_providers_deletion(
        tmp_path: Path) -> None:
    user_dir()
    spec = validate_spec(yaml.safe_load(local_spec("bill", tmp_path / "runs", "sleep 600")))
    provider = backend_for(spec).provider
    assert isinstance(provider, LocalProvider)
    with open_session() as session:
        job_id = create_job(session, spec).id
        job = _passes_until(session, job_id, lambda j: j.instances and j.instances[0].status == "training")
        inst = job.instances[0]
        provider.delete(inst.name, inst.zone)  # the cloud deletes it (e.g. its max run duration) ...
        record = provider.history(inst.name)
        assert record is not None
        deleted_by_provider = float(record["deleted_at"])
        time.sleep(DOWN_S)  # ... while no controller runs
        job = _passes_until(session, job_id, lambda j: j.status in FINAL_JOB)
        noticed = session.get(Instance, inst.id)
        assert noticed is not None and noticed.status == "deleted"
        entry = session.query(LedgerEntry).filter(LedgerEntry.instance_id == inst.id).one()
        assert entry.end_at == pytest.approx(deleted_by_provider, abs=1e-6)
        assert entry.seconds == pytest.approx(deleted_by_provider - inst.requested_at, abs=1e-6)
        late = job.ended_at - deleted_by_provider  # type: ignore[operator]
        assert late >= DOWN_S  # what the old ledger would have billed on top
        print(f"\nbilled {entry.seconds:.2f}s (to the provider's deletion); the controller noticed {late:.2f}s later")
    wait_until(lambda: processes_under(tmp_path) == [], timeout=20)


def _daemon_id(env_home: Path, hold_s: float = 0.0) -> subprocess.Popen[str]:
    code = ("import time; from orchestrator.control.daemon import daemon_id; print(daemon_id(), flush=True); "
            f"time.sleep({hold_s})")
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, text=True, stdout=subprocess.PIPE,
                            env={"ORCHESTRATOR_HOME": str(env_home), "PATH": "/usr/bin:/bin"})


def test_a_restarted_daemon_keeps_its_owner_id_and_a_second_one_gets_another(tmp_path: Path) -> None:
    first = _daemon_id(tmp_path)
    one = first.communicate(timeout=60)[0].strip()
    again = _daemon_id(tmp_path, hold_s=30)  # the same daemon after kill -9 and restart ...
    try:
        assert again.stdout is not None
        two = again.stdout.readline().strip()
        assert one == two and one.startswith("daemon-")  # hostname + the persisted id, no pid
        other = _daemon_id(tmp_path)  # ... and a second daemon beside it (PostgreSQL) is another owner
        three = other.communicate(timeout=60)[0].strip()
    finally:
        stop(again)
    assert three != two


# A daemon's passes, SIGKILLed just before the create it recorded (the instance row and its operation,
# committed) is sent: the line of operations._insert that sends it. argv: the job id.
KILLED_BEFORE_THE_SEND = r"""
import inspect, os, signal, sys
from orchestrator.control import operations
from orchestrator.control.driver import run_pass
from orchestrator.store.db import open_session

source, first = inspect.getsourcelines(operations._insert)
send = first + next(n for n, line in enumerate(source) if "start_create(" in line)

def line(frame, event, arg):
    if event == "line" and frame.f_lineno == send:
        os.kill(os.getpid(), signal.SIGKILL)
    return line

sys.settrace(lambda frame, event, arg: line if frame.f_code is operations._insert.__code__ else None)
with open_session() as session:
    for _ in range(200):
        run_pass(session, "ledger-test", [sys.argv[1]])
sys.exit("the create was never sent")
"""


def test_a_create_a_killed_daemon_recorded_and_a_later_one_sent_is_billed_from_the_send(tmp_path: Path) -> None:
    user_dir()
    spec = validate_spec(yaml.safe_load(local_spec("late", tmp_path / "runs", "sleep 1")))
    provider = backend_for(spec).provider
    assert isinstance(provider, LocalProvider)
    with open_session() as session:
        job_id = create_job(session, spec).id
    killed = subprocess.run([sys.executable, "-c", KILLED_BEFORE_THE_SEND, job_id], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    with open_session() as session:
        (inst,) = session.query(Instance).filter(Instance.job_id == job_id).all()
        op = session.query(Operation).filter(Operation.instance_id == inst.id).one()
        assert inst.status == "requested" and op.status == "pending"  # recorded, never sent ...
        assert provider.history(inst.name) is None
        recorded = op.started_at
        time.sleep(DOWN_S)  # ... while no daemon runs
        job = _passes_until(session, job_id, lambda j: j.status in FINAL_JOB)  # a later daemon sends it
        record = provider.history(inst.name)
        assert record is not None
        entry = session.query(LedgerEntry).filter(LedgerEntry.instance_id == inst.id).one()
        assert entry.start_at == pytest.approx(float(record["created_at"]), abs=1e-6)  # from the send ...
        assert entry.end_at == pytest.approx(float(record["deleted_at"]), abs=1e-6)  # ... to the provider's end
        assert entry.seconds == pytest.approx(float(record["deleted_at"]) - float(record["created_at"]), abs=1e-6)
        assert entry.start_at - recorded >= DOWN_S  # what the old ledger billed on top
        requested = session.query(Event).filter(Event.instance_id == inst.id, Event.to_status == "requested").one()
        assert requested.at <= recorded  # the record of the request itself keeps its time
        print(f"\nbilled from the send, {entry.start_at - recorded:.2f}s after the create was recorded")
        assert job.status == "succeeded"
    wait_until(lambda: processes_under(tmp_path) == [], timeout=20)
