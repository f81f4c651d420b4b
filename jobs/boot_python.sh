#!/bin/sh
# The tasks' interpreter on a gce VM that installs its framework at first boot: the VM's startup script runs
# images/gpu-worker.sh and then touches /var/lib/orchestrator/boot-ready (or boot-failed). A task started
# before that waits here, then runs the framework's python3, so no task starts without its framework.
dir="${ORCHESTRATOR_BOOT_DIR:-/var/lib/orchestrator}"  # overridable for the tests
limit="${ORCHESTRATOR_BOOT_WAIT_S:-3600}"
waited=0
while [ ! -f "$dir/boot-ready" ]; do
  if [ -f "$dir/boot-failed" ]; then
    echo "boot_python: the first-boot set-up failed; last lines of $dir/boot.log:" >&2
    tail -n 5 "$dir/boot.log" >&2 2>/dev/null
    exit 3
  fi
  if [ "$waited" -ge "$limit" ]; then
    echo "boot_python: the first-boot set-up is not done after ${waited}s (see $dir/boot.log)" >&2
    exit 3
  fi
  sleep 5
  waited=$((waited + 5))
done
exec "${ORCHESTRATOR_BOOT_PYTHON:-/usr/local/bin/python3}" "$@"  # the venv images/gpu-worker.sh made
