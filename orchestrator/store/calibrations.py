"""The calibrations stored in the results DB: the newest one a plan may read (one rule for `plan`, `model
predict`, `model calibrate --from-db`, the fold and the daemon: real GPUs are planned and refined only from real
GPUs' step times)."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.costmodel import Calibration
from orchestrator.costmodel.compute import DEFAULT_CALIBRATION
from orchestrator.store.models import Calibration as CalibrationRow


def newest_calibration(session: Session, real: bool, before: float | None = None,
                       besides: str | None = None) -> Calibration | None:
    """The newest stored calibration (``real``: the newest fitted on real GPUs; ``before``: the newest stored by
    then, e.g. the one a job was launched with; ``besides``: not one stored from that source, e.g. a running job's
    own fold), named with its DB id; None when there is none."""
    rows = select(CalibrationRow).order_by(CalibrationRow.created_at.desc(), CalibrationRow.id.desc()).limit(20)
    if before is not None:
        rows = rows.where(CalibrationRow.created_at <= before)
    if besides is not None:
        rows = rows.where(CalibrationRow.source != besides)
    for row in session.scalars(rows):
        try:
            calib = Calibration.from_dict(json.loads(row.params))
        except (ValueError, KeyError, TypeError):
            continue  # an old row this version cannot read
        if not (real and calib.emulated):
            return calib.with_meta(name=f"{calib.name} (DB id {row.id})")
    return None


def newest_real_calibration(session: Session, besides: str | None = None) -> Calibration:
    """The newest stored calibration of real GPUs (``besides``: not one from that source), else the shipped one."""
    return newest_calibration(session, real=True, besides=besides) or DEFAULT_CALIBRATION
