"""SQLAlchemy 2 typed models. Times are UNIX epoch seconds (float) so SQL arithmetic is portable."""

from __future__ import annotations

from sqlalchemy import Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    provider: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(8))
    cluster_shape: Mapped[str] = mapped_column(String(200))
    spec_yaml: Mapped[str] = mapped_column(Text)
    storage_uri: Mapped[str] = mapped_column(String(500))
    price_book: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), index=True)
    status_reason: Mapped[str | None] = mapped_column(String(500))
    outcome: Mapped[str | None] = mapped_column(String(16))  # final status decided at teardown
    train_steps: Mapped[int] = mapped_column(Integer)
    final_step: Mapped[int | None] = mapped_column(Integer)
    accuracy: Mapped[float | None] = mapped_column(Float)
    final_loss: Mapped[float | None] = mapped_column(Float)
    budget_usd: Mapped[float | None] = mapped_column(Float)
    deadline_s: Mapped[float | None] = mapped_column(Float)
    restarts: Mapped[int] = mapped_column(Integer, default=0)  # whole-cluster restarts from a checkpoint
    metrics_offset: Mapped[int] = mapped_column(Integer, default=0)  # bytes of metrics.jsonl ingested
    # Who drives the job: a foreground `launch` or the daemon. A lease that is not renewed expires, so a
    # killed driver's job is picked up by the daemon.
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[float | None] = mapped_column(Float)
    # Drawn when a driver takes the job over; every write of a pass checks it (control/lease.py), so a
    # driver that lost its lease changes nothing.
    lease_token: Mapped[str | None] = mapped_column(String(32))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    fatal_exits: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # payload said "bad input"
    # A pass over this job that raised: how often in a row, since when, and when to try again (backoff).
    pass_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    failing_since: Mapped[float | None] = mapped_column(Float)
    retry_at: Mapped[float | None] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)

    instances: Mapped[list[Instance]] = relationship(back_populates="job", order_by="Instance.id")


class Instance(Base):
    __tablename__ = "instances"
    __table_args__ = (Index("ix_instances_job_slot", "job_id", "role", "slot_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)  # deterministic: <job>-<role>-<index>-<gen>
    provider_id: Mapped[str | None] = mapped_column(String(100))
    role: Mapped[str] = mapped_column(String(8))
    slot_index: Mapped[int] = mapped_column(Integer)
    generation: Mapped[int] = mapped_column(Integer)
    gpu: Mapped[str | None] = mapped_column(String(16))
    machine_type: Mapped[str] = mapped_column(String(32))
    zone: Mapped[str] = mapped_column(String(32))
    spot: Mapped[bool] = mapped_column(Boolean)
    price_per_hour: Mapped[float] = mapped_column(Float)
    batch: Mapped[int | None] = mapped_column(Integer)
    host: Mapped[str | None] = mapped_column(String(255))
    port: Mapped[int | None] = mapped_column(Integer)  # the TensorFlow task port
    status: Mapped[str] = mapped_column(String(16), index=True)
    status_reason: Mapped[str | None] = mapped_column(String(500))
    end_reason: Mapped[str | None] = mapped_column(String(32))
    requested_at: Mapped[float] = mapped_column(Float)  # billing starts at the create request
    ready_at: Mapped[float | None] = mapped_column(Float)
    training_at: Mapped[float | None] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)
    deleted_at: Mapped[float | None] = mapped_column(Float)  # billing ends at confirmed deletion
    updated_at: Mapped[float] = mapped_column(Float)

    job: Mapped[Job] = relationship(back_populates="instances")

    @property
    def slot(self) -> str:
        return f"{self.role}-{self.slot_index}"


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    instance_id: Mapped[int | None] = mapped_column(ForeignKey("instances.id"), index=True)
    entity: Mapped[str] = mapped_column(String(8))  # job | instance | note
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(String(500))
    at: Mapped[float] = mapped_column(Float, index=True)


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("job_id", "kind", "step", "worker", "at", name="uq_metrics_point"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # step | eval | checkpoint | worker
    worker: Mapped[int] = mapped_column(Integer, default=-1)  # -1 = whole cluster
    gpu: Mapped[str | None] = mapped_column(String(16))
    step: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float | None] = mapped_column(Float)
    accuracy: Mapped[float | None] = mapped_column(Float)
    examples_per_s: Mapped[float | None] = mapped_column(Float)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    batch: Mapped[int | None] = mapped_column(Integer)  # the batch the worker reported it ran (else planned)
    at: Mapped[float] = mapped_column(Float)
    runtime: Mapped[str | None] = mapped_column(String(40))  # as the worker reported it (pytorch-eager+torchjob)
    precision: Mapped[str | None] = mapped_column(String(8))
    compute_s: Mapped[float | None] = mapped_column(Float)  # this worker's own compute per step, timed alone
    gpus: Mapped[int | None] = mapped_column(Integer)  # GPUs the worker's batch ran on (a multi-GPU node); NULL: 1


class LedgerEntry(Base):
    __tablename__ = "ledger"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id"), unique=True)
    role: Mapped[str] = mapped_column(String(8))
    start_at: Mapped[float] = mapped_column(Float)
    end_at: Mapped[float] = mapped_column(Float)
    seconds: Mapped[float] = mapped_column(Float)
    price_per_hour: Mapped[float] = mapped_column(Float)
    usd: Mapped[float] = mapped_column(Float)


class Block(Base):
    """A place the provider said no to (zone stockout, region quota, a global GPU quota), until it expires."""

    __tablename__ = "blocks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    provider: Mapped[str] = mapped_column(String(200), index=True)  # the backend key (project, endpoint)
    scope: Mapped[str] = mapped_column(String(8))  # zone | region | global
    location: Mapped[str] = mapped_column(String(64))  # the zone or region name; "global"
    resource: Mapped[str] = mapped_column(String(64))  # GPU type or quota metric; "*" for any
    reason: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float, index=True)


class Operation(Base):
    """A cloud call a pass started and later passes follow (control/operations.py): nothing waits on it.

    The row is written before the call (intent first) with the call's ``request_id``, so a call whose answer
    was lost with the process that sent it is sent again with the same id and the cloud answers with the
    first one's operation. ``name`` is the provider's operation id once known; ``ended_at`` the provider's
    own end time (a delete's endTime closes the instance's ledger there).
    """

    __tablename__ = "operations"
    __table_args__ = (Index("ix_operations_job_status", "job_id", "status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id"), index=True)
    kind: Mapped[str] = mapped_column(String(8))  # insert | delete
    zone: Mapped[str] = mapped_column(String(32))
    zones_left: Mapped[str] = mapped_column(String(200), default="")  # insert: where to try next, in order
    request_id: Mapped[str] = mapped_column(String(36), unique=True)
    name: Mapped[str | None] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(12))  # pending | done | failed | timed_out
    error: Mapped[str | None] = mapped_column(String(500))
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)


class Plan(Base):
    __tablename__ = "plans"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    spec_name: Mapped[str] = mapped_column(String(64))
    chosen: Mapped[str] = mapped_column(Text)  # JSON
    candidates: Mapped[str] = mapped_column(Text)  # JSON (the Pareto front)
    created_at: Mapped[float] = mapped_column(Float)


class Intent(Base):
    """The desired state recorded at launch (costmodel.launch_plan.LaunchPlan as JSON): what every pass drives toward.

    ``revision`` counts the job's plans (1 at launch; a re-plan adds the next, the latest is in force);
    ``version`` is the JSON layout's (costmodel.launch_plan.PLAN_VERSION) so an older controller refuses a newer plan.
    """

    __tablename__ = "intents"
    __table_args__ = (UniqueConstraint("job_id", "revision", name="uq_intents_job_revision"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    revision: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer)
    plan: Mapped[str] = mapped_column(Text)  # JSON
    created_at: Mapped[float] = mapped_column(Float)


class Calibration(Base):
    __tablename__ = "calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(200))
    params: Mapped[str] = mapped_column(Text)  # JSON
    mape: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
