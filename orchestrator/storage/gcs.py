"""A job's storage in Google Cloud Storage: ``gs://bucket/prefix`` keeps the job under ``prefix/<job_id>/``.

Instances do not read GCS directly: ``jobs/storage_sync.py`` mirrors the job's files between the bucket
and a local directory on each instance (``local_path()`` is therefore None). With the storage endpoint set
(``gcs_endpoint.STORAGE_ENDPOINT_ENV``), the client talks to that host with anonymous credentials.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage  # type: ignore[attr-defined]

from orchestrator.storage.base import JobStorage
from orchestrator.storage.gcs_endpoint import STORAGE_ENDPOINT_ENV

TIMEOUT_S = 30.0
# Overwriting a small object with the same text is idempotent, so uploads may be retried too (the client
# retries unconditional uploads only when a generation precondition is given).
_RETRY = Retry(initial=0.5, maximum=8.0, multiplier=2.0, timeout=60.0,
               predicate=lambda e: isinstance(e, gexc.TooManyRequests | gexc.ServerError | ConnectionError))


def parse_gs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b/`` -> (``bucket``, ``a/b``)."""
    if not uri.startswith("gs://"):
        raise ValueError(f"{uri!r} is not a gs:// URI")
    bucket, _, prefix = uri[len("gs://"):].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} names no bucket")
    return bucket, prefix.strip("/")


def make_client(project: str | None = None) -> Any:
    """A storage client; against the storage endpoint, if set, with anonymous credentials (no ADC needed)."""
    if os.environ.get(STORAGE_ENDPOINT_ENV):
        return storage.Client(project=project or os.environ.get("GOOGLE_CLOUD_PROJECT") or "anonymous",
                              credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    return storage.Client(project=project)


class GcsStorage(JobStorage):
    def __init__(self, uri: str, job_id: str, client: Any = None) -> None:
        bucket, prefix = parse_gs_uri(uri)
        self.base = f"{prefix}/{job_id}" if prefix else job_id
        self.uri = f"gs://{bucket}/{self.base}"
        self.bucket_name = bucket
        self._client = client

    @property
    def client(self) -> Any:
        # Lazily: constructing a storage object must not need credentials (listing jobs, planning).
        if self._client is None:
            self._client = make_client()
        return self._client

    def _name(self, rel: str) -> str:
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ValueError(f"{rel!r} escapes the job's storage")
        return "/".join([self.base, *parts])

    def _blob(self, rel: str) -> Any:
        return self.client.bucket(self.bucket_name).blob(self._name(rel))

    def read_text(self, rel: str) -> str | None:
        try:
            data: bytes = self._blob(rel).download_as_bytes(timeout=TIMEOUT_S)
        except gexc.NotFound:
            return None
        return data.decode()

    def read_from(self, rel: str, offset: int) -> bytes:
        try:
            if offset <= 0:
                data: bytes = self._blob(rel).download_as_bytes(timeout=TIMEOUT_S)
            else:
                # A ranged read carries no whole-object checksum to verify.
                data = self._blob(rel).download_as_bytes(start=offset, checksum=None, timeout=TIMEOUT_S)
        except (gexc.NotFound, gexc.RequestRangeNotSatisfiable):
            return b""  # missing, or no bytes past offset yet (GCS answers 416)
        return data

    def write_text(self, rel: str, text: str) -> None:
        self._blob(rel).upload_from_string(text, content_type="text/plain; charset=utf-8", timeout=TIMEOUT_S,
                                           retry=_RETRY)

    def list(self, prefix: str) -> list[str]:
        name = self._name(prefix)
        pages = self.client.list_blobs(self.bucket_name, prefix=name + "/", delimiter="/", timeout=TIMEOUT_S)
        names = {b.name.rsplit("/", 1)[-1] for b in pages}
        # Sub-"directories" too, as LocalStorage lists them.
        names |= {p.rstrip("/").rsplit("/", 1)[-1] for p in pages.prefixes}
        return sorted(n for n in names if n and not n.startswith("."))

    def delete(self, rel: str) -> None:
        """Remove one object (missing is fine)."""
        with contextlib.suppress(gexc.NotFound):
            self._blob(rel).delete(timeout=TIMEOUT_S)
