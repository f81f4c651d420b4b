"""The `orchestrator` command line: one module per group of verbs; thin (parse, call, render)."""
