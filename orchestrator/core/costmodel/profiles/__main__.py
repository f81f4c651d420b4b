"""``python -m orchestrator.core.costmodel.profiles [--write]``: print or regenerate data/model_profiles.json."""

from orchestrator.core.costmodel.profiles import main

raise SystemExit(main())
