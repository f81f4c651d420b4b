"""The ledger closes an instance at the provider's own deletion / preemption time, so the controller's
downtime never changes a bill; a restarted daemon keeps its owner id (it does not wait out its own lease)."""

from __future__ import annotations

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
from orchestrator.core.paths import user_dir
from orchestrator.core.spec import validate_spec
from orchestrator.core.status import FINAL_JOB
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.providers.registry import backend_for
from orchestrator.store.db import open_session
from orchestrator.store.models import Instance, Job, LedgerEntry
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
