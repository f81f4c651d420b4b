"""torchft quorum changes (jobs/torchjob/ft_step.py) as the payload reports them: metrics lines become events
(``quorum 3 -> 2 at step S``, ``heal worker-2 from worker-0 in T s``) and ``report --format json``'s
``quorum_changes`` (control/ingest.py, cli/torch_report.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from sqlalchemy import select
from test_control_poison import local_spec

from orchestrator.cli.torch_report import quorum_changes
from orchestrator.control.ingest import ingest_metrics
from orchestrator.control.launcher import create_job
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import validate_spec
from orchestrator.storage import LocalStorage, open_storage
from orchestrator.store.db import open_session
from orchestrator.store.models import Event

LINES = [
    {"kind": "quorum", "step": 41, "t": 100.0, "world_before": 3, "world_after": 2, "survivors_pause_s": 1.0614},
    {"kind": "heal", "step": 57, "t": 109.0, "worker": 0, "from_worker": 1, "heal_s": 0.0613},
    {"kind": "quorum", "step": 57, "t": 109.1, "world_before": 2, "world_after": 3},
    {"kind": "quorum", "step": 60, "t": 110.0, "world_before": "three", "world_after": 2},  # skipped, noted
]


def test_quorum_lines_become_events_and_quorum_changes(tmp_path: Path) -> None:
    user_dir()
    with open_session() as session:
        job = create_job(session, validate_spec(yaml.safe_load(local_spec("q", tmp_path / "runs", "true"))))
        storage = open_storage(job.storage_uri, job.id)
        assert isinstance(storage, LocalStorage)
        (storage.root / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in LINES))
        ingest_metrics(session, job, storage, [])
        session.commit()
        reasons = session.scalars(select(Event.reason).where(Event.job_id == job.id, Event.entity == "note",
                                                             Event.to_status.in_(("quorum", "heal")))
                                  .order_by(Event.at)).all()
        assert reasons == ["quorum 3 -> 2 at step 41; survivors' pause 1.061 s",
                           "heal worker-0 from worker-1 in 0.061 s at step 57", "quorum 2 -> 3 at step 57"]
        assert quorum_changes(session, job.id) == [
            {"step": 41, "world_before": 3, "world_after": 2, "survivors_pause_s": 1.061, "healed_from": None,
             "heal_s": None},
            {"step": 57, "world_before": 2, "world_after": 3, "survivors_pause_s": None, "healed_from": "worker-1",
             "heal_s": 0.061}]
        bad = session.scalars(select(Event.reason).where(Event.job_id == job.id, Event.to_status == "bad_metrics"))
        assert any("world_before" in (r or "") for r in bad)
