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
