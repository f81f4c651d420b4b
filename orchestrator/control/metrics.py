"""Prometheus metrics of the daemon (``orchestrator daemon --metrics-port N [--metrics-host ADDR]``).

Job ids, names, spend and budgets, without authentication: served on 127.0.0.1 unless ``--metrics-host``
names a wider address (0.0.0.0: every interface, e.g. for a Prometheus in another container).

Two kinds:

* gauges read from the results DB at scrape time by :class:`DbCollector` (jobs by state, live instances by
  state / GPU / zone / billing, revocations, spend by job): correct whichever daemon (or foreground
  ``launch``) drives the jobs, and across daemon restarts;
* histograms this process observes as its passes run (pass duration; notice-to-checkpoint and
  replacement latencies, found in the rows each pass wrote), via :func:`pass_metrics`.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.clock import WALL, Clock
from orchestrator.model.errors import UserError
from orchestrator.model.status import ACTIVE_JOB, InstanceStatus
from orchestrator.storage import open_storage
from orchestrator.storage.base import NOTICES
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Event, Instance, Job

log = logging.getLogger(__name__)
RECENT_S = 3600.0  # finished jobs keep their spend / step series this long, so a dashboard sees the end
GONE = (InstanceStatus.DELETED.value, InstanceStatus.FAILED.value)

PASS_SECONDS = Histogram("orchestrator_pass_duration_seconds", "One reconcile pass over every job this daemon drives",
                         buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120))
NOTICE_TO_CHECKPOINT = Histogram("orchestrator_notice_to_checkpoint_seconds",
                                 "From a preemption notice to the checkpoint it caused (wall seconds)",
                                 buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120))
REPLACEMENT_LATENCY = Histogram("orchestrator_replacement_latency_seconds",
                                "From an instance's revocation to its replacement training (wall seconds)",
                                buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1800))


class DbCollector(Collector):
    """Reads the DB at each scrape (a fresh session: the daemon's own session is never shared)."""

    def __init__(self, url: str | None = None, clock: Clock = WALL) -> None:
        self.url = url
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not need the DB; the names are only known from a scrape

    def collect(self) -> Iterable[Metric]:
        try:
            with open_session(self.url) as session:
                return list(db_metrics(session, self.clock.time()))
        except Exception:  # noqa: BLE001 - a scrape must answer; the up metric says the DB was unreadable
            log.exception("metrics: cannot read the results DB")
            up = GaugeMetricFamily("orchestrator_db_up", "1 if the last scrape could read the results DB")
            up.add_metric([], 0.0)
            return [up]


def db_metrics(session: Session, now: float) -> Iterator[Metric]:
    up = GaugeMetricFamily("orchestrator_db_up", "1 if the last scrape could read the results DB")
    up.add_metric([], 1.0)
    yield up
    jobs = GaugeMetricFamily("orchestrator_jobs", "Jobs by state", labels=["state"])
    for state, n in session.execute(select(Job.status, func.count()).group_by(Job.status)):
        jobs.add_metric([state], float(n))
    yield jobs
    live = GaugeMetricFamily("orchestrator_instances", "Instances not yet deleted, by state, GPU, zone and billing",
                             labels=["state", "gpu", "zone", "billing", "provider"])
    rows = session.execute(
        select(Instance.status, Instance.gpu, Instance.zone, Instance.spot, Job.provider, func.count())
        .join(Job, Job.id == Instance.job_id).where(Instance.status.not_in(GONE))
        .group_by(Instance.status, Instance.gpu, Instance.zone, Instance.spot, Job.provider))
    for state, gpu, zone, spot, provider, n in rows:
        live.add_metric([state, gpu or "none", zone, "spot" if spot else "on-demand", provider], float(n))
    yield live
    revoked = CounterMetricFamily("orchestrator_revocations", "Instances the cloud took back (all time, from the DB)",
                                  labels=["gpu", "zone", "provider"])
    for gpu, zone, provider, n in session.execute(
            select(Instance.gpu, Instance.zone, Job.provider, func.count()).join(Job, Job.id == Instance.job_id)
            .where(Instance.end_reason == "preempted").group_by(Instance.gpu, Instance.zone, Job.provider)):
        revoked.add_metric([gpu or "none", zone, provider], float(n))
    yield revoked
    yield from _job_series(session, now)


def _job_series(session: Session, now: float) -> Iterator[Metric]:
    spend = GaugeMetricFamily("orchestrator_job_spend_usd", "Spend so far (open instances costed to now)",
                              labels=["job", "name", "provider", "state"])
    budget = GaugeMetricFamily("orchestrator_job_budget_usd", "The job's budget", labels=["job"])
    step = GaugeMetricFamily("orchestrator_job_step", "Training step reached", labels=["job"])
    total = GaugeMetricFamily("orchestrator_job_train_steps", "Training steps asked for", labels=["job"])
    shown = [j for j in session.scalars(select(Job))
             if j.status in {s.value for s in ACTIVE_JOB} or (j.ended_at or now) >= now - RECENT_S]
    summaries = {r["job_id"]: r for r in queries.job_summaries(session, [j.id for j in shown])} if shown else {}
    for j in shown:
        s = summaries.get(j.id, {})
        spend.add_metric([j.id, j.name, j.provider, j.status], float(s.get("cost_usd") or 0.0))
        if j.budget_usd is not None:
            budget.add_metric([j.id], j.budget_usd)
        step.add_metric([j.id], float(queries.latest_step(session, j.id)[0] or j.final_step or 0))
        total.add_metric([j.id], float(j.train_steps))
    yield from (spend, budget, step, total)


class LatencyWatch:
    """Finds, in rows written since the last look, the latencies the histograms count (each once)."""

    def __init__(self) -> None:
        self.event_id: int | None = None  # None: first look: start from now, never replay history

    def observe(self, session: Session) -> None:
        newest = session.scalar(select(func.max(Event.id))) or 0
        if self.event_id is None:
            self.event_id = newest
            return
        evs = list(session.scalars(select(Event).where(Event.id > self.event_id).order_by(Event.id)))
        self.event_id = newest
        for e in evs:
            if e.entity == "note" and e.to_status == "checkpoint":
                notice_at = _notice_time(session, e.job_id, e.at)
                if notice_at is not None and e.at >= notice_at:
                    NOTICE_TO_CHECKPOINT.observe(e.at - notice_at)
            elif e.entity == "instance" and e.to_status == InstanceStatus.TRAINING.value and e.instance_id:
                inst = session.get(Instance, e.instance_id)
                if inst is None or inst.generation == 0:
                    continue
                before = session.scalar(select(Instance).where(
                    Instance.job_id == inst.job_id, Instance.role == inst.role,
                    Instance.slot_index == inst.slot_index, Instance.generation == inst.generation - 1))
                lost_at = before.revoked_at or before.deleted_at if before is not None else None
                if lost_at is not None and e.at >= lost_at:
                    REPLACEMENT_LATENCY.observe(e.at - lost_at)


def _notice_time(session: Session, job_id: str, before: float) -> float | None:
    """The newest preemption notice of the job written before ``before`` (the notice file's own time)."""
    job = session.get(Job, job_id)
    if job is None:
        return None
    storage = open_storage(job.storage_uri, job.id)
    times: list[float] = []
    for name in storage.notices():
        try:
            record: dict[str, Any] = json.loads(storage.read_text(f"{NOTICES}/{name}") or "{}")
            at = float(record["at"])
        except (ValueError, KeyError, TypeError):
            continue
        if at <= before:
            times.append(at)
    return max(times) if times else None


@contextmanager
def pass_metrics(session: Session, watch: LatencyWatch) -> Iterator[None]:
    """Around one daemon pass: its duration (on the session's clock), then the latencies its rows show since
    ``watch``'s last look (the driver's own: its watermark is of the DB it drives)."""
    clock = queries.clock_of(session)
    started = clock.monotonic()
    try:
        yield
    finally:
        PASS_SECONDS.observe(clock.monotonic() - started)
        try:
            watch.observe(session)
        except Exception:  # noqa: BLE001 - metrics must never break a pass
            session.rollback()
            log.exception("metrics: could not read this pass's latencies")


METRICS_HOST = "127.0.0.1"  # this machine only, as the dashboard's --host


def serve(port: int, registry: CollectorRegistry = REGISTRY, url: str | None = None,
          host: str = METRICS_HOST) -> int:
    """Start the /metrics endpoint on ``host`` (a daemon thread) and register the DB collector; returns the
    port bound."""
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except socket.gaierror as exc:  # before anything else starts: one line and exit 2, not a traceback
        raise UserError(f"--metrics-host: '{host}' is not an address of this machine ({exc.strerror})",
                        hint=HOST_HINT) from exc
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:  # an address, but not this machine's
            raise UserError(f"--metrics-host: cannot listen on {host}:{port} ({exc.strerror})",
                            hint=HOST_HINT) from exc
        raise UserError(f"--metrics-port: cannot listen on port {port} ({exc.strerror})",
                        hint="pick another --metrics-port") from exc
    registry.register(DbCollector(url))
    bound = int(server.server_port)
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return bound


HOST_HINT = "use 127.0.0.1, 0.0.0.0 or one of this machine's addresses"
