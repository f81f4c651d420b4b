"""`orchestrator image bake`: build a worker or parameter-server boot image on GCE.

One bake (planned and named by control/bake_plan.py before anything costs money): record it in the results
DB (a ``bake`` pseudo-job, control/bake_record.py, so the builder's seconds x price land in the ledger);
create an on-demand builder VM from Debian 12 (with the GPU attached for a worker image), labelled like any
orchestrator VM (job id ``bake-...``) plus ``orch-bake-until``, the end of the bake's time limit, which the
daemon's orphan sweep respects (control/gc.py); give it a per-bake SSH key through the ``ssh-keys``
metadata; push the recipe from ``images/``; run it detached over SSH and follow its log until it exits;
check the exit code; image the boot disk into the family ``orchestrator-<role>[-<gpu>]``; and delete the
builder VM whatever happened (Ctrl-C and SIGTERM included).
"""

from __future__ import annotations

import contextlib
import shlex
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from orchestrator.control.bake_plan import BakePlan, plan_bake, recipe_path
from orchestrator.control.bake_record import BakeRecord
from orchestrator.control.driver import spec_to_yaml
from orchestrator.control.signals import Terminated, sigterm_raises
from orchestrator.core.cloud_errors import CapacityError, ProviderError, QuotaError
from orchestrator.core.errors import UserError
from orchestrator.core.instances import (
    LABEL_BAKE,
    LABEL_BAKE_UNTIL,
    InstanceRequest,
    ObservedInstance,
    ObservedState,
    ProcState,
    Role,
)
from orchestrator.core.spec import GceProvider as GceSpec
from orchestrator.core.spec import JobSpec, load_spec
from orchestrator.core.status import InstanceStatus, JobStatus
from orchestrator.providers.base import Provider, SupportsImages
from orchestrator.providers.gce.backend import TF_PORTS
from orchestrator.providers.gce.network import IsolatedGceProvider, address_learner
from orchestrator.providers.gce.provider import DEFAULT_IMAGE
from orchestrator.transport.base import Endpoint, Transport, TransportError
from orchestrator.transport.keys import delete_job_key, job_key
from orchestrator.transport.ssh import SshTransport

__all__ = ["BakeError", "BakePlan", "bake_image", "plan_bake"]
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
    name: str | None = None,
    wait_s: float = 5400.0,
    provider: Provider | None = None,
    transport: Transport | None = None,
    recipe_command: list[str] | None = None,
    base_image: str = DEFAULT_IMAGE,
    boot_timeout_s: float = 600.0,
    ssh_timeout_s: float = 300.0,
    poll_s: float = 5.0,
    say: Callable[[str], None] = print,
) -> str:
    """Bake an image; returns its name. ``wait_s`` bounds the recipe's run. ``provider`` / ``transport``
    default to a ``GceProvider`` built from the spec and an ``SshTransport``. ``recipe_command`` replaces
    ``bash <role>.sh`` (tests); the recipe is pushed either way. ``base_image`` only applies to a provider
    built here (an injected provider boots its own image)."""
    spec = _gce_spec(spec_path)
    gce = spec.provider.as_gce()
    assert gce is not None
    plan = plan_bake(role, gpu, list(gce.zones), name=name, say=say)
    recipe = recipe_path(plan.role)
    command = list(recipe_command) if recipe_command is not None else ["bash", recipe.name]
    limits = Limits(wait_s=wait_s, boot_s=boot_timeout_s, ssh_s=ssh_timeout_s, poll_s=poll_s)
    own_provider = provider is None
    provider = provider or _builder_provider(gce, base_image)
    try:
        if not isinstance(provider, SupportsImages):
            raise UserError(f"provider {provider.name or type(provider).__name__} cannot create images")
        with sigterm_raises():  # `kill` / `timeout` delete the builder as Ctrl-C does
            _Bake(plan, provider, transport, gce.ssh_user, limits, say).run(spec_to_yaml(spec), recipe, command)
    finally:
        if own_provider:
            provider.close()
    project = getattr(provider, "project", "<project>")
    say(
        f"image {plan.image} created in family {plan.family}; use it with\n"
        f"  provider.image: projects/{project}/global/images/family/{plan.family}"
    )
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


def _gce_spec(spec_path: str | Path | None) -> JobSpec:
    if spec_path is None:
        raise UserError("give --spec: a job spec with provider.kind: gce (project, zones, credentials)")
    spec = load_spec(spec_path)
    if spec.provider.as_gce() is None:
        raise UserError(
            f"{spec_path}: provider.kind is {spec.provider.kind!r}; images are baked on GCE (provider.kind: gce)"
        )
    return spec


def _builder_provider(gce: GceSpec, base_image: str) -> Provider:
    # The builder is a job of its own: its own tag and rules (SSH from this controller), made by
    # create and deleted with it; it opens no training ports, so an open network does not matter.
    return IsolatedGceProvider(
        gce.project, ports=TF_PORTS, ssh_ranges=gce.ssh_source_ranges, allow_open_network=True,
        learn_address=address_learner(), credentials=gce.credentials,
        api_endpoint=gce.api_endpoint, image=base_image, network=gce.network,
    )


class _Bake:
    """One bake, step by step: record it, create the builder, reach it, run the recipe, image its disk.
    Whatever happens, the builder is deleted and the record closed (its ledger row with it)."""

    def __init__(self, plan: BakePlan, provider: Provider, transport: Transport | None, user: str,
                 limits: Limits, say: Callable[[str], None]) -> None:
        self.plan, self.provider, self.user, self.limits, self.say = plan, provider, user, limits, say
        self.own_transport = transport is None
        self.transport = transport if transport is not None else SshTransport()
        self.tried: list[str] = []  # zones a create was sent to: the cleanup deletes in each
        self.what = f"{plan.role} image{' for ' + plan.gpu if plan.gpu else ''}"

    def run(self, spec_yaml: str, recipe: Path, command: list[str]) -> None:
        plan = self.plan
        self.say(f"baking the {self.what}: image {plan.image}, family {plan.family}")
        record = BakeRecord.start(
            job_id=plan.job_id, builder=plan.builder, image=plan.image, spec_yaml=spec_yaml,
            price_book=plan.price_book, shape=plan.shape, gpu=plan.gpu, machine_type=plan.machine_type,
            zone=plan.zones[0], price_per_hour=plan.price_per_hour, limit_s=self.limits.total_s)
        outcome, why = JobStatus.FAILED, "the bake failed"
        try:
            zone = self._create(record)
            ep = self._connect(zone, record)
            self._run(ep, recipe, command, record)
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
        labels = {LABEL_BAKE: "1", LABEL_BAKE_UNTIL: str(int(time.time() + limit))}
        try:
            zone = _create_builder(self.provider, plan, self.user, public, labels, int(limit), self.tried, self.say)
        except (CapacityError, QuotaError) as exc:
            record.create_failed(f"every zone refused the builder: {exc.message}")
            raise
        record.step(f"builder VM created in {zone}", JobStatus.PROVISIONING, InstanceStatus.PROVISIONING, zone=zone)
        return zone

    def _connect(self, zone: str, record: BakeRecord) -> Endpoint:
        plan = self.plan
        observed = _wait_running(self.provider, plan.builder, self.limits.boot_s, self.limits.poll_s)
        key_path, _ = job_key(plan.builder)
        ep = Endpoint(
            workdir=observed.workdir or "orchestrator",
            host=observed.host or "127.0.0.1",
            port=observed.ssh_port or 22,
            user=self.user,  # as providers.gce.backend reaches a job's VMs
            key_path=str(key_path),
            host_key_source=partial(self.provider.host_keys, plan.builder, zone),  # type: ignore[attr-defined]  # pinned
        )
        self.say(f"connecting to {plan.builder} over SSH ({ep.user or 'you'}@{ep.host}:{ep.port})")
        self.transport.wait_reachable(ep, self.limits.ssh_s)
        record.step("builder VM reachable over SSH", builder=InstanceStatus.READY, host=ep.host)
        return ep

    def _run(self, ep: Endpoint, recipe: Path, command: list[str], record: BakeRecord) -> None:
        plan = self.plan
        self.transport.put(ep, recipe, recipe.name)
        env = {"ROLE": plan.role, "GPU": plan.gpu or ""}
        record.step(f"recipe `{shlex.join(command)}` running", JobStatus.RUNNING, InstanceStatus.TRAINING)
        self.say(f"running {shlex.join(command)} on {plan.builder} (this takes a while)")
        _run_recipe(self.transport, ep, command, env, self.limits.wait_s, self.limits.poll_s, self.say)
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


def _create_builder(provider: Provider, plan: BakePlan, user: str, public: str, labels: dict[str, str],
                    max_run_s: int, tried: list[str], say: Callable[[str], None]) -> str:
    """Create the builder in the first zone that has capacity; returns that zone."""
    last: ProviderError | None = None
    for zone in plan.zones:
        request = InstanceRequest(
            name=plan.builder,
            job_id=plan.job_id,
            role=Role.WORKER if plan.role == "worker" else Role.PS,
            index=0,
            generation=0,
            zone=zone,
            machine_type=plan.machine_type,
            spot=False,  # a revoked builder would waste the whole bake
            gpu=plan.gpu,
            gpu_count=1 if plan.gpu else 0,
            price_per_hour=plan.price_per_hour,
            labels=labels,
            metadata={"ssh-keys": f"{user}:{public}", "block-project-ssh-keys": "true",
                      "enable-guest-attributes": "TRUE"},  # the guest agent publishes the host keys
            max_run_s=max_run_s,  # spend stays bounded if this process dies: GCE deletes the builder itself
        )
        say(
            f"creating builder VM {plan.builder} ({plan.machine_type}"
            f"{', 1x' + plan.gpu if plan.gpu else ''}, on-demand, ${plan.price_per_hour:.2f}/h) in {zone}"
        )
        tried.append(zone)
        try:
            provider.create(request)
            return zone
        except (CapacityError, QuotaError) as exc:
            say(f"  {zone}: {exc.message}; trying the next zone")
            last = exc
    assert last is not None
    raise last


def _wait_running(provider: Provider, name: str, timeout_s: float, poll_s: float) -> ObservedInstance:
    deadline = time.monotonic() + timeout_s
    while True:
        found = next((o for o in provider.list([name]) if o.name == name), None)
        if found is not None and found.state == ObservedState.RUNNING and found.host:
            return found
        if found is not None and found.state == ObservedState.TERMINATED:
            raise BakeError(f"builder VM {name} stopped before the recipe ran")
        if time.monotonic() >= deadline:
            state = found.state.value if found else "not listed"
            raise BakeError(f"builder VM {name} not running after {timeout_s:.0f}s (state: {state})")
        time.sleep(poll_s)


def _run_recipe(
    transport: Transport, ep: Endpoint, command: list[str], env: dict[str, str], wait_s: float, poll_s: float,
    say: Callable[[str], None],
) -> None:
    """Start the recipe detached (an SSH drop does not kill it), follow its log, check its exit code."""
    transport.start(ep, PROC, command, env=env)
    deadline = time.monotonic() + wait_s
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
        if time.monotonic() >= deadline:
            with contextlib.suppress(TransportError):
                transport.stop(ep, PROC)
            raise BakeError(f"the recipe did not finish within {wait_s:.0f}s (raise --wait)")
        time.sleep(poll_s)


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
