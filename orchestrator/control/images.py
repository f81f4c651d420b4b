"""`orchestrator image bake`: build a worker or parameter-server boot image, through the provider kind's
``ImageBuilder`` (providers/bake.py; gce: providers/gce/bake.py), which plans it, builds the builder's provider
and create request, and says how to reach the builder.

One bake (planned and named before anything costs money): record it in the results DB (a ``bake``
pseudo-job, control/bake_record.py, so the builder's seconds x price land in the ledger); create the builder
VM (a GPU worker image: with the GPU, from a base image with a driver route; Spot where the machine type has no
on-demand), labelled like any orchestrator VM (job id ``bake-...``) plus ``orch-bake-until``, the end of the
bake's time limit, which the daemon's orphan sweep respects (control/gc.py); give it a per-bake SSH key; push
the recipe from ``images/``; run it detached over SSH and follow its log until it exits; check the exit code;
image the boot disk into the plan's family; and delete the builder VM whatever happened (Ctrl-C and SIGTERM
included).
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.clock import WALL, Clock
from orchestrator.control.bake_record import BakeRecord
from orchestrator.control.driver import spec_to_yaml
from orchestrator.control.signals import Terminated, sigterm_raises
from orchestrator.model.cloud_errors import CapacityError, ProviderError, QuotaError
from orchestrator.model.errors import UserError
from orchestrator.model.instances import LABEL_BAKE, LABEL_BAKE_UNTIL, ObservedInstance, ObservedState, ProcState
from orchestrator.model.spec import JobSpec, load_spec
from orchestrator.model.status import InstanceStatus, JobStatus
from orchestrator.providers.bake import BakePlan, ImageBuilder
from orchestrator.providers.base import Provider, SupportsImages
from orchestrator.providers.registry import check_setup, image_builder_for
from orchestrator.transport.base import Endpoint, Transport, TransportError
from orchestrator.transport.keys import delete_job_key, job_key
from orchestrator.transport.ssh import SshTransport

__all__ = ["BakeError", "BakePlan", "bake_image"]
PROC = "bake"  # the recipe's process name on the builder (logs/bake.log, procs/bake.exit)
IMAGING_S = 1800.0  # after the recipe: stopping the builder and imaging its disk (GCE: minutes)


class BakeError(UserError):
    """The bake failed after spending money (a VM was created); the builder VM has been deleted."""

    exit_code = 1


def bake_image(
    role: str,
    gpu: str | None,
    spec_path: str | Path | None,
    *,
    framework: str = "tensorflow",
    name: str | None = None,
    wait_s: float = 5400.0,
    provider: Provider | None = None,
    transport: Transport | None = None,
    recipe_command: list[str] | None = None,
    boot_timeout_s: float = 600.0,
    ssh_timeout_s: float = 300.0,
    poll_s: float = 5.0,
    say: Callable[[str], None] = print,
) -> str:
    """Bake an image; returns its name. ``wait_s`` bounds the recipe's run. ``provider`` / ``transport``
    default to the kind's builder provider (booting the plan's base image) and an ``SshTransport``.
    ``recipe_command`` replaces ``bash <recipe>`` (tests); the recipe is pushed either way."""
    spec = _spec(spec_path)
    builder = image_builder_for(spec)
    check_setup(spec, probe=False)  # credentials and project, before anything is recorded or created
    plan = builder.plan(role, gpu, framework, name, say)
    command = list(recipe_command) if recipe_command is not None else ["bash", plan.recipe.name]
    limits = Limits(wait_s=wait_s, boot_s=boot_timeout_s, ssh_s=ssh_timeout_s, poll_s=poll_s)
    own_provider = provider is None
    provider = provider or builder.provider(plan)
    try:
        if not isinstance(provider, SupportsImages):
            raise UserError(f"provider {provider.name or type(provider).__name__} cannot create images")
        with sigterm_raises():  # `kill` / `timeout` delete the builder as Ctrl-C does
            _Bake(plan, builder, provider, transport, limits, say).run(spec_to_yaml(spec), command)
    finally:
        if own_provider:
            provider.close()
    say(builder.usage(plan))
    return plan.image


@dataclass(frozen=True)
class Limits:
    wait_s: float  # the recipe's run
    boot_s: float  # create -> RUNNING
    ssh_s: float  # RUNNING -> reachable over SSH
    poll_s: float

    @property
    def total_s(self) -> float:
        """The longest a bake can keep its builder: the sweep's label and the VM's cloud-side limit."""
        return self.boot_s + self.ssh_s + self.wait_s + IMAGING_S


def _spec(spec_path: str | Path | None) -> JobSpec:
    if spec_path is None:
        raise UserError("give --spec: a job spec with provider.kind: gce (project, zones, credentials)")
    return load_spec(spec_path)


class _Bake:
    """One bake, step by step: record it, create the builder, reach it, run the recipe, image its disk.
    Whatever happens, the builder is deleted and the record closed (its ledger row with it)."""

    def __init__(self, plan: BakePlan, builder: ImageBuilder, provider: Provider, transport: Transport | None,
                 limits: Limits, say: Callable[[str], None]) -> None:
        self.plan, self.builder, self.provider, self.limits, self.say = plan, builder, provider, limits, say
        self.own_transport = transport is None
        self.transport = transport if transport is not None else SshTransport()
        self.tried: list[str] = []  # zones a create was sent to: the cleanup deletes in each
        self.what = plan.what
        self.clock: Clock = getattr(provider, "clock", WALL)  # the provider's, where it has one

    def run(self, spec_yaml: str, command: list[str]) -> None:
        plan = self.plan
        self.say(f"baking the {self.what}: image {plan.image}, family {plan.family}, from {plan.base_image}")
        record = BakeRecord.start(
            job_id=plan.job_id, builder=plan.builder, image=plan.image, spec_yaml=spec_yaml,
            price_book=plan.price_book, shape=plan.shape, gpu=plan.gpu, machine_type=plan.machine_type,
            zone=plan.zones[0], price_per_hour=plan.price_per_hour, limit_s=self.limits.total_s,
            provider=self.builder.kind, spot=plan.spot)
        outcome, why = JobStatus.FAILED, "the bake failed"
        try:
            zone = self._create(record)
            ep = self._connect(zone, record)
            self._run(ep, command, record)
            self.say(f"recipe done; imaging the boot disk of {plan.builder} into {plan.image}")
            record.step(f"imaging the builder's boot disk into {plan.image}")
            assert isinstance(self.provider, SupportsImages)  # checked by bake_image
            self.provider.create_image(plan.image, plan.builder, zone, family=plan.family)
            outcome, why = JobStatus.SUCCEEDED, f"image {plan.image} created in family {plan.family}"
        except (ProviderError, TransportError) as exc:
            why = f"baking the {self.what} failed: {exc}"
            raise BakeError(why) from exc
        except KeyboardInterrupt as exc:
            outcome = JobStatus.CANCELLED
            why = f"interrupted ({'SIGTERM' if isinstance(exc, Terminated) else 'Ctrl-C'}); builder deleted"
            raise
        except BaseException as exc:
            why = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._end(record, outcome, why)

    def _create(self, record: BakeRecord) -> str:
        plan, limit = self.plan, self.limits.total_s
        _, public = job_key(plan.builder)
        labels = {LABEL_BAKE: "1", LABEL_BAKE_UNTIL: str(int(self.clock.time() + limit))}
        try:
            zone = self._create_in_first_zone(public, labels, int(limit))
        except (CapacityError, QuotaError) as exc:
            record.create_failed(f"every zone refused the builder: {exc.message}")
            raise
        record.step(f"builder VM created in {zone}", JobStatus.PROVISIONING, InstanceStatus.PROVISIONING, zone=zone)
        return zone

    def _create_in_first_zone(self, public: str, labels: dict[str, str], max_run_s: int) -> str:
        """Create the builder in the first zone that has capacity; returns that zone."""
        plan, last = self.plan, None
        for zone in plan.zones:
            gpus = f", {plan.gpu_count}x{plan.gpu}" if plan.gpu else ""
            self.say(f"creating builder VM {plan.builder} ({plan.machine_type}{gpus}, "
                     f"{'spot' if plan.spot else 'on-demand'}, ${plan.price_per_hour:.2f}/h) in {zone}")
            self.tried.append(zone)
            try:
                self.provider.create(self.builder.request(plan, zone, public, labels, max_run_s))
                return zone
            except (CapacityError, QuotaError) as exc:
                self.say(f"  {zone}: {exc.message}; trying the next zone")
                last = exc
        assert last is not None
        raise last

    def _connect(self, zone: str, record: BakeRecord) -> Endpoint:
        plan = self.plan
        observed = _wait_running(self.provider, plan.builder, self.limits.boot_s, self.limits.poll_s, self.clock)
        key_path, _ = job_key(plan.builder)
        ep = self.builder.endpoint(self.provider, plan, observed, zone, str(key_path))
        self.say(f"connecting to {plan.builder} over SSH ({ep.user or 'you'}@{ep.host}:{ep.port})")
        self.transport.wait_reachable(ep, self.limits.ssh_s)
        record.step("builder VM reachable over SSH", builder=InstanceStatus.READY, host=ep.host)
        return ep

    def _run(self, ep: Endpoint, command: list[str], record: BakeRecord) -> None:
        plan = self.plan
        self.transport.put(ep, plan.recipe, plan.recipe.name)
        record.step(f"recipe `{shlex.join(command)}` running", JobStatus.RUNNING, InstanceStatus.TRAINING)
        self.say(f"running {shlex.join(command)} on {plan.builder} (this takes a while)")
        _run_recipe(self.transport, ep, command, dict(plan.recipe_env), self.limits.wait_s, self.limits.poll_s,
                    self.say, self.clock)
        if self.own_transport:
            _close(self.transport)  # the VM is about to stop; do not keep a dead connection around

    def _end(self, record: BakeRecord, outcome: JobStatus, why: str) -> None:
        plan = self.plan
        leaked = _cleanup(self.provider, plan.builder, self.tried, self.say)
        delete_job_key(plan.builder)
        if self.own_transport:
            _close(self.transport)
        record.finish(outcome, why, builder_deleted=not leaked)
        if leaked and sys.exc_info()[0] is None:
            raise BakeError(
                f"image {plan.image} was created, but the builder VM {plan.builder} could not be deleted "
                f"in {', '.join(leaked)}: delete it yourself or run `orchestrator gc --yes`"
            )


def _wait_running(provider: Provider, name: str, timeout_s: float, poll_s: float,
                  clock: Clock = WALL) -> ObservedInstance:
    deadline = clock.monotonic() + timeout_s
    while True:
        found = next((o for o in provider.list([name]) if o.name == name), None)
        if found is not None and found.state == ObservedState.RUNNING and found.host:
            return found
        if found is not None and found.state == ObservedState.TERMINATED:
            raise BakeError(f"builder VM {name} stopped before the recipe ran")
        if clock.monotonic() >= deadline:
            state = found.state.value if found else "not listed"
            raise BakeError(f"builder VM {name} not running after {timeout_s:.0f}s (state: {state})")
        clock.sleep(poll_s)


def _run_recipe(
    transport: Transport, ep: Endpoint, command: list[str], env: dict[str, str], wait_s: float, poll_s: float,
    say: Callable[[str], None], clock: Clock = WALL,
) -> None:
    """Start the recipe detached (an SSH drop does not kill it), follow its log, check its exit code."""
    transport.start(ep, PROC, command, env=env)
    deadline = clock.monotonic() + wait_s
    offset = 0
    tail: deque[str] = deque(maxlen=25)
    partial = ""

    def follow() -> None:
        nonlocal offset, partial
        chunk = transport.read_log(ep, PROC, offset)
        offset += len(chunk)
        lines = (partial + chunk.decode(errors="replace")).split("\n")
        partial = lines.pop()
        for line in lines:
            tail.append(line)
            say(f"  | {line}")

    while True:
        status = transport.status(ep, [PROC])[PROC]
        follow()
        if status.state == ProcState.EXITED:
            if partial:
                tail.append(partial)
                say(f"  | {partial}")
            if status.exit_code != 0:
                last = "\n".join(f"  | {line}" for line in tail)
                raise BakeError(
                    f"the recipe `{shlex.join(command)}` exited with code {status.exit_code}; "
                    f"its last lines:\n{last}"
                )
            return
        if status.state == ProcState.ABSENT:
            raise BakeError("the recipe is not running on the builder VM (its disk was replaced?)")
        if clock.monotonic() >= deadline:
            with contextlib.suppress(TransportError):
                transport.stop(ep, PROC)
            raise BakeError(f"the recipe did not finish within {wait_s:.0f}s (raise --wait)")
        clock.sleep(poll_s)


def _cleanup(provider: Provider, name: str, zones: list[str], say: Callable[[str], None]) -> list[str]:
    """Delete the builder in every zone it was tried in (not-found is success); returns the zones where
    deleting failed, after saying so loudly."""
    leaked: list[str] = []
    for zone in zones:
        try:
            provider.delete(name, zone)
        except ProviderError as exc:
            leaked.append(zone)
            say(
                f"could not delete builder VM {name} in {zone}: {exc}; "
                "delete it yourself or run `orchestrator gc --yes`"
            )
    if zones and not leaked:
        say(f"deleted builder VM {name}")
    return leaked


def _close(transport: Transport) -> None:
    close: Callable[[], None] | None = getattr(transport, "close", None)
    if close is not None:
        close()
