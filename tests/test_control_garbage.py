"""Everything a payload writes is untrusted input: garbage metrics lines, result files and notices never
raise in the controller, and every job still ends within its deadline (control/ingest.py)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import yaml
from e2e_helpers import processes_under, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from test_control_poison import local_spec

from orchestrator.control.driver import run_pass
from orchestrator.control.ingest import ingest_metrics, read_result
from orchestrator.control.launcher import create_job
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import validate_spec
from orchestrator.model.status import FINAL_JOB
from orchestrator.storage import LocalStorage, open_storage
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Event, Job
from orchestrator.transport.base import Endpoint
from orchestrator.transport.local import LocalTransport, UnsafePathError

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=12)
FIELDS = st.fixed_dictionaries({}, optional={
    "kind": st.sampled_from(["step", "eval", "checkpoint", "start", "quorum", "heal", "bogus"]) | JSON, "step": JSON,
    "t": JSON, "world_before": JSON, "world_after": JSON, "survivors_pause_s": JSON, "from_worker": JSON,
    "heal_s": JSON,
    "loss": JSON, "accuracy": JSON, "examples_per_s": JSON, "seconds": JSON, "reason": JSON, "resumed": JSON,
    "workers": st.dictionaries(st.text(max_size=3) | st.sampled_from(["0", "1", "-1", "99"]),
                               JSON | st.fixed_dictionaries({}, optional={"examples_per_s": JSON,
                                                                           "step_time_s": JSON}), max_size=3)})
LINES = st.lists(st.binary(max_size=40) | FIELDS.map(lambda d: json.dumps(d).encode()) |
                 JSON.map(lambda v: json.dumps(v).encode()), max_size=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=LINES, result=st.binary(max_size=60) | JSON.map(lambda v: json.dumps(v).encode()))
def test_garbage_metrics_and_results_never_raise(lines: list[bytes], result: bytes, tmp_path: Path) -> None:
    user_dir()
    with open_session() as session:
        job = create_job(session, validate_spec(yaml.safe_load(local_spec("g", tmp_path / "runs", "true"))))
        storage = open_storage(job.storage_uri, job.id)
        assert isinstance(storage, LocalStorage)
        (storage.root / "metrics.jsonl").write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")
        (storage.root / "result.json").write_bytes(result)
        ingest_metrics(session, job, storage, [])
        session.commit()  # what was valid is stored; what was not is one event
        assert job.metrics_offset == (storage.root / "metrics.jsonl").stat().st_size
        parsed, error = read_result(storage)
        assert (parsed is None) or (error is None)


def test_a_job_id_already_in_the_db_is_drawn_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Job ids carry 24 random bits (instance names derive from them and must stay short), so two launches of
    the same name can draw the same suffix: the second draws again instead of failing on the primary key."""
    import orchestrator.control.launcher as launcher

    user_dir()
    draws = iter(["abc123", "abc123", "abc123", "def456"])
    monkeypatch.setattr(launcher.secrets, "token_hex", lambda _n: next(draws))
    with open_session() as session:
        spec = validate_spec(yaml.safe_load(local_spec("same", tmp_path / "runs", "true")))
        first, second = create_job(session, spec), create_job(session, spec)
        assert (first.id, second.id) == ("same-abc123", "same-def456")


def test_a_job_id_taken_between_the_check_and_the_insert_is_drawn_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A concurrent launch can insert the id this one checked as free: the insert fails on the primary key,
    the transaction is rolled back whole and a new id is drawn (nothing of the first try stays)."""
    import orchestrator.control.launcher as launcher

    user_dir()
    spec = validate_spec(yaml.safe_load(local_spec("same", tmp_path / "runs", "true")))
    with open_session() as other:  # the concurrent launch
        taken = create_job(other, spec).id
    ids = iter([taken, "same-fresh1"])  # the first draw passed its check, then the other launch took it
    monkeypatch.setattr(launcher, "new_job_id", lambda _name, _session=None: next(ids))
    with open_session() as session:
        assert create_job(session, spec).id == "same-fresh1"
        events = session.scalars(select(Event.job_id).where(Event.entity == "job")).all()
        assert sorted(events) == sorted([taken, "same-fresh1"])


KINDS = ["metrics", "metrics-types", "metrics-dir", "long-line", "result", "result-shape", "notices-file",
         "notices-junk", "nothing"]


def _garble(rng: random.Random, root: Path, kind: str) -> str:
    """Write one kind of garbage (random bytes drawn from ``rng``) into a job's storage."""
    if kind == "metrics":
        (root / "metrics.jsonl").write_bytes(bytes(rng.randrange(256) for _ in range(2000)) + b"\n")
    elif kind == "metrics-types":
        lines = [{"kind": "step", "step": "abc"}, {"kind": "step", "step": 1e300}, {"kind": "eval", "loss": "nan"},
                 [1, 2], {"kind": "step", "step": 3, "workers": {"x": 1}}, {"kind": "step", "step": 4, "t": None}]
        (root / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    elif kind == "metrics-dir":
        (root / "metrics.jsonl").mkdir()
    elif kind == "long-line":
        (root / "metrics.jsonl").write_bytes(b"{" * 200_000)
    elif kind == "result":
        (root / "result.json").write_bytes(bytes(rng.randrange(256) for _ in range(50)))
    elif kind == "result-shape":
        (root / "result.json").write_text(json.dumps(rng.choice([[1, 2], "done", {"step": "x"}, {"accuracy": []}])))
    elif kind == "notices-file":
        (root / "notices").write_text("not a folder")
    elif kind == "notices-junk":
        (root / "notices").mkdir(exist_ok=True)
        for _ in range(5):
            (root / "notices" / f"junk{rng.randrange(10**6)}").write_bytes(bytes(rng.randrange(256) for _ in range(30)))
    return kind


def test_every_job_ends_within_its_deadline_whatever_its_payload_wrote(tmp_path: Path) -> None:
    user_dir()
    rng = random.Random(20261123)
    deadline_s = 8.0
    spec_text = local_spec("garbage", tmp_path / "runs", "sleep 120").replace("deadline: 10m",
                                                                              f"deadline: {deadline_s}")
    written: dict[str, str] = {}
    with open_session() as session:
        ids = [create_job(session, validate_spec(yaml.safe_load(spec_text))).id for _ in range(12)]
        for n, job_id in enumerate(ids):
            storage = open_storage(str(tmp_path / "runs"), job_id)
            assert isinstance(storage, LocalStorage)
            written[job_id] = _garble(rng, storage.root, KINDS[n % len(KINDS)])
        stop = time.time() + 90
        while time.time() < stop:
            run_pass(session, "fuzz", ids)
            session.expire_all()
            if all(session.get(Job, j).status in FINAL_JOB for j in ids):  # type: ignore[union-attr]
                break
            time.sleep(0.2)
        outcomes = []
        for job_id in ids:
            job = session.get(Job, job_id)
            assert job is not None
            assert job.status in FINAL_JOB, (written[job_id], job.status, job.status_reason)
            assert job.ended_at is not None
            took = job.ended_at - (job.started_at or job.created_at)  # garbage may end it before it starts
            outcomes.append(f"{written[job_id]}: {job.status} {took - deadline_s:+.1f}s")
            assert took <= deadline_s + 10, (written[job_id], job.status_reason)
            assert job.pass_failures == 0 and not [e for e in queries.events(session, job_id)
                                                   if e.to_status in ("error", "transition_error")]
    print("\ngarbage: outcome, seconds from the deadline to the end of teardown:", "; ".join(outcomes))
    wait_until(lambda: processes_under(tmp_path) == [], timeout=20)


def test_local_transport_never_copies_a_folder_into_itself_or_outside_the_workdir(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    workdir = folder / "instances" / "i-0"
    workdir.mkdir(parents=True)
    (folder / "train.py").write_text("print('hi')\n")
    t = LocalTransport()
    ep = Endpoint(workdir=str(workdir))
    with pytest.raises(UnsafePathError, match="outside the instance's work directory"):
        t.put(ep, workdir / "..", "..")  # `files: [..]`: its name is ".."
    with pytest.raises(UnsafePathError, match="into itself"):
        t.put(ep, folder, "project")  # the instance's disk lives inside the folder pushed
    with pytest.raises(UnsafePathError):
        t.put(ep, folder / "train.py", "/etc/passwd-copy")
    assert sorted(p.name for p in workdir.iterdir()) == []
    t.put(ep, folder / "train.py", "train.py")
    assert (workdir / "train.py").read_text() == "print('hi')\n"
