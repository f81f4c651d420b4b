"""Exit codes mean something (control/exits.py): 0 = done, never restarted; 2 = fatal (bad input), one retry
then FAILED with the reason and the log tail; anything else is retried. Real local instances and processes."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from e2e_helpers import processes_under, wait_until
from test_control_poison import local_spec
from test_reconcile import SLOTS, inst, job, observed

from orchestrator.control.driver import run_pass
from orchestrator.control.launcher import create_job
from orchestrator.decide.actions import RecordLogTail, RestartTraining, SetJobStatus, StartTask
from orchestrator.decide.reconcile import reconcile
from orchestrator.decide.state import Observation
from orchestrator.model.instances import ProcState, ProcStatus
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import TrainingMode, validate_spec
from orchestrator.model.status import FINAL_JOB, InstanceStatus, JobStatus
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Job

S = InstanceStatus
NOW = 10_000.0


def _run(tmp_path: Path, command: str, timeout: float = 60) -> tuple[Job, list[tuple[str, str, str]]]:
    user_dir()
    with open_session() as session:
        job_id = create_job(session, validate_spec(yaml.safe_load(local_spec("exits", tmp_path / "runs",
                                                                                command)))).id
        deadline = time.time() + timeout
        while time.time() < deadline:
            run_pass(session, "test", [job_id])
            session.expire_all()
            job = session.get(Job, job_id)
            assert job is not None
            if job.status in FINAL_JOB:
                break
            time.sleep(0.1)
        evs = [(e.entity, e.to_status, e.reason or "") for e in queries.events(session, job_id)]
        return job, evs


def test_a_command_that_exits_0_ends_succeeded_and_is_never_restarted(tmp_path: Path) -> None:
    job, evs = _run(tmp_path, "echo done; exit 0")
    assert job.status == JobStatus.SUCCEEDED.value, evs
    assert "exited 0" in (job.status_reason or "") or any("exited 0" in r for _, _, r in evs)
    assert job.restarts == 0
    assert sum(1 for e, to, _ in evs if e == "instance" and to == "training") == 1  # started once
    wait_until(lambda: processes_under(tmp_path) == [], timeout=10)


def test_a_command_that_exits_with_the_fatal_code_fails_after_one_retry_with_its_log_tail(tmp_path: Path) -> None:
    job, evs = _run(tmp_path, "echo 'bad input: data_dir /nope does not exist' >&2; exit 2")
    assert job.status == JobStatus.FAILED.value, evs
    assert job.restarts <= 1 and job.fatal_exits == 1
    reasons = [r for e, to, r in evs if e == "job" and to == "tearing_down"]
    assert reasons and "exited with code 2 (fatal: bad input)" in reasons[0]
    tails = [r for _, to, r in evs if to == "log_tail"]
    assert tails and "bad input: data_dir /nope does not exist" in tails[0]
    wait_until(lambda: processes_under(tmp_path) == [], timeout=10)


def test_other_exit_codes_are_retried() -> None:
    i = [inst("worker-0", S.TRAINING), inst("worker-1", S.TRAINING)]
    view = job(i, mode=TrainingMode.SYNC, slots=tuple(s for s in SLOTS if s.role.value == "worker"))
    for code in (1, 3, -9, 137):
        procs = {i[0].name: ProcStatus(ProcState.EXITED, code), i[1].name: ProcStatus(ProcState.RUNNING)}
        obs = Observation(instances={x.name: observed(x) for x in i}, procs=procs)
        acts = reconcile(view, obs, NOW)
        assert any(isinstance(a, RestartTraining) and not a.fatal for a in acts), (code, acts)


def test_only_the_writer_exiting_0_ends_the_job_and_a_finished_worker_is_not_restarted() -> None:
    cluster = [inst(s, S.TRAINING) for s in ("ps-0", "chief-0", "worker-0", "worker-1")]
    view = job(cluster)  # async: the chief is the writer
    procs = {x.name: ProcStatus(ProcState.RUNNING) for x in cluster}
    worker_done = {**procs, cluster[2].name: ProcStatus(ProcState.EXITED, 0)}
    acts = reconcile(view, Observation({x.name: observed(x) for x in cluster}, worker_done), NOW)
    assert not any(isinstance(a, StartTask | RestartTraining | SetJobStatus) for a in acts), acts
    chief_done = {**procs, cluster[1].name: ProcStatus(ProcState.EXITED, 0)}
    acts = reconcile(view, Observation({x.name: observed(x) for x in cluster}, chief_done), NOW)
    assert acts == [SetJobStatus(JobStatus.TEARING_DOWN, "the chief-0 task exited 0: training finished",
                                 JobStatus.SUCCEEDED)]


def test_fatal_code_second_time_records_the_log_tail_and_fails() -> None:
    cluster = [inst(s, S.TRAINING) for s in ("ps-0", "chief-0", "worker-0", "worker-1")]
    procs = {x.name: ProcStatus(ProcState.RUNNING) for x in cluster}
    procs[cluster[1].name] = ProcStatus(ProcState.EXITED, 2)
    obs = Observation({x.name: observed(x) for x in cluster}, procs)
    first = reconcile(job(cluster), obs, NOW)
    assert any(isinstance(a, RestartTraining) and a.fatal for a in first)
    second = reconcile(job(cluster, fatal_exits=1), obs, NOW)
    assert isinstance(second[0], RecordLogTail) and second[0].name == cluster[1].name
    assert isinstance(second[1], SetJobStatus) and second[1].outcome == JobStatus.FAILED


def test_launch_of_a_failing_job_exits_1_and_its_summary_says_why_and_what_it_cost(tmp_path: Path) -> None:
    from e2e_helpers import cli

    spec = tmp_path / "fails.yaml"
    spec.write_text(local_spec("fails", tmp_path / "runs", "echo 'bad input: no data' >&2; exit 2"))
    out = cli("launch", str(spec), "--quiet", env={"ORCHESTRATOR_HOME": str(tmp_path / "home"),
                                                   "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/o.db"}, timeout=300)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]  # LAUNCH_FAILED (model/exits.py)
    summary = next(line for line in out.stdout.splitlines() if line.startswith("fails-") and " failed" in line)
    assert "failed (the worker-0 task exited with code 2" in summary, summary  # why, not "every instance deleted"
    assert "cost $" in summary and "(workers $" in summary, summary
    assert "ps " not in summary and "chief" not in summary, summary  # roles that never existed are not listed
    assert ", ," not in summary and " ," not in summary and "()" not in summary and "$-" not in summary, summary
    assert "Traceback" not in out.stdout + out.stderr
    wait_until(lambda: processes_under(tmp_path) == [], timeout=10)


def test_a_finished_line_has_no_empty_field_and_no_negative_amount() -> None:
    from orchestrator.cli.launch_view import finished_line

    never = {"job_id": "g-1", "status": "failed", "status_reason": "no credentials: set GOOGLE_APPLICATION_CREDENTIALS",
             "accuracy": None, "wall_time_s": None, "cost_usd": -0.0007, "revocations": 0, "replacements": 0,
             "restarts": 0}
    line = finished_line(never, {"total": 0.0})
    assert line == ("g-1 failed (no credentials: set GOOGLE_APPLICATION_CREDENTIALS): never started training, "
                    "cost $0.0000 (no instance was billed)"), line
    torch = {**never, "status": "succeeded", "status_reason": "done", "accuracy": 0.91, "wall_time_s": 150.0,
             "cost_usd": 0.1755, "revocations": 1}
    line = finished_line(torch, {"worker": 0.1755, "total": 0.1755})
    assert line == ("g-1 succeeded: accuracy 91.0%, wall time 2.5m, cost $0.1755 (workers $0.1755), "
                    "revocations 1"), line
