"""What `launch` and `cancel` show: the live view (terminal) or event/progress lines, the final report,
and the cancel outcome. The controller (control/launcher.py) reports through ``ConsoleReporter``."""

from __future__ import annotations

from rich.live import Live
from sqlalchemy.orm import Session

from orchestrator.cli.progress import LineFollower, emit, live_view
from orchestrator.cli.render import console, duration, money, pct
from orchestrator.control.launcher import CancelResult
from orchestrator.core.plan import LaunchPlan
from orchestrator.core.status import FINAL_JOB
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
        cost = queries.job_cost(session, job_id)
        console.print(
            f"[bold]{job_id}[/bold] {summary['status']}: accuracy {pct(summary['accuracy'])}, wall time "
            f"{duration(summary['wall_time_s'])}, cost {money(summary['cost_usd'])} (workers "
            f"{money(cost.get('worker'))}, ps {money(cost.get('ps'))}, chief {money(cost.get('chief'))}), "
            f"revocations {summary['revocations']}, replacements {summary['replacements']}, "
            f"restarts {summary['restarts']}")
        console.print(f"[dim]{summary['status_reason'] or ''}[/dim]")


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
