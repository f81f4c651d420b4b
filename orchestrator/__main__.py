"""`python -m orchestrator ...` is the same as the `orchestrator` command."""

from orchestrator.cli.main import main

main()
