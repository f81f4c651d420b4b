"""What `launch` and `cancel` show: the live view (terminal) or event/progress lines, the final report,
and the cancel outcome. The controller (control/launcher.py) reports through ``ConsoleReporter``."""

from __future__ import annotations

from typing import Any

from rich.live import Live
from sqlalchemy.orm import Session

from orchestrator.cli.progress import LineFollower, emit, live_view
from orchestrator.cli.render import console, duration, money, pct
from orchestrator.control.launcher import CancelResult
from orchestrator.costmodel.launch_plan import LaunchPlan
from orchestrator.model.status import FINAL_JOB
from orchestrator.store import queries
from orchestrator.store.models import Job


class ConsoleReporter:
    """A live view in a terminal; not a terminal (piped, CI, nohup) or ``quiet``: event lines plus a progress
    line every N s."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.live: Live | None = None
        self.follower: LineFollower | None = None

    def say(self, text: str) -> None:
        console.print(text, highlight=False, markup=False)

    def recorded(self, job_id: str, plan: LaunchPlan, provider: str, *, detach: bool) -> None:
        console.print(f"job [bold]{job_id}[/bold] recorded ({plan.shape}, provider {provider})")
        if detach:
            console.print("a running `orchestrator daemon` will drive it; follow with "
                          f"`orchestrator status {job_id}` or `orchestrator logs {job_id} -f`")

    def start(self) -> None:
        if not self.quiet and console.is_terminal:
            self.live = Live(console=console, refresh_per_second=2, transient=False)
            self.live.start()

    def update(self, session: Session, job: Job) -> None:
        if self.live is not None:
            self.live.update(live_view(session, job, queries.events(session, job.id)))
            return
        if self.follower is None:
            self.follower = LineFollower(job.id, steps=False)  # steps: in the progress line; every one: `logs -f`
        emit(self.follower.poll(session, job))

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def finished(self, session: Session, job_id: str) -> None:
        summary = queries.job_summaries(session, [job_id])[0]
        summary["status_reason"] = queries.outcome_reason(session, job_id) or summary["status_reason"]
        console.print(finished_line(summary, queries.job_cost(session, job_id)), highlight=False, markup=False,
                      soft_wrap=True)


_ROLES = (("worker", "workers"), ("ps", "ps"), ("chief", "chief"))


def finished_line(summary: dict[str, Any], cost: dict[str, float]) -> str:
    """One line on how a job ended: why (unless it succeeded) and what it cost, by the roles it had.

    Only what is known is said: no accuracy before an evaluation, no wall time before a start, no role
    that never had an instance; a job that never started says so instead of printing empty fields.
    """
    status = str(summary["status"])
    reason = " ".join(str(summary.get("status_reason") or "").split())[:400]
    head = f"{summary['job_id']} {status}" + (f" ({reason})" if reason and status != "succeeded" else "")
    facts = []
    if summary.get("accuracy") is not None:
        facts.append(f"accuracy {pct(summary['accuracy'])}")
    wall = summary.get("wall_time_s")
    facts.append(f"wall time {duration(wall)}" if wall is not None else "never started training")
    roles = [f"{label} {money(max(0.0, cost[key]))}" for key, label in _ROLES if key in cost]
    total = max(0.0, float(summary.get("cost_usd") or 0.0))
    facts.append(f"cost {money(total)}" + (f" ({', '.join(roles)})" if roles else " (no instance was billed)"))
    counts = [f"{k} {summary[k]}" for k in ("revocations", "replacements", "restarts") if summary.get(k)]
    return f"{head}: {', '.join(facts + counts)}"


def print_cancel(result: CancelResult) -> None:
    def say(text: str) -> None:
        console.print(text, highlight=False, markup=False)

    if result.already_final:
        console.print(f"{result.job_id} is already {result.status}")
        return
    if result.status not in FINAL_JOB:
        say(f"{result.job_id}: cancel recorded, still {result.status} (last error: {result.last_error or 'none'}); "
            "its driver finishes the teardown")
        return
    say(f"{result.job_id}: {result.status}; ledger at {money(result.cost_usd)}")
    if result.undeleted:
        why = "; ".join(result.problems) or "pending"
        say(f"{len(result.undeleted)} instance(s) could not be reached to delete ({why}): "
            f"{', '.join(result.undeleted)}; the daemon's sweep and `orchestrator gc --yes` delete them when the "
            "provider can be reached")
