"""Environment passed from the controller to tasks on remote machines."""

from __future__ import annotations

import os

from orchestrator.storage.gcs_endpoint import STORAGE_ENDPOINT_ENV

# The storage endpoint the controller uses, so that a payload's storage sync reaches the same GCS.
PASSED_ENV = (STORAGE_ENDPOINT_ENV,)


def passed_env() -> dict[str, str]:
    return {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
