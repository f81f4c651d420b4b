"""`orchestrator daemon`: drive every active job, sweep orphans; safe to kill at any line and restart."""

from __future__ import annotations

import logging
import time

from orchestrator.control.driver import run_pass
from orchestrator.control.launcher import owner_id
from orchestrator.store.db import open_session

log = logging.getLogger("orchestrator.daemon")


def tick(owner: str) -> None:
    with open_session() as session:
        run_pass(session, owner)


def sweep() -> None:
    from orchestrator.control.gc import find_orphans

    try:
        for backend, orphan in find_orphans():
            log.warning("deleting orphan %s (%s)", orphan.name, orphan.job_id)
            backend.provider.delete(orphan.name, orphan.zone)
    except Exception:
        log.exception("orphan sweep failed; next sweep tries again")


def run_daemon(*, interval_s: float, gc_every_s: float, once: bool) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    owner = owner_id("daemon")
    if once:
        tick(owner)
        return
    from apscheduler.schedulers.blocking import BlockingScheduler

    scheduler = BlockingScheduler()
    # One pass at a time (max_instances=1); a late pass is merged, not queued (coalesce).
    scheduler.add_job(tick, "interval", args=[owner], seconds=interval_s, max_instances=1, coalesce=True,
                      next_run_time=_now(), id="reconcile")
    scheduler.add_job(sweep, "interval", seconds=gc_every_s, max_instances=1, coalesce=True, id="gc")
    log.info("daemon %s: reconcile every %.1fs, orphan sweep every %.0fs", owner, interval_s, gc_every_s)
    try:
        scheduler.start()
    except (KeyboardInterrupt, SystemExit):
        log.info("daemon stopped; jobs continue when it starts again")


def _now() -> object:
    from datetime import datetime

    return datetime.fromtimestamp(time.time())
