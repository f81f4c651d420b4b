"""``python -m orchestrator.costmodel.profiles [--write]``: print or regenerate data/model_profiles.json."""

from orchestrator.costmodel.profiles import main

raise SystemExit(main())
