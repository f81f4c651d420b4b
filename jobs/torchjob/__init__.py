"""PyTorch training payload: elastic synchronous DDP under ``torchrun`` (see ``jobs/torchjob/README.md``).

Entry points: ``node.py`` (one per instance: runs the spec's ``setup:``, then execs ``torchrun``),
``worker.py`` (the built-in ResNet job, one per rank) and ``user_entry.py`` (wraps the user's ``run:``
command on each rank). Nothing here imports the orchestrator package.
"""

EXIT_OK = 0
EXIT_ERROR = 1  # unexpected error
EXIT_BAD_TASK = 2  # task.json missing or invalid
