#!/bin/sh
# Runs its arguments once a gce VM's first-boot set-up is done: the VM's startup script runs
# images/gpu-worker.sh (the framework and the payload's packages), then touches
# /var/lib/orchestrator/boot-ready (or boot-failed). The one copy of this wait: jobs/boot_python.sh (the
# built-in and run: tasks' interpreter) execs through it, and a `job: command` task (not pushed jobs/) gets
# this text as `sh -c TEXT boot_wait ARGV...` (providers/gce/backend.py), so no task starts without its
# framework. Exit 3 (retryable) with the set-up log's last lines when the set-up failed or never finished.
dir="${ORCHESTRATOR_BOOT_DIR:-/var/lib/orchestrator}"  # overridable for the tests
limit="${ORCHESTRATOR_BOOT_WAIT_S:-3600}"
waited=0
while [ ! -f "$dir/boot-ready" ]; do
  if [ -f "$dir/boot-failed" ]; then
    echo "boot_wait: the first-boot set-up failed; last lines of $dir/boot.log:" >&2
    tail -n 5 "$dir/boot.log" >&2 2>/dev/null
    exit 3
  fi
  if [ "$waited" -ge "$limit" ]; then
    echo "boot_wait: the first-boot set-up is not done after ${waited}s (see $dir/boot.log)" >&2
    exit 3
  fi
  sleep 5
  waited=$((waited + 5))
done
exec "$@"
