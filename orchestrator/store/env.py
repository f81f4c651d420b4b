"""Where the results DB is named, without loading SQLAlchemy (the CLI reads it on every start)."""

import os
from pathlib import Path

from orchestrator.model.paths import user_dir

ENV_URL = "ORCHESTRATOR_DB_URL"


def default_url() -> str:
    return os.environ.get(ENV_URL) or f"sqlite:///{user_dir() / 'orchestrator.db'}"


def db_exists(url: str | None = None) -> bool:
    """The results DB is there to read (a server DB always is): reading must not create a SQLite file."""
    url = url or default_url()
    if not url.startswith("sqlite:///"):
        return not url.startswith("sqlite")  # in-memory SQLite holds nothing to read
    return Path(url.removeprefix("sqlite:///")).exists()
