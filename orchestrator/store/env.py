"""Where the results DB is named, without loading SQLAlchemy (the CLI reads it on every start)."""

ENV_URL = "ORCHESTRATOR_DB_URL"
