"""`orchestrator report JOB --plot FILE`: the job's plots (cli/plots.py), and for a deadline job the policy's
timeline below them (cli/deadline_report.py). Here, above both, so that neither imports the other back."""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from sqlalchemy.orm import Session

from orchestrator.cli.deadline_report import deadline_job, draw_deadline_panel
from orchestrator.cli.plots import format_for, gather, render


def write_plot(session: Session, job_id: str, path: Path) -> None:
    fmt = format_for(path)
    job = deadline_job(session, job_id)
    data = gather(session, job_id)
    if job is not None:  # on_revocation: deadline: the three plots, then the policy's timeline

        def panel(ax: Axes, scale: float) -> None:
            draw_deadline_panel(ax, session, job, data.bars, data.end, scale)

        path.write_bytes(render(data, fmt, panel, until=float(job.deadline_s or 0.0)))
        return
    path.write_bytes(render(data, fmt))
