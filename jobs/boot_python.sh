#!/bin/sh
# The tasks' interpreter on a gce VM that installs its framework at first boot: waits for that set-up
# (jobs/boot_wait.sh, pushed beside it; run by sh so its mode bit does not matter), then runs the
# framework's python3 (the venv images/gpu-worker.sh made).
exec /bin/sh "$(dirname "$0")/boot_wait.sh" "${ORCHESTRATOR_BOOT_PYTHON:-/usr/local/bin/python3}" "$@"
