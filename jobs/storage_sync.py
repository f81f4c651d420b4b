"""Storage sidecar: mirrors a job's gs:// storage and a local directory on a cloud instance.

    python jobs/storage_sync.py --uri gs://bucket/prefix/<job_id> --local ./storage [--interval 1] [--once]

The training task reads and writes its storage as a local directory (TensorFlow's own gs:// I/O cannot be
pointed at an emulator, and a local directory behaves the same everywhere). This process:

- at start, downloads ``checkpoints/`` (so a replacement chief resumes), ``metrics.jsonl`` where the VM has
  none (an existing one is this VM's writer's own and is never replaced) and ``notices/``;
- every ``--interval`` seconds, downloads new ``notices/`` and uploads new or changed files under
  ``checkpoints/`` (the indexes last: TensorFlow's ``checkpoint``, a DCP checkpoint's ``.metadata``; so the bucket
  never names files it lacks), then
  the lines appended to ``metrics.jsonl`` here since (up to the last complete one) and ``result.json`` as they
  were before the checkpoints went up (so neither names a checkpoint the bucket lacks); checkpoints the trainer
  deleted locally are deleted in the bucket too. The lines are appended to the bucket's object (read, then
  written only if its generation is still the one read), so a writer that moves between VMs (a PyTorch job's
  rank 0 after a revocation) continues what the last one wrote instead of replacing it;
- on SIGTERM / SIGINT (the instance shutting down) uploads once more and exits 0.

``--instance NAME``: also watch the GCE metadata server's ``instance/maintenance-event`` (every
``--maintenance-poll`` seconds; ``ORCH_MAINTENANCE_URL`` overrides where): GCE stops a GPU VM for host
maintenance an hour after that value turns ``TERMINATE_ON_HOST_MAINTENANCE``, and the sidecar then writes the
VM's notice, ``notices/NAME`` (``{"at", "maintenance"}``), locally and in the bucket, once: the job checkpoints as
on a preemption notice and the controller replaces the VM before the stop, losing no step.

``--pull-result``: also download ``result.json`` once another VM's writer has put it in the bucket (a torchft
replica group that joins as the others finish learns so that the job is done).

``--once``: the start-up download and one upload, then exit (run it before the task to seed ``--local``;
exit code 1 if the bucket could not be read). ``--pull-only``: never upload or delete (tasks other than
the one doing the job's I/O). Imports google-cloud-storage only (no TensorFlow), and
honours ``STORAGE_EMULATOR_HOST`` with anonymous credentials.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from google.cloud import storage

METRICS = "metrics.jsonl"
RESULT = "result.json"
NOTICES = "notices"
CHECKPOINTS = "checkpoints"
MAINTENANCE_URL = "http://metadata.google.internal/computeMetadata/v1/instance/maintenance-event"

log = logging.getLogger("storage_sync")


def make_client() -> Any:
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "emulator",
                              credentials=AnonymousCredentials())
    return storage.Client()


# What says a checkpoint is whole, so it goes up after (and comes down after) the files it names: TensorFlow's
# ``checkpoint`` index, and torch.distributed.checkpoint's ``.metadata`` (written last, through a ``.tmp`` file).
INDEXES = ("checkpoint", ".metadata")


def _skip(rel: str) -> bool:
    """Files a trainer is still writing: TensorFlow's ``*_temp`` shard dirs, ``*.tmp*`` files, dotfiles (but a DCP
    checkpoint's ``.metadata``)."""
    return any((p.startswith(".") and p != ".metadata") or p.endswith("_temp") or ".tmp" in p or "tempstate" in p
               for p in rel.split("/"))


def _index_last(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1] in INDEXES


class Sync:
    def __init__(self, uri: str, local: Path, client: Any = None) -> None:
        if not uri.startswith("gs://"):
            raise ValueError(f"{uri!r} is not a gs:// URI")
        bucket, _, base = uri[len("gs://"):].partition("/")
        self.base = base.strip("/")
        self.local = local
        self.client = client or make_client()
        self.bucket = self.client.bucket(bucket)
        self.synced: dict[str, tuple[int, int]] = {}  # rel path -> local (size, mtime_ns) when last in sync
        self.notice_gens: dict[str, int] = {}  # notice -> bucket generation downloaded
        self.remote_ckpts: set[str] = set()  # checkpoint files known to be in the bucket
        self.metrics_sent = 0  # bytes of the local metrics.jsonl the bucket has (pulled, or appended from here)
        self.metrics_seen: tuple[int, bytes] | None = None  # (generation, bytes) of the bucket's, as last read/written

    def _name(self, rel: str) -> str:
        return f"{self.base}/{rel}" if self.base else rel

    def _rel(self, name: str) -> str:
        return name[len(self.base) + 1:] if self.base else name

    def _list(self, rel_dir: str) -> list[Any]:
        return list(self.client.list_blobs(self.bucket, prefix=self._name(rel_dir) + "/"))

    def _stat(self, rel: str) -> tuple[int, int] | None:
        try:
            st = (self.local / rel).stat()
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime_ns

    def _download(self, blob: Any, rel: str) -> None:
        dest = self.local / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.sync{os.getpid()}")
        blob.download_to_filename(str(tmp))
        os.replace(tmp, dest)  # the trainer never sees half a file (dotfiles are ignored by its watchers)
        stat = self._stat(rel)
        if stat is not None:
            self.synced[rel] = stat

    # ---------------------------------------------------------------- down

    def pull_initial(self) -> None:
        blobs = [b for b in self._list(CHECKPOINTS) if not _skip(self._rel(b.name))]
        blobs.sort(key=lambda b: _index_last(b.name))  # the indexes last: they name the other files
        for blob in blobs:
            rel = self._rel(blob.name)
            self.remote_ckpts.add(rel)
            stat = self._stat(rel)
            if stat is None or stat[0] != blob.size:
                self._download(blob, rel)
            else:
                self.synced[rel] = stat
        metrics = self.bucket.get_blob(self._name(METRICS))
        if metrics is not None:
            stat = self._stat(METRICS)
            if stat is None:  # a new VM: its writer continues the bucket's lines
                self._download(metrics, METRICS)
            elif stat[0] == metrics.size:
                self.synced[METRICS] = stat  # (a restarted sidecar) nothing to upload
            # An existing local file is never replaced: it is this VM's writer's, and a running sidecar counts what
            # of it went up. A restarted sidecar's longer one: the bucket has its first metrics.size bytes, the rest
            # goes up; a shorter one (other VMs' writers appended since): all of it went up.
            self.metrics_sent = min(int(metrics.size), stat[0]) if stat is not None else int(metrics.size)
        self.pull_notices()

    def pull_notices(self) -> int:
        new = 0
        for blob in self._list(NOTICES):
            rel = self._rel(blob.name)
            name = rel.rsplit("/", 1)[-1]
            if not name or name.startswith(".") or self.notice_gens.get(name) == blob.generation:
                continue
            self._download(blob, rel)
            self.notice_gens[name] = blob.generation
            new += 1
            log.info("notice %s", name)
        return new

    def pull_result(self) -> bool:
        """The job's result.json where this VM has none (another VM's writer ended the job): a torchft group that
        joined as the others finished reads it (jobs/torchjob/ft_worker.py). Whether it came down now."""
        if self._stat(RESULT) is not None:
            return False
        blob = self.bucket.get_blob(self._name(RESULT))
        if blob is None:
            return False
        self._download(blob, RESULT)
        return True

    def write_notice(self, name: str, body: str) -> None:
        """A notice this VM raises itself: here first (the payload on this VM reads it at once), then in the
        bucket (the controller and the other VMs)."""
        (self.local / NOTICES / name).write_text(body)
        blob = self.bucket.blob(self._name(f"{NOTICES}/{name}"))
        blob.upload_from_string(body)
        self.notice_gens[name] = blob.generation

    # ---------------------------------------------------------------- up

    def _upload_file(self, rel: str, stat: tuple[int, int]) -> None:
        self.bucket.blob(self._name(rel)).upload_from_filename(str(self.local / rel))
        self.synced[rel] = stat

    def push(self) -> int:
        """Metrics and result as they are now, but uploaded after the checkpoints: a checkpoint line or a result
        the controller reads names only checkpoint files already in the bucket (the trainer writes its files, then
        the line), since the controller may delete the VM as soon as it reads one (a drain's checkpoint, the end)."""
        stat = self._stat(METRICS)
        data = (self.local / METRICS).read_bytes() if stat is not None and self.synced.get(METRICS) != stat else None
        result = self._stat(RESULT)
        uploaded = self._push_checkpoints()
        if stat is not None and data is not None:
            data = data[:data.rfind(b"\n") + 1]  # readers parse lines: never publish half of one
            if len(data) > self.metrics_sent:
                self._append_metrics(data[self.metrics_sent:])
                self.metrics_sent = len(data)
                uploaded += 1
            if len(data) == stat[0]:
                self.synced[METRICS] = stat
        if result is not None and self.synced.get(RESULT) != result:
            self._upload_file(RESULT, result)
            uploaded += 1
        return uploaded

    def _append_metrics(self, lines: bytes, tries: int = 8) -> None:
        """Append ``lines`` to the bucket's metrics.jsonl: written only over the generation read (another VM's
        writer may have appended meanwhile: read it again and retry); read again only when it is not the one this
        sidecar wrote last."""
        name = self._name(METRICS)
        for _ in range(tries):
            current = self.bucket.get_blob(name)
            generation = int(current.generation) if current is not None else 0
            if self.metrics_seen is not None and self.metrics_seen[0] == generation:
                base = self.metrics_seen[1]
            else:
                base = current.download_as_bytes() if current is not None else b""
            blob = self.bucket.blob(name)
            try:
                blob.upload_from_string(base + lines, content_type="application/x-ndjson",
                                        if_generation_match=generation)
            except Exception as e:
                if type(e).__name__ != "PreconditionFailed":
                    raise
                continue
            self.metrics_seen = (int(blob.generation or 0), base + lines)
            return
        raise RuntimeError(f"metrics.jsonl: {tries} appends lost to other writers in a row")

    def _push_checkpoints(self) -> int:
        root = self.local / CHECKPOINTS
        present: dict[str, tuple[int, int]] = {}
        if root.is_dir():
            for path in root.rglob("*"):
                rel = path.relative_to(self.local).as_posix()
                if path.is_file() and not _skip(rel):
                    stat = self._stat(rel)
                    if stat is not None:
                        present[rel] = stat
        changed = sorted((r for r, s in present.items() if self.synced.get(r) != s),
                         key=lambda r: (_index_last(r), r))
        for rel in changed:
            try:
                self._upload_file(rel, present[rel])
            except FileNotFoundError:
                continue  # the trainer rotated it away meanwhile
            self.remote_ckpts.add(rel)
        # Old checkpoints the trainer deleted go from the bucket too, after the new index is up.
        for rel in sorted(self.remote_ckpts - present.keys()):
            try:
                self.bucket.blob(self._name(rel)).delete()
            except Exception as e:  # noqa: BLE001 - a missing object is as good as deleted
                if type(e).__name__ != "NotFound":
                    raise
            self.remote_ckpts.discard(rel)
            self.synced.pop(rel, None)
        return len(changed)


class MaintenanceWatch:
    """Reports GCE's host-maintenance notice of this VM as the VM's notice, once (see the module's docstring). Runs in
    its own thread, so a slow metadata read never holds up the sync; off GCE (no metadata server) it reads again
    only every FAILED_EVERY_S."""

    FAILED_EVERY_S = 300.0

    def __init__(self, sync: Sync, instance: str, url: str, every_s: float) -> None:
        self.sync, self.instance, self.url, self.every_s = sync, instance, url, every_s
        self.reported = threading.Event()
        self.failed = False

    def event(self) -> str | None:
        req = urllib.request.Request(self.url, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(req, timeout=2.0) as resp:
                self.failed = False
                return str(resp.read().decode().strip())
        except (OSError, urllib.error.URLError, ValueError) as e:
            if not self.failed:
                log.info("maintenance-event not readable (%s): read again in %.0f s", e, self.FAILED_EVERY_S)
            self.failed = True
            return None

    def poll(self) -> bool:
        """Whether this call wrote the notice."""
        value = self.event()
        if self.reported.is_set() or not value or not value.startswith("TERMINATE"):
            return False
        self.sync.write_notice(self.instance, json.dumps({"at": time.time(), "maintenance": value}))
        self.reported.set()
        log.info("host maintenance notice (%s): wrote notices/%s", value, self.instance)
        return True

    def run(self, stop: threading.Event) -> None:
        while not self.reported.is_set():
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - the bucket write failed: try again at the next read
                log.warning("maintenance notice not written: %s", e)
            if stop.wait(self.FAILED_EVERY_S if self.failed else self.every_s):
                return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uri", required=True, help="the job's storage: gs://bucket/prefix/<job_id>")
    ap.add_argument("--local", required=True, type=Path, help="local mirror the task uses as its storage")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between passes")
    ap.add_argument("--once", action="store_true", help="download, upload once, exit")
    ap.add_argument("--pull-only", action="store_true", help="only download (tasks that write no job files)")
    ap.add_argument("--pull-result", action="store_true", help="also download result.json once the bucket has it")
    ap.add_argument("--instance", help="this VM's instance name: watch its GCE host-maintenance notice")
    ap.add_argument("--maintenance-poll", type=float, default=10.0, help="seconds between maintenance-event reads")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s storage_sync %(levelname)s %(message)s",
                        stream=sys.stderr)
    args.local.mkdir(parents=True, exist_ok=True)
    (args.local / NOTICES).mkdir(exist_ok=True)
    sync = Sync(args.uri, args.local)

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: final upload", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    delay = 1.0
    for attempt in range(6):
        try:
            sync.pull_initial()
            break
        except Exception as e:  # noqa: BLE001 - network / auth: retry, then give up loudly
            log.warning("initial download failed (%d/6): %s", attempt + 1, e)
            if attempt == 5 or stop.wait(delay):
                return 1
            delay *= 2
    if args.once:
        if not args.pull_only:
            sync.push()
        return 0

    if args.instance:
        watch = MaintenanceWatch(sync, args.instance, os.environ.get("ORCH_MAINTENANCE_URL") or MAINTENANCE_URL,
                                 args.maintenance_poll)
        threading.Thread(target=watch.run, args=(stop,), name="maintenance", daemon=True).start()
    while not stop.wait(args.interval):
        try:
            sync.pull_notices()
            if args.pull_result:
                sync.pull_result()
            if not args.pull_only:
                sync.push()
        except Exception as e:  # noqa: BLE001 - keep syncing through transient errors
            log.warning("sync pass failed: %s", e)
    if args.pull_only:
        return 0
    for attempt in range(3):
        try:
            sync.push()
            return 0
        except Exception as e:  # noqa: BLE001
            log.warning("final upload failed (%d/3): %s", attempt + 1, e)
            time.sleep(0.5)
    return 1


if __name__ == "__main__":
    sys.exit(main())
