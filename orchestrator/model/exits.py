"""What a task's exit code means: the contract between the controller and every payload (the built-in
TensorFlow and PyTorch jobs, and a user's ``command:`` / ``run:``), documented in jobs/README.md.

- 0: done. The job's writer task (async chief, sync worker 0) exiting 0 ends the job as succeeded; it
  is never started again.
- 2 (``EXIT_FATAL``, the payloads' "bad task.json / bad input"): retrying cannot help. The job is
  restarted at most once (the input may have been read mid-write), then FAILED with the log tail.
- anything else (1 unexpected error, 3 cluster failure, killed by a signal, preempted): retryable, from the
  latest checkpoint, within the policy's restart allowance.
"""

from __future__ import annotations

from enum import StrEnum

EXIT_OK = 0
EXIT_FATAL = 2
FATAL_RETRIES = 1


class Exit(StrEnum):
    DONE = "done"
    FATAL = "fatal"
    RETRY = "retry"


def classify(code: int | None) -> Exit:
    if code == EXIT_OK:
        return Exit.DONE
    if code == EXIT_FATAL:
        return Exit.FATAL
    return Exit.RETRY


# `orchestrator launch`'s own exit status, by how the job it drove ended (README "Exit codes", `launch --help`):
# a script or CI step must never read a failed job as done. 2 stays "bad input, nothing created" (UserError);
# 130 / 143 are Ctrl-C / SIGTERM.
LAUNCH_FAILED = 1
LAUNCH_CANCELLED = 3


def launch_exit(job_status: str) -> int:
    """0 for a job that succeeded (or is still running elsewhere: handed over, detached), else non-zero."""
    return {"failed": LAUNCH_FAILED, "cancelled": LAUNCH_CANCELLED}.get(job_status, EXIT_OK)
