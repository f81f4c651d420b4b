"""Where the GCS client sends its calls: google-cloud-storage reads this variable itself (its name is the
library's, kept here once), and calls that host without credentials."""

from __future__ import annotations

STORAGE_ENDPOINT_ENV = "STORAGE_EMULATOR_HOST"
