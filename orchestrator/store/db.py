"""Engine from a URL, migrations applied on first use, sessions."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.clock import WALL, Clock
from orchestrator.model.paths import alembic_dir, home_path, user_dir
from orchestrator.store.env import ENV_URL as ENV_URL  # re-exported: callers read db.ENV_URL
from orchestrator.store.env import db_exists as db_exists
from orchestrator.store.env import default_url as default_url

if TYPE_CHECKING:
    from alembic.config import Config


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # The daemon and the CLI use the file at once: WAL + a busy timeout instead of "database is locked".
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA database_list")
    files = [row[2] for row in cur.fetchall() if row[2]]
    cur.close()
    for path in files:
        _owner_only(Path(path))


def _owner_only(db: Path) -> None:
    """The DB (jobs, specs, events) and its WAL are readable by their owner only; so is the home beside it."""
    for path, mode in ((db, 0o600), (db.with_name(db.name + "-wal"), 0o600), (db.with_name(db.name + "-shm"), 0o600)):
        with contextlib.suppress(OSError):
            if path.exists() and path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
                path.chmod(mode)
    with contextlib.suppress(OSError):
        if db.parent.resolve() == home_path().resolve():
            user_dir()  # narrows the home to 0700 (a home made by hand, or widened since)


@functools.cache
def get_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    engine = create_engine(url, pool_pre_ping=True)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def alembic_config(url: str) -> Config:
    # Alembic (0.3 s of import) is loaded by the first session or migration, never by a verb that opens no DB.
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(alembic_dir()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def current_revision(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with get_engine(url).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


# pg_advisory_xact_lock's key for schema migrations: any fixed 64-bit number, the same in every process.
CLOCK = "orchestrator.clock"  # the Session.info key of the clock that stamps its writes
MIGRATION_LOCK_KEY = 0x6F72636865737472  # "orchestr"


def _migration_lock(conn: Connection) -> None:
    """Serialise migrations across processes: daemons started together on a fresh PostgreSQL would each
    create alembic_version and the tables (UniqueViolation). The lock is held until the transaction ends;
    a waiter then finds the schema migrated and alembic does nothing. SQLite: see ``_sqlite_file_lock``."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})


@contextlib.contextmanager
def _sqlite_file_lock(url: str) -> Iterator[None]:
    """Serialise migrations of one SQLite file across processes. The driver runs DDL outside a transaction,
    so two CLIs started at once on a fresh file both create the tables ("table ... already exists") unless
    they take turns; the second then finds the schema at head and alembic does nothing."""
    path = url.removeprefix("sqlite:///")
    if not url.startswith("sqlite:///") or not path or path == ":memory:":
        yield
        return
    lock = Path(path).with_name(Path(path).name + ".migrate-lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor closes, also if the process dies
        yield
    finally:
        os.close(fd)


def upgrade(url: str, revision: str = "head") -> None:
    engine = get_engine(url)
    with _sqlite_file_lock(url), engine.begin() as conn:
        _migration_lock(conn)
        cfg = alembic_config(url)
        cfg.attributes["connection"] = conn
        from alembic import command

        command.upgrade(cfg, revision)


def downgrade(url: str, revision: str = "base") -> None:
    engine = get_engine(url)
    with _sqlite_file_lock(url), engine.begin() as conn:
        _migration_lock(conn)
        cfg = alembic_config(url)
        cfg.attributes["connection"] = conn
        from alembic import command

        command.downgrade(cfg, revision)
    _ensure_schema.cache_clear()  # the next session must upgrade again


@functools.cache
def _ensure_schema(url: str) -> None:
    if current_revision(url) != head_revision():
        upgrade(url)


def session_factory(url: str | None = None) -> sessionmaker[Session]:
    url = url or default_url()
    _ensure_schema(url)
    return sessionmaker(get_engine(url), expire_on_commit=False)


@contextlib.contextmanager
def open_session(url: str | None = None, clock: Clock = WALL) -> Iterator[Session]:
    """A session on an up-to-date schema; commits on success, rolls back on error. ``clock`` stamps what the
    store writes through it (``queries.clock_of``)."""
    with session_factory(url)() as session:
        session.info[CLOCK] = clock
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
