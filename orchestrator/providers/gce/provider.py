"""Google Compute Engine: spot GPU VMs through the google-cloud-compute REST client.

Every call goes through ``_call``: the client's own retries are switched off (``retry=None``) so that
one bounded exponential backoff applies everywhere and every failure surfaces as a typed
``ProviderError``. Operations are polled with ``ZoneOperationsClient.wait`` /
``GlobalOperationsClient.wait`` rather than ``.result()``, whose internal polling client ignores a
custom ``api_endpoint`` (the emulator). Real stockouts and most quota failures arrive as errors on a
DONE operation, not as HTTP errors, so both paths are mapped.

``create`` / ``delete`` / ``list`` block (the CLI, gc, image bake use them). The controller's passes use the
non-blocking side instead (``start_create`` / ``start_delete`` / ``operation`` / ``snapshot``, run by
providers/gce/background.py), so no pass waits on an operation or a listing.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import Credentials
from google.cloud import compute_v1
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from orchestrator.core.cloud_errors import (
    InvalidRequestError,
    ProviderError,
    TransientError,
)
from orchestrator.core.instances import (
    LABEL_JOB,
    LABEL_MANAGED,
    InstanceRequest,
    ObservedInstance,
)
from orchestrator.providers.base import Provider, SupportsFirewall, SupportsImages
from orchestrator.providers.gce.background import GceBackground, GceCalls
from orchestrator.providers.gce.credentials import load_credentials
from orchestrator.providers.gce.errors import (
    GceCredentialsError,
    GcePermissionError,
    GceProjectError,
    map_exception,
    op_has_code,
    operation_error,
)
from orchestrator.providers.gce.observe import last_segment, observe
from orchestrator.providers.gce.requests import (
    CLOUD_PLATFORM_SCOPE,
    DEFAULT_IMAGE,
    GPU_ACCELERATORS,
    STORAGE_SCOPE,
    GceRequestSettings,
    accelerator_type,
    bundled_machine_types,
    firewall_rules,
    image_url,
    instance_resource,
)
from orchestrator.providers.operations import OpKind, OpRef, OpState, Snapshot, SupportsOperations, SupportsSnapshots

__all__ = [
    "CLOUD_PLATFORM_SCOPE", "DEFAULT_IMAGE", "GPU_ACCELERATORS", "GceCredentialsError", "GcePermissionError",
    "GceProjectError", "GceProvider", "accelerator_type",
]
log = logging.getLogger(__name__)
T = TypeVar("T")
@dataclass(frozen=True)
class RetrySettings:
    """Bounded exponential backoff for 429 / 5xx / timeouts, and how long to wait for operations."""

    attempts: int = 5
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 16.0
    request_timeout_s: float = 60.0  # one HTTP call (other than operations.wait)
    wait_call_timeout_s: float = 150.0  # one operations.wait call; GCE answers within ~2 min
    operation_timeout_s: float = 900.0  # give up waiting for one operation (raises TransientError)


class GceProvider(Provider, SupportsFirewall, SupportsImages, SupportsOperations, SupportsSnapshots):
    """Creates, deletes and lists the orchestrator's VMs in one GCE project."""

    name = "gce"

    def __init__(
        self,
        project: str,
        *,
        credentials: Credentials | str | os.PathLike[str] | None = None,
        api_endpoint: str | None = None,
        image: str = DEFAULT_IMAGE,
        network: str = "global/networks/default",
        subnetwork: str | None = None,
        network_tag: str | None = "orchestrator",
        external_ip: bool = True,
        use_internal_ip: bool = False,
        disk_size_gb: int = 50,
        disk_type: str | None = None,
        service_account_email: str | None = None,
        scopes: Sequence[str] = (STORAGE_SCOPE,),
        ssh_source_ranges: Sequence[str] = ("0.0.0.0/0",),
        termination_action: str = "DELETE",
        retry: RetrySettings | None = None,
        page_size: int = 500,
        settings: GceRequestSettings | None = None,
    ) -> None:
        """``credentials``: None for Application Default Credentials (anonymous when ``api_endpoint`` is
        set, i.e. the emulator), a service-account key file path, or a Credentials object.
        ``image``: a public image (``projects/debian-cloud/global/images/family/debian-12``) or one of
        this project's (``images/<name>``, ``images/family/<family>``, ``global/images/...``).
        ``use_internal_ip``: report ``networkIP`` as the host even when the VM has an external IP.
        ``termination_action``: what GCE does to a preempted or time-limited spot VM (DELETE or STOP).
        """
        self.project = project
        # ``settings``: the request settings of a job spec (backend.request_settings), used as given.
        self.settings = settings or GceRequestSettings(
            project=project, image=image, network=network, subnetwork=subnetwork, network_tag=network_tag,
            external_ip=external_ip, disk_size_gb=disk_size_gb, disk_type=disk_type,
            service_account_email=service_account_email, scopes=tuple(scopes),
            ssh_source_ranges=tuple(ssh_source_ranges), termination_action=termination_action,
            bundled=bundled_machine_types(),
        )
        self.image = image_url(project, image)
        self.network = network
        self.use_internal_ip = use_internal_ip
        self.retry = retry or RetrySettings()
        self.page_size = page_size
        # The credentials go to the clients only: never kept on self, never logged.
        kwargs: dict[str, Any] = {"credentials": load_credentials(credentials, api_endpoint, project)}
        if api_endpoint:
            kwargs["client_options"] = ClientOptions(api_endpoint=api_endpoint)
        self._instances = compute_v1.InstancesClient(**kwargs)
        self._zone_ops = compute_v1.ZoneOperationsClient(**kwargs)
        self._global_ops = compute_v1.GlobalOperationsClient(**kwargs)
        self._firewalls = compute_v1.FirewallsClient(**kwargs)
        self._images = compute_v1.ImagesClient(**kwargs)
        self._regions = compute_v1.RegionsClient(**kwargs)
        self._projects = compute_v1.ProjectsClient(**kwargs)
        self._background: GceBackground | None = None  # made by the first pass that uses it
        self.background_threads = 16  # calls (and, apart, polls) under way at once for the passes
        self._background_lock = threading.Lock()
        self._stopped_at: dict[str, float] = {}  # VM -> lastStopTimestamp, while listings see it TERMINATED

    def __repr__(self) -> str:
        return f"GceProvider(project={self.project!r})"

    def close(self) -> None:
        if self._background is not None:
            self._background.close()
        for client in (
            self._instances,
            self._zone_ops,
            self._global_ops,
            self._firewalls,
            self._images,
            self._regions,
            self._projects,
        ):
            client.transport.close()  # type: ignore[no-untyped-call]

    # ------------------------------------------------------------------ quotas

    def region_quotas(self, region: str) -> dict[str, tuple[float, float]]:
        """metric -> (limit, usage) of one region (``regions.get``); an unknown region is an InvalidRequestError."""
        found = self._call(
            f"read the quotas of region {region}",
            partial(
                self._regions.get,
                project=self.project,
                region=region,
                retry=None,
                timeout=self.retry.request_timeout_s,
            ),
        )
        return {q.metric: (float(q.limit), float(q.usage)) for q in found.quotas}

    def project_quotas(self) -> dict[str, tuple[float, float]]:
        """metric -> (limit, usage) of the project's global quotas (``projects.get``), e.g. GPUS_ALL_REGIONS."""
        found = self._call(
            "read the project's global quotas",
            partial(self._projects.get, project=self.project, retry=None, timeout=self.retry.request_timeout_s),
        )
        return {q.metric: (float(q.limit), float(q.usage)) for q in found.quotas}

    # ------------------------------------------------------------------ Provider

    def create(self, request: InstanceRequest) -> None:
        what = f"create {request.name} in {request.zone}"
        # One requestId per create(): the retries reuse it, so a retried insert whose first try did reach
        # GCE never creates twice. Not derived from the name alone, because GCE replays the original
        # (possibly failed) operation for a known requestId: a later create after a stockout, or in another
        # zone, must be a new request.
        op = self._send_insert(request, str(uuid.uuid4()))
        if op is None:
            return
        op = self._wait(op, what, zone=request.zone)
        error = operation_error(op, what, self.project, zone=request.zone, resource=request.gpu or request.machine_type)
        if error is not None and not op_has_code(op, "RESOURCE_ALREADY_EXISTS"):
            raise error

    def delete(self, name: str, zone: str) -> None:
        what = f"delete {name} in {zone}"
        op = self._send_delete(name, zone, str(uuid.uuid4()))
        if op is not None:
            op = self._wait(op, what, zone=zone)
            error = operation_error(op, what, self.project, zone=zone)
            if error is not None and not op_has_code(op, "RESOURCE_NOT_FOUND"):
                raise error
        self._after_delete(name)

    def _before_create(self, request: InstanceRequest) -> None:
        """What must exist before the job's VM (IsolatedGceProvider: the job's firewall rules)."""

    def _prerequisite(self, request: InstanceRequest) -> tuple[str, Callable[[], None]] | None:
        """(key, call) that must be done before the insert, once per key (``_before_create``'s slow part):
        the background runs it once and queues the key's inserts after it, instead of each waiting in a thread."""
        return None

    def _after_delete(self, name: str) -> None:
        """What goes once the VM is gone (IsolatedGceProvider: the job's rules, with its last VM)."""

    def _cleanup_key(self, name: str) -> str | None:
        """Deletes whose ``_after_delete`` may be merged into one (None: nothing to do after a delete)."""
        return None

    def _send_insert(self, request: InstanceRequest, request_id: str) -> compute_v1.Operation | None:
        """Send the insert (bounded retries, one requestId); its operation, or None if the VM exists."""
        self._before_create(request)
        insert = compute_v1.InsertInstanceRequest(project=self.project, zone=request.zone, request_id=request_id,
                                                  instance_resource=instance_resource(request, self.settings))
        log.info("creating %s (%s, %s%s) in %s", request.name, request.machine_type,
                 f"{request.gpu_count}x{request.gpu}, " if request.gpu else "",
                 "spot" if request.spot else "on-demand", request.zone)
        try:
            return self._call(f"create {request.name} in {request.zone}",
                              partial(self._instances.insert_unary, request=insert, retry=None,
                                      timeout=self.retry.request_timeout_s),
                              zone=request.zone, passthrough=(gexc.Conflict,))
        except gexc.Conflict:
            log.info("%s already exists; nothing to do", request.name)
            return None

    def _send_delete(self, name: str, zone: str, request_id: str) -> compute_v1.Operation | None:
        """Send the delete (bounded retries, one requestId); its operation, or None if the VM is gone."""
        req = compute_v1.DeleteInstanceRequest(project=self.project, zone=zone, instance=name, request_id=request_id)
        try:
            return self._call(f"delete {name} in {zone}",
                              partial(self._instances.delete_unary, request=req, retry=None,
                                      timeout=self.retry.request_timeout_s),
                              zone=zone, passthrough=(gexc.NotFound,))
        except gexc.NotFound:
            return None

    # ------------------------------------------------------------------ without waiting (the controller's passes)

    @property
    def operation_timeout_s(self) -> float:  # type: ignore[override]
        return self.retry.operation_timeout_s

    def _bg(self) -> GceBackground:
        with self._background_lock:
            if self._background is None:
                calls = GceCalls(self.project, partial(self.list, None), self._get_operation, self._list_operations,
                                 self._after_delete, self._cleanup_key)
                self._background = GceBackground(calls, threads=self.background_threads)
                self._widen_pools(2 * self.background_threads + 4)
            return self._background

    def _get_operation(self, zone: str, name: str) -> compute_v1.Operation:
        return self._call(f"poll {name}", partial(self._zone_ops.get, project=self.project, zone=zone, operation=name,
                                                  retry=None, timeout=self.retry.request_timeout_s), zone=zone)

    def _list_operations(self, zone: str, expression: str) -> list[compute_v1.Operation]:
        req = compute_v1.ListZoneOperationsRequest(project=self.project, zone=zone, filter=expression)
        return self._call(f"list the operations in {zone}", lambda: list(self._zone_ops.list(
            request=req, retry=None, timeout=self.retry.request_timeout_s)), zone=zone)

    def _widen_pools(self, connections: int) -> None:
        """As many kept-alive connections as background threads (requests keeps 10 per host by default)."""
        for client in (self._instances, self._zone_ops, self._global_ops, self._firewalls):
            session = getattr(client.transport, "_session", None)  # a requests.Session (google-auth's)
            if session is not None and hasattr(session, "get_adapter"):
                for scheme in ("http://", "https://"):
                    adapter = type(session.get_adapter(scheme))  # requests' HTTPAdapter, sized up
                    session.mount(scheme, adapter(pool_connections=4, pool_maxsize=connections))

    def start_create(self, request: InstanceRequest, request_id: str) -> None:
        ref = OpRef(OpKind.INSERT, request.name, request.zone, request_id)
        self._bg().start(ref, partial(self._send_insert, request, request_id), request.gpu or request.machine_type,
                         prerequisite=self._prerequisite(request))

    def start_delete(self, name: str, zone: str, request_id: str) -> None:
        ref = OpRef(OpKind.DELETE, name, zone, request_id)
        self._bg().start(ref, partial(self._send_delete, name, zone, request_id))

    def operation(self, ref: OpRef) -> OpState:
        return self._bg().operation(ref)

    def forget(self, ref: OpRef) -> None:
        self._bg().forget(ref)

    def snapshot(self) -> Snapshot | None:
        return self._bg().snapshot()

    def ended_at(self, name: str) -> float | None:
        """When the VM stopped by itself (a preemption's hard off), as its record says (lastStopTimestamp)."""
        return self._stopped_at.get(name)

    def list(self, job_ids: Collection[str] | None = None) -> list[ObservedInstance]:
        jobs = None if job_ids is None else set(job_ids)
        if jobs is not None and not jobs:
            return []
        expression = f'labels.{LABEL_MANAGED} = "1"'
        if jobs is not None and len(jobs) == 1:
            expression = f'({expression}) AND (labels.{LABEL_JOB} = "{next(iter(jobs))}")'
        observed: list[ObservedInstance] = []
        token = ""
        while True:
            req = compute_v1.AggregatedListInstancesRequest(
                project=self.project, filter=expression, max_results=self.page_size, page_token=token
            )
            page = self._call("list instances", partial(self._aggregated_page, req))
            if page.unreachables:
                # A partial view would make missing VMs look deleted (and get recreated): refuse it.
                raise TransientError(f"list instances: zones unreachable: {', '.join(page.unreachables)}")
            for scoped in page.items.values():
                for inst in scoped.instances:
                    obs = self._observe(inst)
                    if obs is not None and (jobs is None or obs.job_id in jobs):
                        observed.append(obs)
            token = page.next_page_token
            if not token:
                return observed

    def _aggregated_page(
        self, req: compute_v1.AggregatedListInstancesRequest
    ) -> compute_v1.InstanceAggregatedList:
        pager = self._instances.aggregated_list(request=req, retry=None, timeout=self.retry.request_timeout_s)
        return next(iter(pager.pages))  # the first page is already fetched; no further call

    # ------------------------------------------------------------------ optional capabilities

    def ensure_cluster_firewall(self, network_tag: str, ports: str) -> None:
        """Open ``ports`` (e.g. ``"2222-2230,8470"``) only between VMs carrying ``network_tag`` (the TF
        gRPC ports have no authentication), and ssh from ``ssh_source_ranges``. Two rules, because
        sourceTags and sourceRanges in one rule are OR-ed by GCE."""
        for rule in firewall_rules(self.settings, network_tag, ports):
            self._ensure_firewall(rule)

    def _ensure_firewall(self, rule: compute_v1.Firewall) -> None:
        what = f"firewall {rule.name}"
        try:
            existing = self._call(
                what,
                partial(
                    self._firewalls.get,
                    project=self.project,
                    firewall=rule.name,
                    retry=None,
                    timeout=self.retry.request_timeout_s,
                ),
                passthrough=(gexc.NotFound,),
            )
        except gexc.NotFound:
            existing = None
        if existing is not None and _firewall_key(existing) == _firewall_key(rule):
            return
        if existing is None:
            req: Any = compute_v1.InsertFirewallRequest(
                project=self.project, firewall_resource=rule, request_id=str(uuid.uuid4())
            )
            call: Callable[..., compute_v1.Operation] = self._firewalls.insert_unary
        else:
            log.info("updating %s to %s", what, _firewall_key(rule))
            req = compute_v1.UpdateFirewallRequest(
                project=self.project, firewall=rule.name, firewall_resource=rule, request_id=str(uuid.uuid4())
            )
            call = self._firewalls.update_unary
        try:
            op = self._call(
                what,
                partial(call, request=req, retry=None, timeout=self.retry.request_timeout_s),
                passthrough=(gexc.Conflict,),
            )
        except gexc.Conflict:
            return  # created concurrently by another controller; the next call reconciles its fields
        op = self._wait(op, what)
        if (error := operation_error(op, what, self.project)) is not None:
            raise error

    def create_image(self, name: str, source_instance: str, zone: str, family: str | None = None) -> None:
        """Image the instance's boot disk. A running source instance is stopped first: an image of a
        live disk may be inconsistent, and GCE refuses it without forceCreate."""
        what = f"create image {name} from {source_instance}"
        boot_disk = self._stopped_boot_disk(source_instance, zone, what)
        image = compute_v1.Image(name=name, source_disk=boot_disk, labels={LABEL_MANAGED: "1"})
        if family:
            image.family = family
        req = compute_v1.InsertImageRequest(project=self.project, image_resource=image, request_id=str(uuid.uuid4()))
        try:
            op = self._call(what, partial(self._images.insert_unary, request=req, retry=None,
                                          timeout=self.retry.request_timeout_s), passthrough=(gexc.Conflict,))
        except gexc.Conflict:
            log.info("image %s already exists", name)
            return
        if (error := operation_error(self._wait(op, what), what, self.project)) is not None:
            raise error

    def _stopped_boot_disk(self, source_instance: str, zone: str, what: str) -> str:
        """The instance's boot disk, once the instance is stopped (stopping it if it runs)."""
        try:
            inst = self._call(what, partial(self._instances.get, project=self.project, zone=zone,
                                            instance=source_instance, retry=None,
                                            timeout=self.retry.request_timeout_s),
                              zone=zone, passthrough=(gexc.NotFound,))
        except gexc.NotFound:
            raise InvalidRequestError(f"{what}: no instance {source_instance} in {zone}", zone=zone) from None
        boot = next((d for d in inst.disks if d.boot), None)
        if boot is None:
            raise InvalidRequestError(f"{what}: the instance has no boot disk", zone=zone)
        if inst.status not in ("TERMINATED", "SUSPENDED"):
            log.info("stopping %s before imaging its disk", source_instance)
            stop = compute_v1.StopInstanceRequest(project=self.project, zone=zone, instance=source_instance,
                                                  request_id=str(uuid.uuid4()))
            op = self._call(what, partial(self._instances.stop_unary, request=stop, retry=None,
                                          timeout=self.retry.request_timeout_s), zone=zone)
            done = self._wait(op, what, zone=zone)
            if (error := operation_error(done, what, self.project, zone=zone)) is not None:
                raise error
        return str(boot.source)

    # ------------------------------------------------------------------ observing

    def _observe(self, inst: compute_v1.Instance) -> ObservedInstance | None:
        observed, stopped = observe(inst, self.use_internal_ip)
        if stopped is not None:  # it stopped by itself (we delete, never stop): the bill ends there
            self._stopped_at[inst.name] = stopped
        return observed

    # ------------------------------------------------------------------ calls, operations, errors

    def _call(
        self,
        what: str,
        fn: Callable[[], T],
        *,
        zone: str | None = None,
        passthrough: tuple[type[Exception], ...] = (),
    ) -> T:
        """Run one API call with bounded exponential backoff (tenacity) on retryable errors; map the rest."""

        def once() -> T:
            try:
                return fn()
            except passthrough:
                raise
            except Exception as exc:
                error = map_exception(exc, what, zone, self.project)
                if error is None:
                    raise
                raise error from exc

        retrying = Retrying(
            stop=stop_after_attempt(self.retry.attempts),
            wait=wait_random_exponential(multiplier=self.retry.initial_backoff_s, max=self.retry.max_backoff_s),
            retry=retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            return retrying(once)
        except ProviderError as error:
            if not error.retryable or isinstance(error, passthrough):
                raise
            raise TransientError(
                f"{error.message} (gave up after {self.retry.attempts} attempts)", zone=zone
            ) from error

    def _log_retry(self, state: RetryCallState) -> None:
        pause = state.next_action.sleep if state.next_action else 0.0
        exc = state.outcome.exception() if state.outcome else None
        log.warning("%s (attempt %d/%d); retrying in %.2fs", exc, state.attempt_number, self.retry.attempts, pause)

    def _wait(self, op: compute_v1.Operation, what: str, *, zone: str | None = None) -> compute_v1.Operation:
        """Poll with operations.wait (each call returns when DONE or after ~2 min) until DONE (blocking calls only)."""
        if op.status == compute_v1.Operation.Status.DONE:
            return op
        waiting = Retrying(retry=retry_if_result(lambda o: o.status != compute_v1.Operation.Status.DONE),
                           stop=stop_after_delay(self.retry.operation_timeout_s), retry_error_callback=lambda _: None)
        done: compute_v1.Operation | None = waiting(
            self._call, f"{what} (waiting for {op.name})", partial(self._wait_once, op.name, zone), zone=zone)
        if done is None:
            raise TransientError(f"{what}: operation {op.name} not done after {self.retry.operation_timeout_s:.0f}s",
                                 zone=zone)
        return done

    def _wait_once(self, operation: str, zone: str | None) -> compute_v1.Operation:
        timeout = self.retry.wait_call_timeout_s
        if zone is not None:
            return self._zone_ops.wait(
                project=self.project, zone=zone, operation=operation, retry=None, timeout=timeout
            )
        return self._global_ops.wait(project=self.project, operation=operation, retry=None, timeout=timeout)

def _firewall_key(rule: compute_v1.Firewall) -> tuple[Any, ...]:
    """The fields ``ensure_cluster_firewall`` owns; a difference means the rule must be updated."""
    allowed = sorted((a.I_p_protocol, tuple(sorted(a.ports))) for a in rule.allowed)
    return (
        rule.direction or "INGRESS",
        allowed,
        sorted(rule.source_ranges),
        sorted(rule.source_tags),
        sorted(rule.target_tags),
        last_segment(rule.network or "default"),
    )
