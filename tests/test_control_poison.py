"""One bad job cannot stop the others: 50 jobs under the real daemon, 5 of them poisoned in different ways.

The 45 healthy jobs are local `command` jobs (a short sleep, exit 0 = done), so the test is quick; the
poisoned ones are: a GCE job without credentials, an SSH job whose only host does not answer, a GCE job
whose Compute API answers 503 forever, a job row whose spec is corrupt, and a payload that always fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, processes_under, wait_until

from orchestrator.control.launcher import create_job
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import validate_spec
from orchestrator.model.status import FINAL_JOB
from orchestrator.providers.ports import free_port
from orchestrator.store.db import open_session
from orchestrator.store.models import Job
from orchestrator_testing.processes import stop
from tests.cli_inproc import run_cli

GOOD = 45


class _Always503(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = json.dumps({"error": {"code": 503, "message": "backend unavailable (injected)", "errors": []}})
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _answer  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def broken_cloud() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Always503)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _closed_port() -> int:
    return free_port()  # nothing listens there


def local_spec(name: str, storage: Path, command: str) -> str:
    return f"""name: {name}
provider: {{kind: local, time_scale: 600, revocations: none, emulation_k80_step_s: 0}}
storage: {storage}
training: {{job: command, command: "{command}", mode: sync, train_steps: 10}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: k80, count: 1, spot: false}}]
policy: {{on_revocation: replace, max_replacements: 0, deadline: 10m}}
pricing: {{book: 2019-02}}
"""


def gce_spec(name: str, storage: Path, endpoint: str | None) -> str:
    # No endpoint: a job whose credentials cannot load (the tests run under the emulator setting, where no
    # credentials at all would mean anonymous ones).
    api = f', api_endpoint: "{endpoint}"' if endpoint else ", credentials: /nonexistent/orchestrator-key.json"
    return f"""name: {name}
provider: {{kind: gce, project: poison-project, zones: [us-central1-c, us-central1-a]{api}}}
storage: {storage}
training: {{job: command, command: "sleep 1", mode: sync, train_steps: 10}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: t4, count: 1, spot: true, zone: us-central1-c}}]
policy: {{on_revocation: replace, max_replacements: 0}}
pricing: {{book: 2026-11}}
"""


def ssh_spec(name: str, storage: Path, inventory: Path) -> str:
    return f"""name: {name}
provider: {{kind: ssh, inventory: {inventory}}}
storage: {storage}
training: {{job: command, command: "sleep 1", mode: sync, train_steps: 10}}
cluster:
  parameter_servers: {{count: 0}}
  workers: [{{gpu: k80, count: 1}}]
policy: {{on_revocation: replace, max_replacements: 0}}
pricing: {{book: 2019-02}}
"""


def _record(text: str) -> str:
    with open_session() as session:
        return create_job(session, validate_spec(yaml.safe_load(text))).id


def _statuses(ids: list[str]) -> dict[str, str]:
    with open_session() as session:
        return {j: session.get(Job, j).status for j in ids}  # type: ignore[union-attr]


def test_fifty_jobs_five_poisoned_the_other_45_finish(tmp_path: Path, broken_cloud: str) -> None:
    user_dir()  # ORCHESTRATOR_HOME, where the DB file goes
    storage = tmp_path / "runs"
    good = [_record(local_spec(f"ok{i}", storage, "sleep 0.2")) for i in range(GOOD)]
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  - {{name: dead, host: 127.0.0.1, port: {_closed_port()}, gpu: k80}}\n")
    poisoned = {
        "no credentials": _record(gce_spec("nocreds", storage, None)),
        "unreachable ssh host": _record(ssh_spec("deadssh", storage, inventory)),
        "provider 5xx forever": _record(gce_spec("fivexx", storage, broken_cloud)),
        "corrupt row": _record(local_spec("corrupt", storage, "sleep 0.2")),
        "payload always fails": _record(local_spec("failing", storage, "echo boom >&2; exit 1")),
    }
    with open_session() as session:
        row = session.get(Job, poisoned["corrupt row"])
        assert row is not None
        row.spec_yaml = "name: corrupt\ncluster: {workers: [{gpu: k80"  # a torn write: not YAML any more

    env = {**os.environ, "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-such-key.json")}
    log_path = tmp_path / "daemon.log"
    with log_path.open("w") as log_file:
        daemon = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "daemon", "--interval", "0.3",
                                   "--gc-every", "30"], env=env, cwd=REPO, stdout=log_file,
                                  stderr=subprocess.STDOUT)
    started = time.time()
    try:
        wait_until(lambda: all(s in FINAL_JOB for s in _statuses(good).values()), timeout=300, interval=1)
        finished_s = time.time() - started
        wait_until(lambda: _statuses([poisoned["payload always fails"]])[poisoned["payload always fails"]]
                   in FINAL_JOB, timeout=120, interval=1)
        assert set(_statuses(good).values()) == {"succeeded"}, _statuses(good)

        def named(job_id: str, *words: str) -> bool:
            lines = [line for line in log_path.read_text().splitlines() if job_id in line]
            return any(all(w in line for w in words) for line in lines)

        # The 5xx cloud's listing gives up after its bounded retries (up to ~15 s of backoff), in the background.
        wait_until(lambda: named(poisoned["provider 5xx forever"], "503"), timeout=60, interval=1)
        log = log_path.read_text()

        assert named(poisoned["no credentials"], "cannot set up its provider", "credentials"), log[-4000:]
        assert named(poisoned["unreachable ssh host"], "no free reachable host"), log[-4000:]
        assert named(poisoned["provider 5xx forever"], "503"), log[-4000:]
        assert named(poisoned["corrupt row"], "cannot set up its provider"), log[-4000:]
        assert named(poisoned["payload always fails"], "exited with code 1"), log[-4000:]
        final = _statuses(list(poisoned.values()))
        assert final[poisoned["no credentials"]] == "failed" and final[poisoned["corrupt row"]] == "failed"
        assert final[poisoned["payload always fails"]] == "failed"
        # `cancel` works on whatever is still active, whatever is wrong with it.
        for what in ("unreachable ssh host", "provider 5xx forever"):
            job_id = poisoned[what]
            if final[job_id] not in FINAL_JOB:
                out = run_cli(["cancel", job_id], env, REPO)  # in process: the daemon is what is under test
                assert out.returncode == 0, out.stdout + out.stderr
        final = _statuses(list(poisoned.values()))
        assert all(s in FINAL_JOB for s in final.values()), final
        print(f"\n45 healthy jobs finished in {finished_s:.1f}s; poisoned: "
              + ", ".join(f"{k}: {final[v]}" for k, v in poisoned.items()))
    finally:
        code = stop(daemon)
    # SIGTERM ends it at once and cleanly, though the 5xx listing may still be retrying in a provider thread
    assert code == 0 and "daemon stopped" in log_path.read_text(), log_path.read_text()[-2000:]
    assert "Traceback" not in log_path.read_text()
    assert "Running job" not in log_path.read_text()  # the scheduler's tick lines are off
    wait_until(lambda: processes_under(tmp_path) == [], timeout=20)
