"""When a job ends (cancelled, finished, over budget or deadline, too many restarts) and how it is torn down: every
instance deleted, the job's outcome set once none is left. Pure, as ``decide.reconcile`` that calls it."""

from __future__ import annotations

from orchestrator.decide.actions import Action, DeleteInstance, SetInstanceStatus, SetJobStatus
from orchestrator.decide.state import JobView, Observation
from orchestrator.model import timings
from orchestrator.model.status import INSTANCE_TIMEOUT_S, LIVE_INSTANCE, EndReason, InstanceStatus, JobStatus

S = InstanceStatus


def decide_end(job: JobView, obs: Observation, now: float) -> SetJobStatus | None:
    if job.cancel_requested:
        return SetJobStatus(JobStatus.TEARING_DOWN, "cancelled by the user", JobStatus.CANCELLED)
    if obs.payload_error is not None:
        return SetJobStatus(JobStatus.TEARING_DOWN, f"the payload's output is unusable: {obs.payload_error}",
                            JobStatus.FAILED)
    if obs.result is not None:
        acc = obs.result.get("accuracy")
        tail = f", accuracy {acc:.4f}" if isinstance(acc, int | float) else ""
        return SetJobStatus(JobStatus.TEARING_DOWN, f"training finished at step {obs.result.get('step')}{tail}",
                            JobStatus.SUCCEEDED)
    if job.budget_usd is not None and job.cost_usd >= job.budget_usd:
        return SetJobStatus(JobStatus.TEARING_DOWN, f"policy.budget_usd exceeded: spent ${job.cost_usd:.4f} of "
                            f"${job.budget_usd:.2f}", JobStatus.FAILED)
    if job.deadline_s is not None and job.started_at is not None and now - job.started_at > job.deadline_s:
        return SetJobStatus(JobStatus.TEARING_DOWN, f"policy.deadline of {job.deadline_s:.0f}s passed",
                            JobStatus.FAILED)
    if job.restarts > job.max_replacements + timings.EXTRA_RESTARTS:
        return SetJobStatus(JobStatus.TEARING_DOWN, f"training restarted {job.restarts} times; giving up",
                            JobStatus.FAILED)
    return None


def teardown(job: JobView, obs: Observation, now: float) -> list[Action]:
    acts: list[Action] = []
    end_reason = {JobStatus.SUCCEEDED.value: EndReason.JOB_FINISHED, JobStatus.CANCELLED.value: EndReason.JOB_CANCELLED
                  }.get(job.outcome or "", EndReason.JOB_FAILED)
    remaining = 0
    for inst in job.instances:
        st = inst.status
        if st == S.DELETED:
            continue
        if st == S.DELETING:
            if inst.name not in obs.instances:
                acts.append(SetInstanceStatus(inst.name, S.DELETED, "deletion confirmed"))
                continue
            if now - inst.updated_at > INSTANCE_TIMEOUT_S[S.DELETING]:
                acts.append(DeleteInstance(inst.name, inst.zone, "delete timed out; asking again"))
        else:
            acts.append(DeleteInstance(inst.name, inst.zone, f"job {job.outcome}: tear down",
                                       end_reason if st in LIVE_INSTANCE else None))
        remaining += 1
    if remaining == 0:
        outcome = JobStatus(job.outcome or JobStatus.FAILED.value)
        acts.append(SetJobStatus(outcome, "every instance deleted"))
    return acts
