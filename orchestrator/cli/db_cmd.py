"""`orchestrator db upgrade|current`."""

from __future__ import annotations

import typer

from orchestrator.cli.listing import check_format, format_option, print_csv, print_json
from orchestrator.cli.render import console
from orchestrator.model.errors import UserError

app = typer.Typer(help="The results database (SQLite by default; any SQLAlchemy URL via --db / ORCHESTRATOR_DB_URL).")


@app.command("upgrade")
def upgrade(revision: str = typer.Argument("head", help="target revision")) -> None:
    """Apply migrations (the CLI also does this on first use)."""
    from alembic.util.exc import CommandError  # alembic takes ~0.5 s to import; only these verbs need it

    from orchestrator.store import db  # lazy: SQLAlchemy and alembic load only when a verb opens the DB

    url = db.default_url()
    try:
        db.upgrade(url, revision)
    except CommandError as exc:  # an unknown revision: alembic's own words, one line
        raise UserError(f"revision: {exc}", hint="`orchestrator db current` shows the head revision") from None
    console.print(f"database {db.get_engine(url).url.render_as_string(hide_password=True)} at revision "
                  f"{db.current_revision(url)}")


@app.command("current")
def current(fmt: str = format_option()) -> None:
    """Print the database's revision and the newest one this version knows."""
    check_format(fmt)
    from orchestrator.store import db  # lazy: SQLAlchemy and alembic load only when a verb opens the DB

    url = db.default_url()
    record = {"url": db.get_engine(url).url.render_as_string(hide_password=True),
              "current": db.current_revision(url), "head": db.head_revision()}
    if fmt == "json":
        print_json(record)
    elif fmt == "csv":
        print_csv([record])
    else:  # the URL can be long: wrapped, never cut (it is what a user copies)
        console.print(f"url:      {record['url']}", highlight=False, markup=False)
        console.print(f"current:  {record['current'] or '(empty database)'}", highlight=False, markup=False)
        console.print(f"head:     {record['head']}", highlight=False, markup=False)


@app.command("downgrade")
def downgrade(revision: str = typer.Argument(..., help="target revision, e.g. base")) -> None:
    """Roll migrations back (drops data)."""
    from alembic.util.exc import CommandError  # alembic takes ~0.5 s to import; only these verbs need it

    from orchestrator.store import db  # lazy: SQLAlchemy and alembic load only when a verb opens the DB

    try:
        db.downgrade(db.default_url(), revision)
    except CommandError as exc:
        raise UserError(f"revision: {exc}", hint="`orchestrator db current` shows them; base = empty") from None
    console.print(f"at revision {db.current_revision(db.default_url()) or 'base'}")
