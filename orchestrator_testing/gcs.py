"""An in-memory Cloud Storage emulator (gcp-storage-emulator) on a free port, for tests.

    with GcsEmulator(bucket="orch-test") as gcs:   # sets STORAGE_EMULATOR_HOST while open
        storage = GcsStorage(gcs.uri("runs"), "job1")
        subprocess.run([...])                      # children inherit STORAGE_EMULATOR_HOST

The server runs in a thread of this process; the client libraries (here and in subprocesses) find it
through ``STORAGE_EMULATOR_HOST``, which ``start`` sets and ``stop`` restores.
"""

from __future__ import annotations

import logging
import os
from types import TracebackType
from typing import Any

from gcp_storage_emulator.server import create_server

ENV = "STORAGE_EMULATOR_HOST"


class GcsEmulator:
    def __init__(self, bucket: str = "orchestrator-test", host: str = "127.0.0.1") -> None:
        self.bucket = bucket
        self.host = host
        self.port = 0
        self._server: Any = None
        self._saved_env: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def uri(self, prefix: str = "") -> str:
        """``gs://<bucket>/<prefix>`` for this emulator's default bucket."""
        return f"gs://{self.bucket}/{prefix}".rstrip("/")

    def start(self) -> GcsEmulator:
        # It logs every 404 (a normal answer to "does this file exist yet?") as an ERROR.
        logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
        # Port 0: the OS picks a free port, read back from the bound server (no probe-then-bind race).
        self._server = create_server(self.host, 0, in_memory=True, default_bucket=self.bucket)
        self._server.start()
        self.port = int(self._server._api._httpd.server_address[1])
        self._saved_env = os.environ.get(ENV)
        os.environ[ENV] = self.url
        return self

    def wipe(self) -> None:
        """Delete every object, keep the buckets."""
        self._server.wipe(keep_buckets=True)

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.stop()
        self._server = None
        if self._saved_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._saved_env

    def __enter__(self) -> GcsEmulator:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
