"""GcsStorage and the jobs/storage_sync.py sidecar against gcp-storage-emulator (in this process)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from orchestrator.storage import open_storage
from orchestrator.storage.gcs import GcsStorage, parse_gs_uri
from orchestrator_testing.gcs import GcsEmulator
from orchestrator_testing.processes import stop

REPO = Path(__file__).resolve().parent.parent
SYNC = REPO / "jobs" / "storage_sync.py"


@pytest.fixture(scope="module")
def gcs() -> Iterator[GcsEmulator]:
    with GcsEmulator(bucket="orch-test") as emulator:
        yield emulator


@pytest.fixture
def storage(gcs: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> GcsStorage:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)  # survives other fixtures' env changes
    s = open_storage(gcs.uri("runs/"), f"job-{uuid.uuid4().hex[:8]}")
    assert isinstance(s, GcsStorage)
    return s


def sync_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("storage_sync", SYNC)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def eventually(check: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_uri_parsing() -> None:
    assert parse_gs_uri("gs://b/a/b/") == ("b", "a/b")
    assert parse_gs_uri("gs://b") == ("b", "")
    with pytest.raises(ValueError):
        parse_gs_uri("s3://b/x")
    assert GcsStorage("gs://b", "j").uri == "gs://b/j"  # no client (and no credentials) needed to construct


def test_read_write_offsets_list_and_notices(storage: GcsStorage) -> None:
    assert storage.uri.startswith("gs://orch-test/runs/job-")
    assert storage.local_path() is None
    assert storage.read_text("metrics.jsonl") is None
    assert storage.read_from("metrics.jsonl", 0) == b""
    assert storage.read_from("metrics.jsonl", 5) == b""

    storage.write_text("metrics.jsonl", '{"step": 1}\n{"step": 2}\n')
    assert storage.read_text("metrics.jsonl") == '{"step": 1}\n{"step": 2}\n'
    assert storage.read_from("metrics.jsonl", 12) == b'{"step": 2}\n'
    assert storage.read_from("metrics.jsonl", 24) == b""  # exactly at the end
    assert storage.read_from("metrics.jsonl", 1000) == b""

    storage.write_text("result.json", '{"accuracy": "ü"}')
    assert storage.read_text("result.json") == '{"accuracy": "ü"}'
    storage.write_text("checkpoints/ckpt-1.index", "i")
    storage.write_text("checkpoints/sub/deep", "d")
    assert storage.notices() == set()
    storage.write_notice("job-worker-0-0", "preempted")
    storage.write_notice("job-worker-1-0", "preempted")
    assert storage.notices() == {"job-worker-0-0", "job-worker-1-0"}
    assert storage.list("") == ["checkpoints", "metrics.jsonl", "notices", "result.json"]
    assert storage.list("checkpoints") == ["ckpt-1.index", "sub"]
    assert storage.list("nothing") == []
    with pytest.raises(ValueError):
        storage.read_text("../other-job/result.json")


def test_sync_once_seeds_local_and_publishes_whole_lines(storage: GcsStorage, tmp_path: Path) -> None:
    storage.write_text("checkpoints/ckpt-1.index", "index-1")
    storage.write_text("checkpoints/checkpoint", 'model_checkpoint_path: "ckpt-1"\n')
    storage.write_text("metrics.jsonl", '{"step": 1}\n')
    storage.write_notice("old-instance", "x")
    local = tmp_path / "storage"
    mod = sync_module()
    assert mod.main(["--uri", storage.uri, "--local", str(local), "--once"]) == 0
    assert (local / "checkpoints" / "ckpt-1.index").read_text() == "index-1"
    assert (local / "checkpoints" / "checkpoint").exists()
    assert (local / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (local / "notices" / "old-instance").read_text() == "x"

    sync = mod.Sync(storage.uri, local)
    sync.pull_initial()
    assert sync.push() == 0  # everything already in sync
    with (local / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2}\n{"step": 3, "partial')  # the trainer is mid-line
    assert sync.push() == 1
    assert storage.read_text("metrics.jsonl") == '{"step": 1}\n{"step": 2}\n'
    with (local / "metrics.jsonl").open("a") as f:
        f.write('": 1}\n')
    sync.push()
    assert storage.read_from("metrics.jsonl", 24) == b'{"step": 3, "partial": 1}\n'

    # A new checkpoint replaces the old one (the trainer rotated it away): the bucket follows.
    (local / "checkpoints" / "ckpt-1.index").unlink()
    (local / "checkpoints" / "ckpt-2.index").write_text("index-2")
    (local / "checkpoints" / "ckpt-2_temp").mkdir()
    (local / "checkpoints" / "ckpt-2_temp" / "part-0").write_text("being written")
    (local / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-2"\n')
    assert sync.push() == 2
    assert storage.list("checkpoints") == ["checkpoint", "ckpt-2.index"]
    assert storage.read_text("checkpoints/checkpoint") == 'model_checkpoint_path: "ckpt-2"\n'


def _two_vms(mod: ModuleType, storage: GcsStorage, tmp_path: Path) -> tuple[Any, Any]:
    """The sidecars of two VMs of one job, each started (its initial pull done) on an empty local folder."""
    syncs = (mod.Sync(storage.uri, tmp_path / "vm0"), mod.Sync(storage.uri, tmp_path / "vm1"))
    for sync in syncs:
        sync.local.mkdir()
        sync.pull_initial()
    return syncs


def test_a_writer_that_moves_to_another_vm_appends_to_what_the_last_one_wrote(storage: GcsStorage,
                                                                               tmp_path: Path) -> None:
    """A PyTorch job's metrics writer (rank 0) moves when its VM is revoked: the next VM's sidecar, seeded before
    the first one wrote its last lines, appends its own after them; neither replaces the other's."""
    mod = sync_module()
    first, second = _two_vms(mod, storage, tmp_path)
    (first.local / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    assert first.push() == 1
    (second.local / "metrics.jsonl").write_text('{"step": 3}\n')  # its local copy lacks steps 1-2
    assert second.push() == 1
    with (first.local / "metrics.jsonl").open("a") as f:  # the old writer's last line, flushed as it goes
        f.write('{"step": 2.5}\n')
    first.push()
    assert storage.read_text("metrics.jsonl") == '{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 2.5}\n'
    assert second.push() == 0 and first.push() == 0  # nothing new on either


def test_a_seed_beside_a_running_sidecar_sends_no_line_twice(storage: GcsStorage, tmp_path: Path) -> None:
    """A PyTorch node's task restarts: its storage is seeded again (pull-only) while its sidecar runs. The seed leaves
    the node's own metrics file as it is (the bucket has more lines, from another VM's writer), so the running
    sidecar, which counts what of that file went up, sends nothing again (it did, under load: CI 2026-12-04)."""
    mod = sync_module()
    other, mine = _two_vms(mod, storage, tmp_path)
    (mine.local / "metrics.jsonl").write_text('{"step": 1}\n')
    mine.push()
    (other.local / "metrics.jsonl").write_text('{"step": 2}\n')
    other.push()
    assert mod.main(["--uri", storage.uri, "--local", str(mine.local), "--once", "--pull-only"]) == 0
    assert (mine.local / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert mine.push() == 0
    assert storage.read_text("metrics.jsonl") == '{"step": 1}\n{"step": 2}\n'


def test_pull_result_brings_another_vms_result_down_once_and_never_sends_it_back(storage: GcsStorage,
                                                                                tmp_path: Path) -> None:
    """``--pull-result``: a torchft replica group that joined as the others finished learns from the result.json
    another VM's writer put in the bucket that the job is done (jobs/torchjob/ft_worker.FtTrainer._joined_late)."""
    mod = sync_module()
    writer, joiner = _two_vms(mod, storage, tmp_path)
    assert joiner.pull_result() is False  # nothing in the bucket yet
    (writer.local / "result.json").write_text('{"step": 40}')
    assert writer.push() == 1
    assert writer.pull_result() is False  # its own: never replaced
    assert joiner.pull_result() is True
    assert (joiner.local / "result.json").read_text() == '{"step": 40}'
    assert joiner.pull_result() is False and joiner.push() == 0  # once; and it does not go up again


def test_a_dcp_checkpoint_reaches_the_bucket_whole_and_comes_back_whole(storage: GcsStorage, tmp_path: Path) -> None:
    """A PyTorch job's DCP checkpoint is whole once its ``.metadata`` is there (jobs/torchjob/ckpt.complete): the
    sidecar uploads it (a dotfile, unlike the others) after the shards, and a new VM's seed pulls it after them."""
    mod = sync_module()
    writer = mod.Sync(storage.uri, tmp_path / "vm0")
    step = writer.local / "checkpoints" / "step-00000100"
    step.mkdir(parents=True)
    writer.pull_initial()
    (step / "__0_0.distcp").write_text("shard")
    (step / ".metadata.tmp").write_text("being written")
    assert writer.push() == 1 and storage.list("checkpoints/step-00000100") == ["__0_0.distcp"]
    (step / ".metadata.tmp").rename(step / ".metadata")
    assert writer.push() == 1
    assert storage.read_text("checkpoints/step-00000100/.metadata") == "being written"  # (list() hides dotfiles)
    seed = mod.Sync(storage.uri, tmp_path / "vm1")
    seed.local.mkdir()
    seed.pull_initial()
    assert (seed.local / "checkpoints" / "step-00000100" / ".metadata").read_text() == "being written"


def test_sync_uploads_checkpoints_before_the_metrics_and_result_that_name_them(storage: GcsStorage,
                                                                                tmp_path: Path) -> None:
    """The controller may delete the VM as soon as it reads a checkpoint line (a drain before a deadline hop) or the
    result (the end): by then the checkpoint's files must be in the bucket."""
    local = tmp_path / "storage"
    sync = sync_module().Sync(storage.uri, local)
    (local / "checkpoints").mkdir(parents=True)
    sync.pull_initial()
    (local / "checkpoints" / "ckpt-7.index").write_text("index-7")
    (local / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-7"\n')
    (local / "metrics.jsonl").write_text('{"kind": "checkpoint", "step": 7, "reason": "notice"}\n')
    (local / "result.json").write_text('{"step": 7}')
    order: list[str] = []
    blob = sync.bucket.blob
    sync.bucket.blob = lambda name, *a, **kw: order.append(name.rsplit("/", 1)[-1]) or blob(name, *a, **kw)
    assert sync.push() == 4
    assert order == ["ckpt-7.index", "checkpoint", "metrics.jsonl", "result.json"]
    assert storage.read_text("checkpoints/ckpt-7.index") == "index-7"


def start_sidecar(storage: GcsStorage, local: Path, interval: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(SYNC), "--uri", storage.uri, "--local", str(local),
                             "--interval", interval], stderr=subprocess.DEVNULL)


def test_sync_sidecar_round_trip(storage: GcsStorage, tmp_path: Path) -> None:
    storage.write_text("metrics.jsonl", '{"step": 1}\n')
    local = tmp_path / "storage"
    proc = start_sidecar(storage, local, "0.1")
    try:
        eventually(lambda: (local / "metrics.jsonl").exists())  # seeded at start
        with (local / "metrics.jsonl").open("a") as f:
            f.write('{"step": 2}\n')
        eventually(lambda: storage.read_text("metrics.jsonl") == '{"step": 1}\n{"step": 2}\n')

        storage.write_notice("job-worker-0-0", "preempted at t")  # the controller saw a preemption
        eventually(lambda: (local / "notices" / "job-worker-0-0").exists())
        assert (local / "notices" / "job-worker-0-0").read_text() == "preempted at t"

        (local / "checkpoints").mkdir()
        (local / "checkpoints" / "ckpt-7.index").write_text("7")
        eventually(lambda: storage.read_text("checkpoints/ckpt-7.index") == "7")
    finally:
        assert stop(proc, timeout_s=10) == 0


def test_sync_sidecar_flushes_on_sigterm(storage: GcsStorage, tmp_path: Path) -> None:
    storage.write_notice("seed", "")
    local = tmp_path / "storage"
    proc = start_sidecar(storage, local, "60")  # no periodic pass during the test
    try:
        eventually(lambda: (local / "notices" / "seed").exists())  # started, signal handlers installed
        # The instance shuts down right after the trainer's last writes: SIGTERM uploads them.
        (local / "result.json").write_text('{"done": true}')
        (local / "metrics.jsonl").write_text('{"step": 9}\n')
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert storage.read_text("result.json") == '{"done": true}'
        assert storage.read_text("metrics.jsonl") == '{"step": 9}\n'
    finally:
        stop(proc, timeout_s=10)


class _Metadata(BaseHTTPRequestHandler):
    """GCE's metadata server, as far as ``instance/maintenance-event`` goes (it refuses a request without the
    Metadata-Flavor header, as the real one does)."""

    value = "NONE"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        ok = self.headers.get("Metadata-Flavor") == "Google" and self.path.endswith("/instance/maintenance-event")
        body = (type(self).value if ok else "forbidden").encode()
        self.send_response(200 if ok else 403)
        self.send_header("Content-Type", "application/text")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_sync_sidecar_turns_a_host_maintenance_notice_into_the_vms_notice(storage: GcsStorage, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """GCE stops a GPU VM for host maintenance an hour after its maintenance-event turns TERMINATE_ON_HOST_MAINTENANCE:
    the sidecar writes the VM's notice (here for the payload, in the bucket for the controller), once."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1/instance/maintenance-event"
    monkeypatch.setenv("ORCH_MAINTENANCE_URL", url)
    local = tmp_path / "storage"
    proc = subprocess.Popen([sys.executable, str(SYNC), "--uri", storage.uri, "--local", str(local), "--interval",
                             "0.1", "--instance", "job-worker-0-0", "--maintenance-poll", "0.1"],
                            stderr=subprocess.DEVNULL, env=dict(os.environ))
    try:
        eventually(lambda: (local / "notices").is_dir())
        time.sleep(0.5)  # several reads of NONE: no notice
        assert "job-worker-0-0" not in storage.notices()
        _Metadata.value = "TERMINATE_ON_HOST_MAINTENANCE"
        eventually(lambda: "job-worker-0-0" in storage.notices())
        notice = json.loads((local / "notices" / "job-worker-0-0").read_text())
        assert notice["maintenance"] == "TERMINATE_ON_HOST_MAINTENANCE" and notice["at"] > 0
    finally:
        _Metadata.value = "NONE"
        server.shutdown()
        assert stop(proc, timeout_s=10) == 0
