"""TensorFlow training payload pushed by the orchestrator controller to every instance.

Only `train.py` (one level up) is an entry point; see ``jobs/README.md`` for the contract.
"""

EXIT_OK = 0
EXIT_ERROR = 1  # unexpected error (bug, bad data, ...)
EXIT_BAD_TASK = 2  # task.json missing or invalid
EXIT_CLUSTER = 3  # cluster failure: PS lost (async), peer lost / collective timeout (sync), unreachable
