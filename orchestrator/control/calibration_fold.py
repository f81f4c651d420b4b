"""The loop closes: a finished job's measured step times refine the calibration the next `plan` uses.

When a job succeeds, the daemon refits the step-time model on every real (not emulated) job's step times in the
results DB, starting from the newest stored calibration of real GPUs (else the shipped one), and stores the
result as the newest calibration: `orchestrator plan` reads the newest one. Emulated runs (the local provider)
calibrate nothing real: they are kept apart (`orchestrator model calibrate --from-db` fits the local host from
them on request). A fold that cannot fit (too few points, a label the model does not know) leaves a note on the
job and changes nothing; it never fails the job.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from orchestrator.costmodel.calibration import fit_report, measurements_from_dicts, unprofiled_models
from orchestrator.costmodel.profiles import UnknownModelError
from orchestrator.model.catalog import CatalogError
from orchestrator.store import queries
from orchestrator.store.calibrations import newest_real_calibration
from orchestrator.store.models import Job

log = logging.getLogger(__name__)


def fold_finished_job(session: Session, job: Job) -> str:
    """Refit after ``job`` succeeded; a one-line account of what happened (also a note on the job)."""
    mine = queries.step_time_measurements(session, [job.id])
    refused = [r["refused"] for r in mine if "refused" in r]
    if refused or not mine:
        why = refused[0] if refused else "it logged no per-worker step times"
        return _note(session, job, f"calibration not refined: {why}")
    if any(r["emulated"] for r in mine):
        return _note(session, job, "calibration not refined: emulated GPUs (local provider) calibrate nothing "
                     "real; `orchestrator model calibrate --from-db` fits this host from them")
    unknown = unprofiled_models(r["model"] for r in mine)
    if unknown:
        return _note(session, job, f"calibration not refined: no cost-model profile of {unknown[0]} on this "
                     "machine (`orchestrator model profile --torch` makes one)")
    rows = [r for r in queries.step_time_measurements(session) if "refused" not in r and not r["emulated"]]
    unknown = unprofiled_models(r["model"] for r in rows)  # other jobs' models never profiled here
    rows = [r for r in rows if r["model"] not in unknown]
    base = newest_real_calibration(session)
    try:
        report = fit_report(measurements_from_dicts(rows), name=f"auto after {job.id}"[:64], base=base)
    except (ValueError, CatalogError, UnknownModelError) as exc:
        return _note(session, job, f"calibration not refined: {exc}"[:480])
    calib = report.calibration.with_meta(source=f"{base.name} refined on {len(rows)} DB step times")
    stored = queries.save_calibration(session, calib.name, "results DB (daemon, finished jobs)", calib.to_dict(),
                                      None)
    return _note(session, job, f"calibration {stored} refined on {len(rows)} measured step times "
                 f"({len(mine)} from this job): the next plan uses it")


def _note(session: Session, job: Job, text: str) -> str:
    queries.note(session, job.id, "calibration", text[:500])
    session.commit()
    log.info("job %s: %s", job.id, text)
    return text
