"""`orchestrator daemon`: drive every active job, sweep orphans; safe to kill at any line and restart.

Its log says what it does to jobs, one line per action (the scheduler's own tick lines are off).
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from apscheduler.schedulers.blocking import BlockingScheduler
from sqlalchemy import select

from orchestrator.clock import WALL, Clock
from orchestrator.control.driver import DriverState, run_pass
from orchestrator.control.gc import find_orphans, finish_pending_deletes, mark_deleted
from orchestrator.control.metrics import METRICS_HOST, LatencyWatch, pass_metrics
from orchestrator.control.metrics import serve as serve_metrics
from orchestrator.control.signals import sigterm_raises
from orchestrator.model.errors import UserError
from orchestrator.model.paths import user_dir
from orchestrator.store.db import default_url, open_session
from orchestrator.store.models import Job

log = logging.getLogger("orchestrator.daemon")
ENV_ID = "ORCHESTRATOR_DAEMON_ID"
_held: list[IO[str]] = []  # lock files held for the life of the process


THREADS = 8  # providers driven at once; a slow cloud holds up only its own jobs


def tick(owner: str, threads: int = THREADS, clock: Clock = WALL, state: DriverState | None = None) -> None:
    """One pass; ``state``: what this daemon keeps across its passes (None: a pass on its own)."""
    watch = state.latency if state is not None else LatencyWatch()  # a pass on its own replays no history
    with open_session(clock=clock) as session, pass_metrics(session, watch):  # pass duration, revocation latencies
        try:
            run_pass(session, owner, threads=threads, state=state)
        except BaseException:
            session.rollback()  # the pass's latencies are then read from a clean session, not a failed one
            raise


_last_failure: list[str] = []  # the previous pass's failure, if it failed


def scheduled_tick(owner: str, threads: int = THREADS, clock: Clock = WALL, state: DriverState | None = None) -> None:
    """A pass of the running daemon: one that fails as a whole (the DB refuses writes, or is unreachable) is one
    log line, and the next pass tries again. The same failure repeats every pass until the DB is fixed, so its
    traceback would only bury the log (a read-only DB: 180 in 30 s); another error's is logged the first time."""
    try:
        tick(owner, threads, clock, state)
    except Exception as exc:  # noqa: BLE001 - the scheduler's next pass is the retry
        text = _one_line(exc)
        first = _last_failure != [text]
        _last_failure[:] = [text]
        log.error("pass failed, the next one tries again: %s", text,
                  exc_info=first and not _is_db_error(exc))
        return
    _last_failure.clear()


def _is_db_error(exc: BaseException) -> bool:
    from sqlalchemy.exc import SQLAlchemyError  # loaded already: the pass opened a session

    return isinstance(exc, SQLAlchemyError)


def _one_line(exc: BaseException) -> str:
    """The DB driver's own message (SQLAlchemy's adds the statement and a link) or the error's, on one line."""
    cause = getattr(exc, "orig", None) if _is_db_error(exc) else None
    shown = cause if isinstance(cause, BaseException) else exc
    lines = str(shown).strip().splitlines()
    text = f"{type(shown).__name__}: {lines[0]}" if lines else type(shown).__name__
    return (f"the results DB: {text}" if _is_db_error(exc) else text)[:480]


def sweep(clock: Clock = WALL) -> None:
    try:
        unchecked: dict[str, str] = {}
        for backend, orphan in find_orphans(unchecked, clock):
            log.warning("job %s instance %s: deleting orphan", orphan.job_id, orphan.name)
            backend.provider.delete(orphan.name, orphan.zone)
            with open_session(clock=clock) as session:
                mark_deleted(session, orphan.name, "deleted by the orphan sweep")
        for why, where in unchecked.items():
            log.warning("orphan sweep could not check %s: %s", where, why)
        for problem in finish_pending_deletes():
            log.warning("pending delete not done: %s", problem)
    except Exception:
        log.exception("orphan sweep failed; next sweep tries again")


def _lock(path: Path) -> IO[str] | None:
    fh = path.open("a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    _held.append(fh)
    return fh


def sqlite_guard(url: str) -> None:
    """SQLite is the single-daemon default: a second daemon on the same file is refused, clearly."""
    if not url.startswith("sqlite:///"):
        return
    db = Path(url.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    fh = _lock(db.with_name(db.name + ".daemon-lock"))
    if fh is None:
        holder = db.with_name(db.name + ".daemon-lock").read_text().strip() or "another process"
        raise UserError(f"another daemon ({holder}) already drives {db}; SQLite takes one daemon. For several "
                        "daemons sharing the jobs, use PostgreSQL: ORCHESTRATOR_DB_URL=postgresql://...")
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} on {socket.gethostname()}")
    fh.flush()


def daemon_running(url: str, clock: Clock = WALL) -> bool:
    """Is a daemon driving this database now? (SQLite: its lock is held; PostgreSQL: it holds a live lease.)"""
    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///"))
        lock = db.with_name(db.name + ".daemon-lock")
        if not lock.exists():
            return False
        with lock.open("a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
        return False
    with open_session(url) as session:
        return session.scalar(select(Job.id).where(Job.lease_owner.like("daemon-%"),
                                                   Job.lease_until > clock.time()).limit(1)) is not None


def daemon_id() -> str:
    """Stable across restarts (hostname + an id persisted under the home), so a daemon restarted after
    `kill -9` takes its own leases back at once instead of waiting for them to expire."""
    if os.environ.get(ENV_ID):
        return os.environ[ENV_ID][:64]
    home = user_dir()
    for n in range(64):  # a second daemon on this home (PostgreSQL) takes the next free slot
        path = home / f"daemon-{n}.id"
        fh = _lock(path)
        if fh is None:
            continue
        fh.seek(0)
        ident = fh.read().strip()
        if not ident:
            ident = secrets.token_hex(4)
            fh.write(ident)
            fh.flush()
        return f"daemon-{socket.gethostname()}-{ident}"[:64]
    raise UserError(f"64 daemons already run from {home}")


def run_daemon(*, interval_s: float, gc_every_s: float, once: bool, metrics_port: int | None = None,
               metrics_host: str | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # no "Running job tick" every pass
    # A pass longer than the interval skips or merges the next one by design (max_instances=1, coalesce): not a
    # warning a line per pass on a loaded host (CI 2026-12-03); a failing pass logs its own error line.
    logging.getLogger("apscheduler.scheduler").setLevel(logging.ERROR)
    scheduler = BlockingScheduler()
    try:
        # From before the lock is taken: `kill`, systemd and `timeout` stop it like Ctrl-C, with its last line
        # logged, even while it is still starting.
        with sigterm_raises():
            _serve(scheduler, interval_s=interval_s, gc_every_s=gc_every_s, once=once, metrics_port=metrics_port,
                   metrics_host=metrics_host)
    except (KeyboardInterrupt, SystemExit):
        if once:
            raise  # an interrupted single pass did not succeed: the exit code says so
        if scheduler.running:  # a pass in flight may end anywhere: every write is idempotent
            scheduler.shutdown(wait=False)
        log.info("daemon stopped; jobs continue when it starts again")
        _leave_calls_in_flight()


IN_FLIGHT = ("backend", "gce-")  # the thread pools of provider calls (control.driver, providers.gce.background)


def _leave_calls_in_flight() -> None:
    """End the process now if provider calls are still in flight. Python joins pool threads at exit, so a listing
    retrying a failing cloud (5 tries, a minute each) would hold a stopped daemon for minutes, past a service
    manager's stop timeout. Each call is safe to repeat and the next daemon makes it again: leaving them is a kill
    at any line, which the daemon is built for."""
    busy = [t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith(IN_FLIGHT)]
    if busy:
        log.info("ending without waiting for %d provider thread(s) (%s): a call still in flight is repeated by the "
                 "next daemon", len(busy), ", ".join(sorted(busy)[:4]))
        logging.shutdown()  # the lines above are written before the process ends
        os._exit(0)


def _serve(scheduler: BlockingScheduler, *, interval_s: float, gc_every_s: float, once: bool,
           metrics_port: int | None, metrics_host: str | None) -> None:
    sqlite_guard(default_url())
    if metrics_port is not None:
        serve_metrics(metrics_port, host=metrics_host or METRICS_HOST)
    owner = daemon_id()
    if once:
        tick(owner, threads=0)  # one whole pass, waited for
        return
    # One pass at a time (max_instances=1); a late pass is merged, not queued (coalesce). One DriverState for the
    # daemon's life: its deadline plans, its providers' work in flight.
    scheduler.add_job(scheduled_tick, "interval", args=[owner], kwargs={"state": DriverState()}, seconds=interval_s,
                      max_instances=1, coalesce=True, next_run_time=_now(), id="reconcile")
    scheduler.add_job(sweep, "interval", seconds=gc_every_s, max_instances=1, coalesce=True, id="gc")
    log.info("daemon %s: reconcile every %.1fs, orphan sweep every %.0fs", owner, interval_s, gc_every_s)
    scheduler.start()


def run_on(clock: Clock, owner: str, *, interval_s: float, gc_every_s: float, until: Callable[[], bool]) -> None:
    """The daemon's schedule without the scheduler, on ``clock``: a pass every ``interval_s`` (the sweep every
    ``gc_every_s``), each waited for, until ``until()`` holds after a pass. On a virtual clock (tests/fastforward.py)
    this is the daemon of ``run_daemon`` with its passes back to back."""
    next_sweep = clock.monotonic() + gc_every_s
    state = DriverState()  # this daemon's, for its life: one started again starts afresh
    while True:
        scheduled_tick(owner, threads=0, clock=clock, state=state)
        if clock.monotonic() >= next_sweep:
            sweep(clock)
            next_sweep = clock.monotonic() + gc_every_s
        if until():
            return
        clock.sleep(interval_s)


def _now() -> object:
    return WALL.now()  # the scheduler's first run: it schedules on the wall clock
