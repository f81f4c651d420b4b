"""The loop closes: a job's measured step times refine the calibration the next `plan` uses.

When a job succeeds, the daemon refits the step-time model on every real (not emulated) job's step times in the
results DB, starting from the newest stored calibration of real GPUs (else the shipped one), and stores the
result as the newest calibration: `orchestrator plan` reads the newest one. Emulated runs (the local provider)
calibrate nothing real: they are kept apart (`orchestrator model calibrate --from-db` fits the local host from
them on request). A fold that cannot fit (too few points, a label the model does not know) leaves a note on the
job and changes nothing; it never fails the job.

A running job is a probe too (control/live_pace.py): while it runs, the same fit with its step times so far is
stored as its one live row (``live_source``), each fold replacing the last, so a plan made meanwhile reads it.
Every fold of a job starts from the newest calibration that is not that job's own live row, and the job's step
times enter the fit once, as its mean per worker label (``queries.step_time_measurements``): the fold at its end
is the one it would have been without the live ones, which it replaces. A live fold that cannot fit is silent:
the end's says why.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from orchestrator.costmodel import Calibration
from orchestrator.costmodel.calibration import fit_report, measurements_from_dicts, unprofiled_models
from orchestrator.costmodel.profiles import UnknownModelError
from orchestrator.model.catalog import CatalogError
from orchestrator.store import queries
from orchestrator.store.calibrations import newest_real_calibration
from orchestrator.store.models import Job

log = logging.getLogger(__name__)
FINISHED_SOURCE = "results DB (daemon, finished jobs)"


def live_source(job_id: str) -> str:
    """The source of a running job's own calibration row (one per job)."""
    return f"results DB (daemon, running job {job_id})"[:200]


def fold_finished_job(session: Session, job: Job) -> str:
    """Refit after ``job`` succeeded; a one-line account of what happened (also a note on the job)."""
    fitted = _refit(session, job, live=False)
    if isinstance(fitted, str):
        return _note(session, job, f"calibration not refined: {fitted}")
    calib, rows, mine = fitted
    stored = queries.save_calibration(session, calib.name, FINISHED_SOURCE, calib.to_dict(), None)
    queries.drop_calibrations(session, live_source(job.id))  # its live folds: this one replaces them
    return _note(session, job, f"calibration {stored} refined on {rows} measured step times "
                 f"({mine} from this job): the next plan uses it")


def fold_running_job(session: Session, job: Job) -> str | None:
    """Refit with ``job``'s step times so far, stored as its live row; what was stored, or None (no fit)."""
    fitted = _refit(session, job, live=True)
    if isinstance(fitted, str):
        log.debug("job %s: no live calibration: %s", job.id, fitted)
        return None
    calib, rows, mine = fitted
    stored = queries.replace_calibration(session, calib.name, live_source(job.id), calib.to_dict())
    session.commit()
    text = f"calibration {stored} refined on {rows} measured step times ({mine} from this running job)"
    log.info("job %s: %s", job.id, text)
    return text


def _refit(session: Session, job: Job, live: bool) -> tuple[Calibration, int, int] | str:
    """The refit with ``job``'s step times (``live``: while it runs), its rows and the job's own; or why not."""
    running = [job.id] if live else []
    mine = queries.step_time_measurements(session, [job.id], running)
    refused = [r["refused"] for r in mine if "refused" in r]
    if refused or not mine:
        return refused[0] if refused else "it logged no per-worker step times"
    if any(r["emulated"] for r in mine):
        return ("emulated GPUs (local provider) calibrate nothing real; `orchestrator model calibrate --from-db` "
                "fits this host from them")
    unknown = unprofiled_models(r["model"] for r in mine)
    if unknown:
        return f"no cost-model profile of {unknown[0]} on this machine (`orchestrator model profile --torch` makes one)"
    rows = [r for r in queries.step_time_measurements(session, None, running)
            if "refused" not in r and not r["emulated"]]
    unknown = unprofiled_models(r["model"] for r in rows)  # other jobs' models never profiled here
    rows = [r for r in rows if r["model"] not in unknown]
    base = newest_real_calibration(session, besides=live_source(job.id))
    name = f"{'live' if live else 'auto after'} {job.id}"[:64]
    try:
        report = fit_report(measurements_from_dicts(rows), name=name, base=base)
    except (ValueError, CatalogError, UnknownModelError) as exc:
        return f"{exc}"[:480]
    calib = report.calibration.with_meta(source=f"{base.name} refined on {len(rows)} DB step times")
    return calib, len(rows), len(mine)


def _note(session: Session, job: Job, text: str) -> str:
    queries.note(session, job.id, "calibration", text[:500])
    session.commit()
    log.info("job %s: %s", job.id, text)
    return text
