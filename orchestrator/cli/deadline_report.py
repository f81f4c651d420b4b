"""``on_revocation: deadline`` jobs in ``report`` and ``report --plot``: when the job ran on spot, on
on-demand or waited, against the line of uniform progress (the whole work spread evenly up to the
deadline, "Can't Be Late", NSDI'24)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.model.availability import AvailabilityTraceError
from orchestrator.model.spec import OnRevocation
from orchestrator.model.spec import stored_spec as job_spec
from orchestrator.sim.from_spec import SimSpecError
from orchestrator.store import queries
from orchestrator.store.models import Job, Metric

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from orchestrator.cli.plots import Bar

MIN_WAIT_S = 2.0
MIXED = "spot + on-demand"  # an elastic world of both (decide.deadline_elastic): spot workers topped up with on-demand
MODE_COLOURS = {"spot": "#66bb6a", MIXED: "#c0ca33", "on-demand": "#ef6c00", "waiting": "#bdbdbd"}


def segments(bars: Sequence[Bar], end: float) -> list[tuple[float, float, str]]:
    """(start, end, spot | on-demand | waiting, or spot + on-demand for a world of both) of the job's workers,
    seconds since its start."""
    workers = [b for b in bars if b.slot.startswith("worker")]
    if len({b.slot for b in workers}) > 1:
        return [(a, b, _mode(spot, od)) for a, b, spot, od in memberships(workers, end)]
    out: list[tuple[float, float, str]] = []
    t = 0.0
    for b in sorted(workers, key=lambda b: b.start):
        stop = b.end if b.revoked is None else b.revoked
        if b.start > t:
            out.append((t, b.start, "waiting"))
        if stop > max(t, b.start):
            out.append((max(t, b.start), stop, "spot" if b.spot else "on-demand"))
        t = max(t, stop)
    if end > t:
        out.append((t, end, "waiting"))
    # Gaps of a moment (the first request a beat after the start, the teardown after the last VM) are no wait.
    return [s for s in out if s[2] != "waiting" or s[1] - s[0] >= MIN_WAIT_S]


def _mode(spot: int, on_demand: int) -> str:
    return "waiting" if spot + on_demand == 0 else "spot" if not on_demand else "on-demand" if not spot else MIXED


def memberships(workers: Sequence[Bar], end: float) -> list[tuple[float, float, int, int]]:
    """(start, end, spot VMs, on-demand VMs) of a multi-worker job's workers, a new stretch at each change of
    membership; a change of a moment (a replacement requested a beat after the loss) goes into the stretch before."""
    cuts = sorted({0.0, end, *(b.start for b in workers), *(_stop(b) for b in workers)})
    out: list[tuple[float, float, int, int]] = []
    for a, b in pairwise(cuts):
        on = [w for w in workers if w.start <= a and _stop(w) >= b]
        spot, od = sum(w.spot for w in on), sum(not w.spot for w in on)
        if out and (b - a < MIN_WAIT_S or out[-1][2:] == (spot, od)):
            out[-1] = (out[-1][0], b, *out[-1][2:])
        else:
            out.append((a, b, spot, od))
    if len(out) > 1 and out[0][1] < MIN_WAIT_S:  # the first request a beat after the start is no wait
        out[:2] = [(0.0, out[1][1], *out[1][2:])]
    return out


def _size(spot: int, on_demand: int, workers: int) -> str:
    if spot and on_demand:
        return f" ({spot} spot + {on_demand} on-demand of {workers} workers)"
    return f" ({spot + on_demand} of {workers} workers)" if spot + on_demand else ""


def _stop(b: Bar) -> float:
    return b.end if b.revoked is None else b.revoked


def is_deadline_job(job: Job) -> bool:
    try:
        spec = job_spec(job.spec_yaml)
    except Exception:  # noqa: BLE001 - an old spec that no longer loads is shown without this section
        return False
    return spec.policy.on_revocation == OnRevocation.DEADLINE and job.deadline_s is not None


def progress_points(session: Session, job: Job) -> list[tuple[float, float]]:
    """(seconds since the start, share of the steps done) from the job's step metrics."""
    t0 = job.started_at or job.created_at
    rows = session.execute(select(Metric.at, Metric.step).where(
        Metric.job_id == job.id, Metric.kind == "step", Metric.worker == -1).order_by(Metric.at)).all()
    return [(0.0, 0.0)] + [(at - t0, min(1.0, step / max(1, job.train_steps))) for at, step in rows]


def deadline_section(session: Session, rows: list[dict[str, Any]]) -> list[str]:
    """Per deadline job: the spot / on-demand / waiting timeline, each change with the progress then against
    the line of uniform progress, and whether the deadline was met."""
    from orchestrator.cli.plots import gather  # lazy: the plot data module, as the report's --plot

    lines = []
    for r in rows:
        job = session.get(Job, r["job_id"])
        if job is None or not is_deadline_job(job):
            continue
        data = gather(session, job.id)
        deadline = float(job.deadline_s or 0.0)
        points = progress_points(session, job)
        parts = []
        workers = [b for b in data.bars if b.slot.startswith("worker")]
        zoned = len({b.zone for b in workers if b.spot}) > 1  # the job moved spot between zones: say where
        typed = len({b.gpu for b in workers if b.spot}) > 1  # ... or between GPU types (policy.also_gpus)
        slots = len({b.slot for b in workers})
        sizes = {(a, b): _size(s, o, slots) for a, b, s, o in memberships(workers, data.end)} if slots > 1 else {}
        for start, stop, mode in segments(data.bars, data.end):
            done = max((p for t, p in points if t <= start), default=0.0)
            line = 100 * start / deadline
            bar = next((b for b in workers if b.spot and b.start <= start < (b.revoked or b.end)), None)
            where = "" if bar is None or mode != "spot" else (
                (f" on {bar.gpu}" if typed else "") + (f" in {bar.zone}" if zoned else ""))
            where += sizes.get((start, stop), "")
            parts.append(f"{mode}{where} {start:.0f}-{stop:.0f}s (done {100 * done:.0f}% / uniform line {line:.0f}%)")
        met = "met" if job.status == "succeeded" and data.end <= deadline else (
            "missed" if job.status in ("succeeded", "failed") else "running")
        lines.append(f"{job.id}: deadline {deadline:.0f}s {met} (ran {data.end:.0f}s)")
        lines += [f"  {p}" for p in parts]
        lines += [f"  {w}" for w in _planned_lines(session, job, data.end)]
    return lines


def _planned_lines(session: Session, job: Job, end: float) -> list[str]:
    """The training time and restart overhead the daemon planned with: predicted, and as the job measured them (the
    pace replaces the prediction once the job has reported enough steps, control/deadline.measured_step_s; the
    longest restart seen counts where it is longer, measured_overhead_s). These are why a launch's decisions can
    differ from `simulate --availability-trace --history-h 0`, which plans with the predictions."""
    from orchestrator.control.deadline import measured_overhead_s, own_pace_s, planned_figures  # lazy

    spec = job_spec(job.spec_yaml)
    try:
        planned = planned_figures(session, job, spec)
    except (SimSpecError, AvailabilityTraceError):  # a trace the spec replayed has moved since: no plan to show
        return []
    predicted = planned.work_s
    pace = own_pace_s(session, job, spec, (job.started_at or 0.0) + end)
    if pace is None:
        work = f"work: predicted {predicted:.0f}s (too few progress reports to measure the pace)"
    else:
        measured = pace * job.train_steps
        work = (f"work: predicted {predicted:.0f}s, at the pace the job measured {measured:.0f}s "
                f"({measured / predicted - 1:+.0%}; the daemon plans with the measured pace)")
    seen = measured_overhead_s(session, job, (job.started_at or 0.0) + end)
    kept = "keeps slack for the longer one" if seen > planned.overhead_s else "plans with the planned one"
    return [work, f"restart overhead: planned {planned.overhead_s:.1f}s, the longest restart the job measured "
                  f"{seen:.1f}s (request to first step; the daemon {kept})"]


def draw_deadline_panel(ax: Axes, session: Session, job: Job, bars: Sequence[Bar], end: float, scale: float) -> None:
    """Spot / on-demand / waiting bands, the work done, and the line of uniform progress to the deadline."""
    from matplotlib.patches import Patch  # lazy: matplotlib, as in plots.render

    deadline = float(job.deadline_s or 0.0)
    for start, stop, mode in segments(bars, end):
        ax.axvspan(start / scale, stop / scale, color=MODE_COLOURS[mode], alpha=0.45, linewidth=0)
    pts = progress_points(session, job)
    ax.plot([t / scale for t, _ in pts], [100 * p for _, p in pts], color="black", linewidth=1.6,
            drawstyle="steps-post", label="work done")
    ax.plot([0, deadline / scale], [0, 100], color="#1565c0", linestyle="--", label="uniform progress")
    ax.axvline(deadline / scale, color="#c62828", linewidth=1.2, label="deadline")
    ax.set_xlim(0, 1.03 * max(end, deadline) / scale)  # the deadline stays in the picture
    ax.set_ylabel("work done (%)")
    ax.set_ylim(0, 105)
    handles = [Patch(color=c, alpha=0.45, label=m) for m, c in MODE_COLOURS.items()]
    h, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + h, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_title("deadline policy: spot / on-demand / waiting against uniform progress")


def deadline_job(session: Session, job_id: str) -> Job | None:
    job = queries.get_job(session, job_id)
    return job if job is not None and is_deadline_job(job) else None
