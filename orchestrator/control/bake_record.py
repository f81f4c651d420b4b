"""One image bake in the results DB: a pseudo-job (``jobs.mode = 'bake'``) with one instance, the builder VM.

So a bake is billed like any instance: its ledger row (role ``builder``) runs from the create request to
the builder's confirmed deletion at its on-demand price, and plain SQL sees it where it sees every other
spend: ``SELECT SUM(usd) FROM ledger`` includes bakes, ``job_summary`` has one row per bake (its
``cost_usd``), and ``role = 'worker'`` sums stay the training clusters' own.

The bake's own process drives this job (control/images.py); the daemon never claims it (control/lease.py).
If that process dies, the sweep (control/gc.py) deletes the builder once the bake's time limit has passed
and closes this record as failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from orchestrator.model.errors import UserError
from orchestrator.model.instances import BAKE_MODE
from orchestrator.model.status import FINAL_JOB, GONE_INSTANCE, EndReason, InstanceStatus, JobStatus
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Event, Instance, Job

BUILDER_ROLE = "builder"  # instances.role / ledger.role of an image builder VM


@dataclass(frozen=True)
class BakeRecord:
    job_id: str

    @classmethod
    def start(cls, *, job_id: str, builder: str, image: str, spec_yaml: str, price_book: str, shape: str,
              gpu: str | None, machine_type: str, zone: str, price_per_hour: float, limit_s: float,
              provider: str, spot: bool = False) -> BakeRecord:
        """The job and its builder's row, committed before the create call (intent first: a bake that dies
        after creating its VM is still billed and found)."""
        with open_session() as session:
            now = queries.clock_of(session).time()
            if session.get(Job, job_id) is not None:
                raise UserError(f"a bake {job_id} is already recorded; start it again in a second")
            session.add(Job(id=job_id, name=image[:64], provider=provider, mode=BAKE_MODE, cluster_shape=shape,
                            spec_yaml=spec_yaml, storage_uri="", price_book=price_book,
                            status=JobStatus.PENDING.value, train_steps=0, deadline_s=limit_s, restarts=0,
                            metrics_offset=0, cancel_requested=False, created_at=now, updated_at=now))
            session.flush()
            session.add(Event(job_id=job_id, entity="job", from_status=None, to_status=JobStatus.PENDING.value,
                              reason=f"image bake recorded: builder {builder}, image {image}", at=now))
            session.add(Instance(job_id=job_id, name=builder, role=BUILDER_ROLE, slot_index=0, generation=0,
                                 gpu=gpu, machine_type=machine_type, zone=zone, spot=spot,
                                 price_per_hour=price_per_hour, status=InstanceStatus.REQUESTED.value,
                                 status_reason="builder VM requested", requested_at=now, updated_at=now))
        return cls(job_id)

    def step(self, reason: str, job: JobStatus | None = None, builder: InstanceStatus | None = None, *,
             zone: str | None = None, host: str | None = None) -> None:
        """The bake moved on: switch the job and / or the builder (each switch writes its event)."""
        with open_session() as session:
            j, inst = self._rows(session)
            if zone is not None:
                inst.zone = zone
            if host is not None:
                inst.host = host
            if builder is not None:
                queries.switch_status(session, inst, builder, reason)
            if job is not None:
                queries.switch_status(session, j, job, reason)
            if job is None and builder is None:
                queries.note(session, self.job_id, "bake", reason, instance_id=inst.id)

    def create_failed(self, reason: str) -> None:
        with open_session() as session:
            _, inst = self._rows(session)
            inst.end_reason = EndReason.CREATE_FAILED.value  # nothing ran: its ledger row is $0
            queries.switch_status(session, inst, InstanceStatus.FAILED, reason[:500])

    def finish(self, outcome: JobStatus, reason: str, *, builder_deleted: bool) -> None:
        """The bake is over: the builder's ledger row closes if it is gone (else it stays DELETING, costed to
        now, until `orchestrator gc` / the daemon's sweep deletes it), and the job ends with ``outcome``."""
        with open_session() as session:
            j, inst = self._rows(session)
            close(session, j, inst, outcome, reason, builder_deleted=builder_deleted)

    def _rows(self, session: Session) -> tuple[Job, Instance]:
        job = session.get(Job, self.job_id)
        assert job is not None and job.instances, f"bake {self.job_id} is not recorded"
        return job, job.instances[0]


def close(session: Session, job: Job, inst: Instance, outcome: JobStatus, reason: str, *,
          builder_deleted: bool, billed_until: float | None = None) -> None:
    """End a bake's records (its own process, or the sweep for an abandoned bake)."""
    reason = reason[:500]
    if inst.status not in {s.value for s in GONE_INSTANCE}:
        inst.end_reason = inst.end_reason or _END_REASON.get(outcome, EndReason.JOB_FAILED).value
    if inst.status not in (InstanceStatus.DELETING.value, InstanceStatus.DELETED.value):
        queries.switch_status(session, inst, InstanceStatus.DELETING, "bake over: deleting the builder VM")
    if builder_deleted:
        queries.switch_status(session, inst, InstanceStatus.DELETED, "builder VM deleted", billed_until=billed_until)
    if job.status not in {s.value for s in FINAL_JOB}:
        if job.status != JobStatus.TEARING_DOWN.value:
            job.outcome = outcome.value
            queries.switch_status(session, job, JobStatus.TEARING_DOWN, reason)
        queries.switch_status(session, job, JobStatus(job.outcome or outcome.value), reason)
    session.commit()


_END_REASON = {JobStatus.SUCCEEDED: EndReason.JOB_FINISHED, JobStatus.CANCELLED: EndReason.JOB_CANCELLED}
