"""Environment passed from the controller to tasks on remote machines."""

from __future__ import annotations

import os

PASSED_ENV = ("STORAGE_EMULATOR_HOST",)  # tests point the payload's storage sync at the emulator


def passed_env() -> dict[str, str]:
    return {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
