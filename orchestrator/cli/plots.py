"""A job's run as pictures: instance timeline, cumulative cost against on-demand, throughput.

``gather`` reads the rows once into plain data (the CLI and the dashboard share it); ``render`` draws
with matplotlib's object API (no pyplot state, so the dashboard may draw from several threads).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.cli.options import PLOT_FORMATS
from orchestrator.costmodel.launch_plan import plan_spec
from orchestrator.model.errors import UserError
from orchestrator.model.spec import stored_spec as job_spec
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.store import queries
from orchestrator.store.models import Instance, Job, Metric

if TYPE_CHECKING:
    from matplotlib.axes import Axes

Panel = Callable[["Axes", float], None]  # draws one more plot on its axes, given the time scale
# One colour per GPU type in every plot (a P100 is the same green in each job's picture).
GPU_COLOURS = {"k80": "#1f77b4", "p100": "#2ca02c", "v100": "#9467bd", "t4": "#ff7f0e", "p4": "#bcbd22",
               "l4": "#8c564b", "a100": "#e377c2", "h100": "#17becf", "h200": "#d62728", "b200": "#7f7f7f"}
SPARE_COLOURS = ["#aec7e8", "#98df8a", "#c5b0d5", "#ffbb78", "#c49c94", "#f7b6d2", "#9edae5", "#dbdb8d"]
CPU_COLOUR = "#9e9e9e"


@dataclass(frozen=True)
class Bar:
    slot: str
    name: str
    gpu: str | None
    spot: bool
    start: float  # seconds since the job started, like every time here
    end: float
    price_per_hour: float
    on_demand_per_hour: float
    revoked: float | None
    notice: bool
    replacement: bool
    zone: str = ""


@dataclass
class PlotData:
    job_id: str
    status: str
    start: float
    end: float
    bars: list[Bar] = field(default_factory=list)
    checkpoints: list[tuple[float, int]] = field(default_factory=list)
    notice_checkpoints: list[float] = field(default_factory=list)
    throughput: list[tuple[float, float]] = field(default_factory=list)  # (t, examples/s of the cluster)
    worker_rates: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    budget_usd: float | None = None
    resplits: list[tuple[float, str]] = field(default_factory=list)  # (t, "step N") of each batch re-split

    @property
    def slots(self) -> list[str]:
        order = {"ps": 0, "chief": 1, "worker": 2}
        names = {b.slot for b in self.bars}
        return sorted(names, key=lambda s: (order.get(s.rsplit("-", 1)[0], 3), int(s.rsplit("-", 1)[1])))


def _on_demand_prices(session: Session, job: Job) -> dict[str, float]:
    """Each slot's on-demand hourly price from the plan stored at launch, else from the job's own price book
    (empty if the spec no longer loads)."""
    try:
        plan = queries.stored_intent(session, job.id)
        if plan is None:  # a job recorded before plans were stored: read-only here, so not stored
            spec = job_spec(job.spec_yaml)
            plan = plan_spec(spec, book=job.price_book, steps=step_model_for(spec))
        return {s.name: s.on_demand_price_per_hour or s.price_per_hour for s in plan.slots}
    except Exception:  # noqa: BLE001 - an old spec the catalog no longer prices: the comparison line is left out
        return {}


def gather(session: Session, job_id: str, now: float | None = None) -> PlotData:
    job = session.get(Job, job_id)
    if job is None:
        raise LookupError(job_id)
    now = queries.clock_of(session).time() if now is None else now
    t0 = job.started_at or job.created_at
    end = (job.ended_at or now) - t0
    data = PlotData(job_id=job.id, status=job.status, start=t0, end=end, budget_usd=job.budget_usd)
    on_demand = _on_demand_prices(session, job)
    insts: list[Instance] = queries.job_instances(session, job_id)
    noticed = {e.instance_id for e in queries.events(session, job_id)
               if e.instance_id is not None and e.to_status == "revoked"
               and any(w in (e.reason or "") for w in ("notice", "stopping"))}  # STOPPING: the ACPI soft-off
    for i in insts:
        if i.end_reason == "create_failed":
            continue
        stop = (i.deleted_at or now) - t0
        data.bars.append(Bar(slot=i.slot, name=i.name, gpu=i.gpu, spot=i.spot, start=i.requested_at - t0,
                             end=max(stop, i.requested_at - t0), price_per_hour=i.price_per_hour,
                             on_demand_per_hour=on_demand.get(i.slot, i.price_per_hour),
                             revoked=None if i.revoked_at is None else i.revoked_at - t0,
                             notice=i.id in noticed, replacement=i.generation > 0, zone=i.zone or ""))
    for m in session.scalars(select(Metric).where(Metric.job_id == job_id).order_by(Metric.at)):
        t = m.at - t0
        if m.kind == "checkpoint":
            data.checkpoints.append((t, m.step))
        elif m.kind == "step" and m.examples_per_s is not None:
            data.throughput.append((t, m.examples_per_s))
        elif m.kind == "worker" and m.examples_per_s is not None:
            data.worker_rates.setdefault(f"worker-{m.worker}", []).append((t, m.examples_per_s))
    data.notice_checkpoints = [e.at - t0 for e in queries.events(session, job_id)
                               if e.entity == "note" and e.to_status == "checkpoint"]
    data.resplits = [(e.at - t0, (e.reason or "").split(":", 1)[0].removeprefix("re-split at "))
                     for e in queries.events(session, job_id) if e.entity == "note" and e.to_status == "resplit"]
    return data


def cost_curves(data: PlotData, points: int = 400) -> tuple[list[float], list[float], list[float]]:
    """Times, cumulative spend, and the same instance-hours at on-demand prices."""
    end = max([data.end] + [b.end for b in data.bars])
    ts = [end * k / (points - 1) for k in range(points)] if end > 0 else [0.0]
    spent, od = [], []
    for t in ts:
        hours = [(max(0.0, min(t, b.end) - b.start) / 3600.0, b) for b in data.bars]
        spent.append(sum(h * b.price_per_hour for h, b in hours))
        od.append(sum(h * b.on_demand_per_hour for h, b in hours))
    return ts, spent, od


def _time_unit(span_s: float) -> tuple[float, str]:
    if span_s > 3 * 3600:
        return 3600.0, "hours"
    if span_s > 600:
        return 60.0, "minutes"
    return 1.0, "seconds"


def render(data: PlotData, fmt: str = "png", extra: Panel | None = None, until: float = 0.0) -> bytes:
    """The three plots, one above the other on one time axis, as PNG or SVG bytes; ``extra`` draws a fourth
    below them (``report --plot`` of a deadline job), ``until``: a time the axis must reach (its deadline)."""
    from matplotlib.figure import Figure  # lazy: matplotlib (~0.3 s) loads only when a plot is drawn

    fig = Figure(figsize=(11, 11 if extra else 8.5), dpi=110, layout="constrained")
    axes = fig.subplots(4 if extra else 3, 1, sharex=True, height_ratios=[2.2, 1, 1, 1.4][:4 if extra else 3])
    ax_tl, ax_cost, ax_tp = axes[:3]
    scale, unit = _time_unit(max([data.end, until] + [b.end for b in data.bars]))
    colour = slot_colours(data)
    _draw_timeline(ax_tl, data, scale, colour)
    _draw_cost(ax_cost, data, scale)
    _draw_throughput(ax_tp, data, scale, unit, colour)
    _mark_resplits(ax_tp, data, scale)
    if extra is not None:
        extra(axes[3], scale)
        axes[3].set_xlabel(f"{unit} since the job started")
    for ax in axes:
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    return buf.getvalue()


def slot_colours(data: PlotData) -> dict[str, str]:
    """One colour per slot, its instances' bars and its throughput line alike: the GPU type's colour (a P100 is
    the same green in each job's picture), a spare one for a second slot of the same type, grey for CPU."""
    colours: dict[str, str] = {}
    taken: set[str] = set()
    spare = iter(SPARE_COLOURS * 4)
    for slot in data.slots:
        gpu = next((b.gpu for b in data.bars if b.slot == slot and b.gpu), None)
        if gpu is None:
            colours[slot] = CPU_COLOUR
            continue
        own = GPU_COLOURS.get(gpu.lower())
        colours[slot] = own if own is not None and own not in taken else next(spare)
        taken.add(colours[slot])
    return colours


def slot_gpus(data: PlotData) -> dict[str, list[str]]:
    """The GPU types each slot's instances ran, in order (more than one where the deadline policy moved it:
    policy.also_gpus)."""
    out: dict[str, list[str]] = {}
    for b in sorted(data.bars, key=lambda b: b.start):
        if b.gpu and b.gpu not in out.setdefault(b.slot, []):
            out[b.slot].append(b.gpu)
    return {s: g for s, g in out.items() if g}


def _bar_colour(b: Bar, colour: dict[str, str], gpus: dict[str, list[str]]) -> str:
    """The slot's colour; where the slot ran several GPU types, each instance's type's own."""
    if b.gpu and len(gpus.get(b.slot, ())) > 1:
        return GPU_COLOURS.get(b.gpu.lower(), colour.get(b.slot, CPU_COLOUR))
    return colour.get(b.slot, CPU_COLOUR)


def _draw_timeline(ax: Axes, data: PlotData, scale: float, colour: dict[str, str]) -> None:
    """A bar per instance on its slot's row (hatched: spot), revocations, replacements and checkpoints."""
    slots, gpus = data.slots, slot_gpus(data)
    for b in data.bars:
        y = slots.index(b.slot)
        alive_end = b.end if b.revoked is None else b.revoked
        ax.barh(y, (alive_end - b.start) / scale, left=b.start / scale, height=0.6,
                color=_bar_colour(b, colour, gpus), alpha=0.55 if b.spot else 0.95,
                hatch="///" if b.spot else None, edgecolor="black", linewidth=0.6)
        if b.revoked is not None and b.end > b.revoked:  # billed until the delete is confirmed
            ax.barh(y, (b.end - b.revoked) / scale, left=b.revoked / scale, height=0.25, color="#bdbdbd",
                    edgecolor="#616161", linewidth=0.5, zorder=3)  # over the replacement's bar
        if b.replacement:  # below the bar, so it does not hide its predecessor's revocation mark
            ax.plot(b.start / scale, y + 0.42, marker="^", color="#2e7d32", markersize=9, zorder=4)
        if b.revoked is not None:
            ax.plot(b.revoked / scale, y, marker="X", color="#c62828", markersize=11, zorder=5,
                    markeredgecolor="white")
            if b.notice:
                ax.plot(b.revoked / scale, y - 0.42, marker="v", color="#ef6c00", markersize=9, zorder=5)
    for t, _step in data.checkpoints:
        ax.axvline(t / scale, color="#607d8b", linewidth=0.7, linestyle=":", zorder=1)
    for t in data.notice_checkpoints:
        ax.axvline(t / scale, color="#ef6c00", linewidth=1.4, linestyle="--", zorder=2)
    ax.set_yticks(range(len(slots)), [f"{s} ({', '.join(g.upper() for g in gpus[s])})" if s in gpus else s
                                      for s in slots])
    ax.set_ylim(len(slots) - 0.35, -0.65)
    ax.set_title(f"{data.job_id} ({data.status}): instances by slot")
    _timeline_legend(ax, data, colour)


def _timeline_legend(ax: Axes, data: PlotData, colour: dict[str, str]) -> None:
    """GPU colours, billing, and only the marks this picture has."""
    from matplotlib.lines import Line2D  # lazy: matplotlib, as in render
    from matplotlib.patches import Patch  # lazy: matplotlib, as in render

    handles: list[Patch | Line2D] = []
    for s, gpus in slot_gpus(data).items():
        if s in colour:
            handles += [Patch(facecolor=colour[s] if len(gpus) == 1 else GPU_COLOURS.get(g.lower(), colour[s]),
                              edgecolor="black", label=f"{s} ({g.upper()})") for g in gpus]
    if any(b.gpu is None for b in data.bars):
        handles.append(Patch(facecolor=CPU_COLOUR, edgecolor="black", label="CPU (ps, chief)"))
    handles += [Patch(facecolor="white", edgecolor="black", hatch="///", label="spot"),
                Patch(facecolor="white", edgecolor="black", label="on-demand")]
    revoked = any(b.revoked is not None for b in data.bars)
    marks: list[tuple[bool, Patch | Line2D]] = [
             (revoked, Line2D([], [], marker="X", color="#c62828", linestyle="", label="revoked")),
             (any(b.notice for b in data.bars),
              Line2D([], [], marker="v", color="#ef6c00", linestyle="", label="preemption notice")),
             (any(b.replacement for b in data.bars),
              Line2D([], [], marker="^", color="#2e7d32", linestyle="", label="replacement created")),
             (revoked, Patch(facecolor="#bdbdbd", edgecolor="#616161", label="revoked, billed until deleted")),
             (bool(data.checkpoints), Line2D([], [], color="#607d8b", linestyle=":", label="checkpoint")),
             (bool(data.notice_checkpoints),
              Line2D([], [], color="#ef6c00", linestyle="--", label="checkpoint on notice"))]
    handles += [h for shown, h in marks if shown]  # only what this picture has
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _draw_cost(ax: Axes, data: PlotData, scale: float) -> None:
    """Cumulative spend against the same instance-hours at on-demand prices."""
    ts, spent, od = cost_curves(data)
    xs = [t / scale for t in ts]
    ax.plot(xs, spent, color="#1565c0", label=f"spent (${spent[-1]:.4f})")
    ax.plot(xs, od, color="#6d4c41", linestyle="--", label=f"same hours on-demand (${od[-1]:.4f})")
    ax.fill_between(xs, spent, od, color="#a5d6a7", alpha=0.4, label="saved by spot")
    ax.set_ylabel("cumulative cost (USD)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def with_gaps(data: PlotData, slot: str, points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A worker's rate where one of the slot's instances was running; NaN (a break in the line) where none
    was, across each revocation, and where it made no step (a rate of 0: a replacement not yet training)."""
    nan = float("nan")
    bars = [b for b in data.bars if b.slot == slot]
    alive = [(b.start, b.revoked if b.revoked is not None else b.end) for b in bars]
    revoked = [b.revoked for b in bars if b.revoked is not None]
    out: list[tuple[float, float]] = []
    last: float | None = None
    for t, v in points:
        running = v > 0 and (not alive or any(a <= t <= z for a, z in alive))
        broken = last is not None and any(last < r <= t for r in revoked)
        if not running or broken:
            if out and out[-1][1] == out[-1][1]:  # not already NaN
                out.append((t, nan))
            if not running:
                continue
        out.append((t, v))
        last = t
    return out


def broken_at_long_gaps(points: list[tuple[float, float]], factor: float = 3.0) -> list[tuple[float, float]]:
    """The cluster's rate with a break (NaN) between two reports further apart than ``factor`` x the median
    spacing: nothing trained there (waiting for spot, a restart), and a line across it would say it did."""
    gaps = sorted(b[0] - a[0] for a, b in zip(points, points[1:], strict=False))
    if not gaps:
        return points
    limit = factor * gaps[len(gaps) // 2]
    out = points[:1]
    for a, b in zip(points, points[1:], strict=False):
        if b[0] - a[0] > limit:
            out.append(((a[0] + b[0]) / 2, float("nan")))
        out.append(b)
    return out


def _draw_throughput(ax: Axes, data: PlotData, scale: float, unit: str, colour: dict[str, str]) -> None:
    """The cluster's examples/s and each worker's, in its slot's colour, broken where it was not running."""
    if data.throughput:
        shown = broken_at_long_gaps(data.throughput)
        ax.plot([t / scale for t, _ in shown], [v for _, v in shown], color="black", linewidth=1.4, label="cluster")
    for name, pts in sorted(data.worker_rates.items()):
        shown = with_gaps(data, name, pts)
        ax.plot([t / scale for t, _ in shown], [v for _, v in shown], linewidth=1.0, alpha=0.9, label=name,
                color=colour.get(name))
    ax.set_ylabel("examples / s")
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"{unit} since the job started")
    ax.set_xlim(left=0)
    if data.throughput or data.worker_rates:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "no training metrics yet", transform=ax.transAxes, ha="center", va="center")


def _mark_resplits(ax: Axes, data: PlotData, scale: float) -> None:
    """A dotted line where a running sync job re-split its batch (examples moved between the workers)."""
    for k, (t, step) in enumerate(data.resplits):
        ax.axvline(t / scale, color="#7f7f7f", linestyle=":", linewidth=0.9, label="batch re-split" if k == 0 else None)
        ax.annotate(step, (t / scale, 1.0), xycoords=("data", "axes fraction"), fontsize=6, rotation=90,
                    va="top", ha="right", color="#555555")
    if data.resplits:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def format_for(path: Path) -> str:
    fmt = PLOT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UserError(f"--plot: '{path}' must end in .png or .svg")
    return fmt
