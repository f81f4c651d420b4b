"""Job storage: job files, metrics, checkpoints and preemption notices (a local directory or GCS)."""

from __future__ import annotations

from orchestrator.storage.base import JobStorage
from orchestrator.storage.local import LocalStorage


def open_storage(uri: str, job_id: str) -> JobStorage:
    """The storage of one job: ``<uri>/<job_id>/``."""
    if uri.startswith("gs://"):
        from orchestrator.storage.gcs import GcsStorage  # google-cloud-storage loads only for gs:// jobs

        return GcsStorage(uri, job_id)
    return LocalStorage(uri, job_id)


__all__ = ["JobStorage", "LocalStorage", "open_storage"]
