"""Which calibration a spec is planned with: one rule for `plan`, `launch`, its dry run, `simulate` and the
daemon, so that `launch` runs the cluster `plan` showed, `simulate` replays it and the daemon plans its deadline
with what the launch planned."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.costmodel import Calibration, load_calibration
from orchestrator.model.errors import UserError
from orchestrator.model.spec import JobSpec
from orchestrator.store.env import db_exists

if TYPE_CHECKING:  # SQLAlchemy and the ORM (0.3 s of import) load only where a results DB is there to read
    from sqlalchemy.orm import Session


def resolve_calibration(ref: str | None) -> Calibration | None:
    """``None`` (built-in defaults), a calibration ID in the results DB, or a calibration JSON file."""
    if ref is None:
        return None
    if ref.strip().isdigit():
        from orchestrator.store.db import open_session
        from orchestrator.store.queries import load_calibration as load_row  # lazy: the ORM models (~30 ms)

        try:
            with open_session() as session:
                params = load_row(session, int(ref))
        except LookupError as exc:
            raise UserError(str(exc)) from None
        try:
            return Calibration.from_dict(params)
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"calibration {ref} in the DB is not a cost-model calibration: {exc}") from None
    path = Path(ref)
    if not path.exists():
        raise UserError(f"--calibration {ref!r} is neither a calibration ID nor an existing file",
                        hint="see `orchestrator model calibrate --out FILE.json`")
    try:
        return load_calibration(path)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def latest_calibration(real: bool = False) -> Calibration | None:
    """The newest calibration stored in the results DB (jobs refine it; ``real``: the newest of real GPUs), or
    None; never creates the DB."""
    if not db_exists():
        return None
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.store.calibrations import newest_calibration
    from orchestrator.store.db import open_session

    try:
        with open_session() as session:
            return newest_calibration(session, real)
    except SQLAlchemyError:  # a DB this version cannot read: plan with the shipped calibration
        return None


def reads_real_gpus(spec: JobSpec, as_cloud: bool = False) -> bool:
    """A cloud's GPUs (or a local spec simulated ``as_cloud``) are planned from real GPUs' calibrations only."""
    return as_cloud or not spec.provider.emulates_gpus


def planning_calibration(spec: JobSpec, as_cloud: bool = False) -> Calibration | None:
    """What a spec is planned with when no calibration is named: the newest stored one its GPUs may read, else
    None (the shipped one)."""
    return latest_calibration(real=reads_real_gpus(spec, as_cloud))


def launched_calibration(session: Session, spec: JobSpec, created_at: float) -> Calibration | None:
    """The calibration a job was launched with: the rule above, as it stood when the job was recorded (a fold
    during the run changes nothing, and every daemon plans the job alike)."""
    from orchestrator.store.calibrations import newest_calibration

    return newest_calibration(session, real=reads_real_gpus(spec), before=created_at)
