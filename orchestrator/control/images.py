"""`orchestrator image bake`: build a worker or parameter-server boot image on GCE.

One bake: create an on-demand builder VM from Debian 12 (with the GPU attached for a worker image),
labelled like any orchestrator VM (job id ``bake-...``) so that ``orchestrator gc`` finds it if this
process dies; give it a per-bake SSH key through the ``ssh-keys`` metadata; push the recipe from
``images/``; run it detached over SSH and follow its log until it exits; check the exit code; image the
boot disk into the family ``orchestrator-<role>[-<gpu>]``; and delete the builder VM whatever happened.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from orchestrator.core.catalog import CURRENT_BOOK, CatalogError, load_catalog
from orchestrator.core.cloud_errors import CapacityError, ProviderError, QuotaError
from orchestrator.core.errors import UserError
from orchestrator.core.instances import InstanceRequest, ObservedInstance, ObservedState, ProcState, Role
from orchestrator.core.offerings import retired_message
from orchestrator.core.paths import _bundled
from orchestrator.core.spec import load_spec
from orchestrator.providers.base import Provider, SupportsImages
from orchestrator.providers.gce.network import published_host_keys
from orchestrator.providers.gce.provider import DEFAULT_IMAGE
from orchestrator.transport.base import Endpoint, Transport, TransportError
from orchestrator.transport.keys import delete_job_key, job_key

ROLES = ("worker", "ps")
PROC = "bake"  # the recipe's process name on the builder (logs/bake.log, procs/bake.exit)
PS_MACHINE_TYPE = "n1-standard-4"
DEFAULT_PS_ZONE = "us-central1-c"
_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# TF 2.21 needs CUDA 12, which dropped Kepler; see images/worker.sh for the versions that still ran on it.
_UNSUPPORTED_GPUS = {
    "k80": (
        "TensorFlow 2.21 (CUDA 12) does not run on the K80 (compute capability 3.7; its last driver is R470, "
        "CUDA <= 11.4), and GCE retired the K80 in 2024"
    ),
}


class BakeError(UserError):
    """The bake failed after spending money (a VM was created); the builder VM has been deleted."""

    exit_code = 1


@dataclass(frozen=True)
class BakePlan:
    role: str
    gpu: str | None
    image: str  # image name
    family: str
    builder: str  # builder VM name; also its job id and its SSH key's name
    machine_type: str
    zones: tuple[str, ...]  # tried in order on stockouts / quota


def image_family(role: str, gpu: str | None) -> str:
    return f"orchestrator-{role}-{gpu}" if gpu else f"orchestrator-{role}"


def recipe_path(role: str) -> Path:
    """``images/<role>.sh`` from the checkout (or the wheel's bundled copy)."""
    try:
        path = _bundled("images") / f"{role}.sh"
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    if not path.is_file():
        raise UserError(f"no image recipe {path}")
    return path


def plan_bake(
    role: str,
    gpu: str | None,
    spec_zones: list[str],
    *,
    name: str | None = None,
    now: datetime | None = None,
    say: Callable[[str], None] = print,
) -> BakePlan:
    """Check the request (before anything costs money) and name everything."""
    if role not in ROLES:
        raise UserError(f"unknown role {role!r}; expected one of: {', '.join(ROLES)}")
    catalog = load_catalog()
    if role == "ps":
        if gpu:
            raise UserError("parameter-server images are CPU-only; drop --gpu (or use --role worker)")
        zones = list(spec_zones) or [DEFAULT_PS_ZONE]
        machine_type = PS_MACHINE_TYPE
    else:
        if not gpu:
            raise UserError("a worker image is built for one GPU type: give --gpu (e.g. --gpu v100)")
        gpu = gpu.lower()
        current = ", ".join(catalog.current_gpus())  # only what GCE sells today (data/gpu_lifecycle.csv)
        if gpu in _UNSUPPORTED_GPUS:
            raise UserError(
                f"cannot bake a worker image for {gpu}: {_UNSUPPORTED_GPUS[gpu]}",
                hint=f"bake for one of: {current}; images/README.md says what a legacy K80 image would need",
            )
        try:
            info = catalog.gpu(gpu)
        except CatalogError as exc:
            raise UserError(str(exc), hint=f"GPUs GCE sells today: {current}") from None
        if (gone := retired_message(catalog, gpu, catalog.price_book(CURRENT_BOOK))) is not None:
            raise UserError(f"cannot bake a worker image for {gpu}: {gone}", hint=f"bake for one of: {current}")
        offered = catalog.zones_for(gpu)
        zones = [z for z in spec_zones if z in offered]
        if not zones:
            # The image is global: where it is built does not matter, only that the GPU is there.
            zones = list(offered)
            if spec_zones:
                say(
                    f"none of provider.zones ({', '.join(spec_zones)}) offers {gpu}; "
                    f"building in {zones[0] if zones else '?'} instead"
                )
        if not zones:
            raise UserError(f"the catalog knows no zone offering {gpu}")
        # n1 hosts take any single GPU; a2 / g2 / a3 shapes come with theirs.
        machine_type = (
            "n1-standard-4" if info.default_machine_type.startswith("n1-") else info.default_machine_type
        )
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    family = image_family(role, gpu)
    image = name or f"{family}-{stamp}"
    if not _GCE_NAME.match(image):
        raise UserError(
            f"{image!r} is not a valid image name: 1-63 lowercase letters, digits and '-', "
            "starting with a letter"
        )
    builder = f"bake-{name}" if name else f"bake-{role}{'-' + gpu if gpu else ''}-{stamp}"
    builder = builder[:63].rstrip("-")
    return BakePlan(role, gpu, image, family, builder, machine_type, tuple(zones))


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
    if spec_path is None:
        raise UserError("give --spec: a job spec with provider.kind: gce (project, zones, credentials)")
    spec = load_spec(spec_path)
    gce = spec.provider.as_gce()
    if gce is None:
        raise UserError(
            f"{spec_path}: provider.kind is {spec.provider.kind!r}; images are baked on GCE (provider.kind: gce)"
        )
    plan = plan_bake(role, gpu, list(gce.zones), name=name, say=say)
    recipe = recipe_path(plan.role)
    command = list(recipe_command) if recipe_command is not None else ["bash", recipe.name]

    own_provider = provider is None
    if provider is None:
        from orchestrator.providers.gce.backend import TF_PORTS
        from orchestrator.providers.gce.network import IsolatedGceProvider, address_learner

        # The builder is a job of its own: its own tag and rules (SSH from this controller), made by
        # create and deleted with it; it opens no training ports, so an open network does not matter.
        provider = IsolatedGceProvider(
            gce.project, ports=TF_PORTS, ssh_ranges=gce.ssh_source_ranges, allow_open_network=True,
            learn_address=address_learner(gce.api_endpoint), credentials=gce.credentials,
            api_endpoint=gce.api_endpoint, image=base_image, network=gce.network,
        )
    if not isinstance(provider, SupportsImages):
        raise UserError(f"provider {provider.name or type(provider).__name__} cannot create images")
    own_transport = transport is None
    if transport is None:
        from orchestrator.transport.ssh import SshTransport

        transport = SshTransport()
    user = gce.ssh_user  # as providers.gce.backend reaches a job's VMs

    what = f"{plan.role} image{' for ' + plan.gpu if plan.gpu else ''}"
    say(f"baking the {what}: image {plan.image}, family {plan.family}")
    key_path, public = job_key(plan.builder)
    tried: list[str] = []
    try:
        zone = _create_builder(provider, plan, gce.ssh_user, public, tried, say)
        observed = _wait_running(provider, plan.builder, boot_timeout_s, poll_s)
        ep = Endpoint(
            workdir=observed.workdir or "orchestrator",
            host=observed.host or "127.0.0.1",
            port=observed.ssh_port or 22,
            user=user,
            key_path=str(key_path),
            host_key_source=partial(published_host_keys, provider, plan.builder, zone),  # pinned
        )
        say(f"connecting to {plan.builder} over SSH ({ep.user or 'you'}@{ep.host}:{ep.port})")
        transport.wait_reachable(ep, ssh_timeout_s)
        transport.put(ep, recipe, recipe.name)
        env = {"ROLE": plan.role, "GPU": plan.gpu or ""}
        say(f"running {shlex.join(command)} on {plan.builder} (this takes a while)")
        _run_recipe(transport, ep, command, env, wait_s, poll_s, say)
        if own_transport:
            _close(transport)  # the VM is about to stop; do not keep a dead connection around
        say(f"recipe done; imaging the boot disk of {plan.builder} into {plan.image}")
        provider.create_image(plan.image, plan.builder, zone, family=plan.family)
    except (ProviderError, TransportError) as exc:
        raise BakeError(f"baking the {what} failed: {exc}") from exc
    finally:
        leaked = _cleanup(provider, plan.builder, tried, say)
        delete_job_key(plan.builder)
        if own_transport:
            _close(transport)
        if own_provider:
            provider.close()
        if leaked and sys.exc_info()[0] is None:
            raise BakeError(
                f"image {plan.image} was created, but the builder VM {plan.builder} could not be deleted "
                f"in {', '.join(leaked)}: delete it yourself or run `orchestrator gc --yes`"
            )
    project = getattr(provider, "project", "<project>")
    say(
        f"image {plan.image} created in family {plan.family}; use it with\n"
        f"  provider.image: projects/{project}/global/images/family/{plan.family}"
    )
    return plan.image


def _create_builder(provider: Provider, plan: BakePlan, user: str, public: str, tried: list[str],
                    say: Callable[[str], None]) -> str:
    """Create the builder in the first zone that has capacity; returns that zone."""
    last: ProviderError | None = None
    for zone in plan.zones:
        request = InstanceRequest(
            name=plan.builder,
            job_id=plan.builder,
            role=Role.WORKER if plan.role == "worker" else Role.PS,
            index=0,
            generation=0,
            zone=zone,
            machine_type=plan.machine_type,
            spot=False,  # a revoked builder would waste the whole bake
            gpu=plan.gpu,
            gpu_count=1 if plan.gpu else 0,
            labels={"orch-bake": "1"},
            metadata={"ssh-keys": f"{user}:{public}", "block-project-ssh-keys": "true",
                      "enable-guest-attributes": "TRUE"},  # the guest agent publishes the host keys
        )
        say(
            f"creating builder VM {plan.builder} ({plan.machine_type}"
            f"{', 1x' + plan.gpu if plan.gpu else ''}, on-demand) in {zone}"
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
