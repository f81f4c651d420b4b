"""A seed gives the same revocations run after run: the local provider revokes on the job's progress clock.

The real emulated-cloud process (``local_host``) watches a real metrics.jsonl that this test appends to,
once fast and once three times slower (a loaded machine): the instance is revoked at the same step.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.control.driver import emulation
from orchestrator.costmodel.slots import expand
from orchestrator.model.instances import REVOKE_AT_STEP, InstanceRequest, ObservedState, Role
from orchestrator.model.spec import LocalProvider as LocalSpec
from orchestrator.model.spec import load_spec
from orchestrator.providers.local.progress import first_step_at_least, max_step
from orchestrator.providers.local.provider import PROGRESS_STEP_S, LocalProvider, progress_clock_for
from orchestrator.providers.local.revocations import revoke_after_s, revoke_at_step

REPO = Path(__file__).resolve().parent.parent


def _request(job: str, storage: Path, generation: int, revoke_after_s: float, step_s: float) -> InstanceRequest:
    return InstanceRequest(name=f"{job}-worker-0-{generation}", job_id=job, role=Role.WORKER, index=0,
                           generation=generation, zone="local", machine_type="local", spot=True, gpu="k80",
                           gpu_count=1, price_per_hour=0.1,
                           metadata={"notice-file": str(storage / "notices" / f"{job}-worker-0-{generation}"),
                                     PROGRESS_STEP_S: str(step_s)},
                           revoke_after_s=revoke_after_s)


def _train_until_revoked(tmp_path: Path, job: str, seconds_per_step: float) -> dict[str, object]:
    """Create a spot instance whose lifetime is 40 steps' worth, then 'train' at the given wall pace."""
    storage = tmp_path / job / "storage"
    storage.mkdir(parents=True)
    provider = LocalProvider(tmp_path / job / "home", time_scale=60.0, boot_delay_cloud_s=6.0,
                             notice_window_cloud_s=60.0)
    name = f"{job}-worker-0-0"
    provider.create(_request(job, storage, 0, revoke_after_s=2.0, step_s=0.05))  # 2 s / 0.05 s = 40 steps
    try:
        with (storage / "metrics.jsonl").open("a") as fh:
            for step in range(5, 400, 5):
                fh.write(json.dumps({"kind": "step", "step": step, "t": time.time()}) + "\n")
                fh.flush()
                time.sleep(seconds_per_step * 5)
                states = {o.name: o.state for o in provider.list([job])}
                if states.get(name) in (ObservedState.STOPPING, ObservedState.TERMINATED):
                    break
        deadline = time.time() + 20
        while (record := provider.history(name)) is None or "notice_step" not in record:
            assert time.time() < deadline, "never revoked"
            time.sleep(0.1)
        return record
    finally:
        provider.delete(name, "local")


def test_revocation_step_does_not_depend_on_training_speed(tmp_path: Path) -> None:
    fast = _train_until_revoked(tmp_path, "fast", seconds_per_step=0.004)
    slow = _train_until_revoked(tmp_path, "slow", seconds_per_step=0.012)
    assert fast["revoke_at_step"] == slow["revoke_at_step"] == 40
    assert fast["notice_step"] == slow["notice_step"] == 40  # the first logged step at or past 40
    assert fast["preempted"] is True and slow["preempted"] is True


def test_replacement_counts_from_its_predecessors_revocation_step(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    (storage / "notices").mkdir(parents=True)
    (storage / "metrics.jsonl").write_text(json.dumps({"kind": "step", "step": 57}) + "\n")
    provider = LocalProvider(tmp_path / "home", time_scale=60.0, boot_delay_cloud_s=3600.0)
    try:
        provider.create(_request("j", storage, 0, revoke_after_s=2.0, step_s=0.05))
        first = provider.history("j-worker-0-0")
        assert first is not None and first["base_step"] == 57 and first["revoke_at_step"] == 97
        provider.create(_request("j", storage, 1, revoke_after_s=1.0, step_s=0.05))
        second = provider.history("j-worker-0-1")
        # created when the job is at step 57, but its life starts where the first one's ended: a fixed chain
        assert second is not None and second["base_step"] == 97 and second["revoke_at_step"] == 117
    finally:
        for name in ("j-worker-0-0", "j-worker-0-1"):
            provider.delete(name, "local")


def test_progress_clock_only_for_drawn_revocations() -> None:
    spec = load_spec(REPO / "examples" / "local-hetero.yaml")
    slots = expand(spec)
    meta = progress_clock_for(spec, slots, emulation(spec))
    step_s = float(meta[PROGRESS_STEP_S])
    sleeps = [emulation(spec)(s.gpu, s.batch or 128) for s in slots if s.role == Role.WORKER]
    assert step_s == pytest.approx(1 / sum(1 / t for t in sleeps), rel=1e-4)  # async: worker rates add up
    sched = spec.model_copy(update={"provider": spec.provider.model_copy(update={"revocations": "schedule"})})
    assert progress_clock_for(sched, slots, emulation(spec)) == {}


def test_drawn_lifetimes_are_the_seeds() -> None:
    spec = load_spec(REPO / "examples" / "local-hetero.yaml")
    provider = spec.provider
    assert isinstance(provider, LocalSpec)
    draws = [revoke_after_s(provider, Role.WORKER, 1, g, "p100", "local", True, None, 0.0) for g in range(3)]
    again = [revoke_after_s(provider, Role.WORKER, 1, g, "p100", "local", True, None, 0.0) for g in range(3)]
    assert draws == again and len(set(draws)) == 3


def test_step_readers_skip_partial_lines_and_keep_file_order() -> None:
    data = b'{"kind": "step", "step": 30}\n{"kind": "step", "step": 50}\n{"kind": "step", "step": 40}\n{"kind": "st'
    assert max_step(data) == 50
    assert max_step(b"") == 0
    assert first_step_at_least(data, 35) == 50 and first_step_at_least(data, 51) is None


def test_a_scheduled_at_step_revokes_at_that_step_of_training(tmp_path: Path) -> None:
    """``schedule: [{instance, at_step}]``: the notice comes when training reaches the step, not after so many
    wall seconds (a loaded host that boots and trains slowly is revoked mid-training all the same)."""
    storage = tmp_path / "storage"
    (storage / "notices").mkdir(parents=True)
    provider = LocalProvider(tmp_path / "home", time_scale=60.0, boot_delay_cloud_s=6.0, notice_window_cloud_s=60.0)
    name = "j-worker-0-0"
    request = _request("j", storage, 0, revoke_after_s=0.0, step_s=0.0)
    request = replace(
        request, revoke_after_s=None, metadata={"notice-file": request.metadata["notice-file"], REVOKE_AT_STEP: "30"}
    )
    provider.create(request)
    try:
        time.sleep(0.5)  # booted (0.1 s), and no notice before training gets there
        assert provider.history(name) is not None and "notice_step" not in (provider.history(name) or {})
        with (storage / "metrics.jsonl").open("a") as fh:
            for step in (10, 20, 35):
                fh.write(json.dumps({"kind": "step", "step": step}) + "\n")
                fh.flush()
        deadline = time.time() + 20
        while (record := provider.history(name)) is None or "notice_step" not in record:
            assert time.time() < deadline, "never revoked"
            time.sleep(0.1)
        assert record["revoke_at_step"] == 30 and record["notice_step"] == 35 and record["preempted"] is True
    finally:
        provider.delete(name, "local")


def test_schedule_entries_on_the_step_clock() -> None:
    local = LocalSpec(
        revocations="schedule",
        schedule=[{"instance": "worker-1", "at_step": 50}, {"instance": "worker-1", "at_step": 20}],
    )
    assert [revoke_at_step(local, Role.WORKER, 1, g, True) for g in range(3)] == [20, 50, None]
    assert revoke_at_step(local, Role.WORKER, 1, 0, False) is None  # on-demand: never revoked
    assert revoke_after_s(local, Role.WORKER, 1, 0, "k80", "local", True, 0.0, 0.0) is None  # not on the wall clock
    with pytest.raises(ValueError, match="exactly one of at_s"):
        LocalSpec(revocations="schedule", schedule=[{"instance": "worker-1", "at_s": 5, "at_step": 20}])
    with pytest.raises(ValueError, match="exactly one of at_s"):
        LocalSpec(revocations="schedule", schedule=[{"instance": "worker-1"}])
