"""One project's Compute API clients, and the one way every call is made.

Every call goes through ``GceApi.call``: the client's own retries are switched off (``retry=None``) so that
one bounded exponential backoff applies everywhere and every failure surfaces as a typed ``ProviderError``.
Operations are polled with ``ZoneOperationsClient.wait`` / ``GlobalOperationsClient.wait`` rather than
``.result()``, whose internal polling client ignores a custom ``api_endpoint``. Real stockouts and most
quota failures arrive as errors on a DONE operation, not as HTTP errors, so both paths are mapped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any, TypeVar

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import Credentials
from google.auth.transport.requests import AuthorizedSession
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from orchestrator.model.cloud_errors import ProviderError, TransientError
from orchestrator.model.errors import UserError
from orchestrator.model.spec.provider import check_api_endpoint, loopback_endpoint
from orchestrator.providers.gce.compute_api import compute_v1, compute_v1beta
from orchestrator.providers.gce.credentials import load_credentials
from orchestrator.providers.gce.errors import map_exception, op_has_code, operation_error

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
    # Quota reads are a courtesy check before launch (a failure is one warning): retry once, not for ~15 s.
    quota_read_attempts: int = 2


CLIENTS = ("instances", "zone_ops", "global_ops", "firewalls", "images", "regions", "projects", "advice")
DEFAULT_ENDPOINT = "https://compute.googleapis.com"


class GceApi:
    """One project's clients, each built at its first call, and a session for the JSON reads (the credentials
    go to them only, never logged)."""

    def __init__(self, project: str, credentials: Credentials | str | os.PathLike[str] | None,
                 api_endpoint: str | None, retry: RetrySettings | None = None) -> None:
        self.project = project
        self.retry = retry or RetrySettings()
        if api_endpoint:  # a spec's is checked when it is read; this guards every other caller too
            try:
                check_api_endpoint(api_endpoint)
            except ValueError as exc:
                raise UserError(f"provider.api_endpoint: {exc}") from None
        self._kwargs: dict[str, Any] = {"credentials": load_credentials(credentials, project,
                                                                        anonymous=loopback_endpoint(api_endpoint))}
        if api_endpoint:
            self._kwargs["client_options"] = ClientOptions(api_endpoint=api_endpoint)
        # where the clients' REST transport sends (a bare host means https)
        endpoint = api_endpoint or DEFAULT_ENDPOINT
        self._base = endpoint if "://" in endpoint else f"https://{endpoint}"

    @cached_property
    def instances(self) -> compute_v1.InstancesClient:
        return compute_v1.InstancesClient(**self._kwargs)

    @cached_property
    def zone_ops(self) -> compute_v1.ZoneOperationsClient:
        return compute_v1.ZoneOperationsClient(**self._kwargs)

    @cached_property
    def global_ops(self) -> compute_v1.GlobalOperationsClient:
        return compute_v1.GlobalOperationsClient(**self._kwargs)

    @cached_property
    def firewalls(self) -> compute_v1.FirewallsClient:
        return compute_v1.FirewallsClient(**self._kwargs)

    @cached_property
    def images(self) -> compute_v1.ImagesClient:
        return compute_v1.ImagesClient(**self._kwargs)

    @cached_property
    def regions(self) -> compute_v1.RegionsClient:
        return compute_v1.RegionsClient(**self._kwargs)

    @cached_property
    def projects(self) -> compute_v1.ProjectsClient:
        return compute_v1.ProjectsClient(**self._kwargs)

    @cached_property
    def advice(self) -> compute_v1beta.AdviceClient:
        # advice.capacity for SPOT answers only on the beta API (Public Preview): providers/gce/advice.py
        return compute_v1beta.AdviceClient(**self._kwargs)

    @cached_property
    def _session(self) -> AuthorizedSession:
        return AuthorizedSession(self._kwargs["credentials"])  # type: ignore[no-untyped-call]

    def _clients(self) -> tuple[Any, ...]:
        """Every client (each built now if it was not yet)."""
        return tuple(getattr(self, name) for name in CLIENTS)

    def close(self) -> None:
        for name in (*CLIENTS, "_session"):
            built = self.__dict__.get(name)  # only what was built
            if built is not None:
                (built if name == "_session" else built.transport).close()

    def widen_pools(self, connections: int) -> None:
        """As many kept-alive connections as background threads (requests keeps 10 per host by default)."""
        for client in (self.instances, self.zone_ops, self.global_ops, self.firewalls):
            session = getattr(client.transport, "_session", None)  # a requests.Session (google-auth's)
            if session is not None and hasattr(session, "get_adapter"):
                for scheme in ("http://", "https://"):
                    adapter = type(session.get_adapter(scheme))  # requests' HTTPAdapter, sized up
                    session.mount(scheme, adapter(pool_connections=4, pool_maxsize=connections))

    def read(self, what: str, path: str, *, attempts: int | None = None) -> dict[str, Any]:
        """GET ``compute/v1/<path>`` as the API's JSON over google-auth's session: the REST call a client makes,
        without the client package (quota reads before a launch and its dry run); errors map as ``call``'s."""

        def get() -> dict[str, Any]:
            response = self._session.get(f"{self._base}/compute/v1/{path}", timeout=self.retry.request_timeout_s)
            if response.status_code >= 400:
                raise gexc.from_http_response(response)  # type: ignore[no-untyped-call]  # as the client's transport
            found: dict[str, Any] = response.json()
            return found

        return self.call(what, get, attempts=attempts)

    def kw(self) -> dict[str, Any]:
        """The per-call arguments: no client retries (``call`` retries), the request timeout."""
        return {"retry": None, "timeout": self.retry.request_timeout_s}

    def call(self, what: str, fn: Callable[[], T], *, zone: str | None = None,
             passthrough: tuple[type[Exception], ...] = (), attempts: int | None = None) -> T:
        """Run one API call with bounded exponential backoff (tenacity) on retryable errors; map the rest.
        ``attempts``: at most this many tries (default: the settings')."""
        attempts = min(attempts or self.retry.attempts, self.retry.attempts)

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
            stop=stop_after_attempt(attempts),
            wait=wait_random_exponential(multiplier=self.retry.initial_backoff_s, max=self.retry.max_backoff_s),
            retry=retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
            before_sleep=self._log_retry, reraise=True)
        try:
            return retrying(once)
        except ProviderError as error:
            if not error.retryable or isinstance(error, passthrough):
                raise
            raise TransientError(f"{error.message} (gave up after {attempts} attempts)",
                                 zone=zone) from error

    def _log_retry(self, state: RetryCallState) -> None:
        pause = state.next_action.sleep if state.next_action else 0.0
        exc = state.outcome.exception() if state.outcome else None
        log.warning("%s (attempt %d/%d); retrying in %.2fs", exc, state.attempt_number, self.retry.attempts, pause)

    def wait(self, op: compute_v1.Operation, what: str, *, zone: str | None = None) -> compute_v1.Operation:
        """Poll with operations.wait (each call returns when DONE or after ~2 min) until DONE (blocking calls only)."""
        if op.status == compute_v1.Operation.Status.DONE:
            return op
        waiting = Retrying(retry=retry_if_result(lambda o: o.status != compute_v1.Operation.Status.DONE),
                           stop=stop_after_delay(self.retry.operation_timeout_s), retry_error_callback=lambda _: None)
        done: compute_v1.Operation | None = waiting(
            self.call, f"{what} (waiting for {op.name})", partial(self._wait_once, op.name, zone), zone=zone)
        if done is None:
            raise TransientError(f"{what}: operation {op.name} not done after {self.retry.operation_timeout_s:.0f}s",
                                 zone=zone)
        return done

    def _wait_once(self, operation: str, zone: str | None) -> compute_v1.Operation:
        timeout = self.retry.wait_call_timeout_s
        if zone is not None:
            return self.zone_ops.wait(project=self.project, zone=zone, operation=operation, retry=None,
                                      timeout=timeout)
        return self.global_ops.wait(project=self.project, operation=operation, retry=None, timeout=timeout)

    def finish(self, op: compute_v1.Operation, what: str, *, zone: str | None = None, resource: str = "",
               fine: str | None = None) -> None:
        """Wait for ``op`` and raise the error it ended with (an error coded ``fine`` counts as success)."""
        done = self.wait(op, what, zone=zone)
        error = operation_error(done, what, self.project, zone=zone, resource=resource)
        if error is not None and not (fine is not None and op_has_code(done, fine)):
            raise error

    def quotas(self, region: str | None) -> dict[str, tuple[float, float]]:
        """metric -> (limit, usage) of one region (``regions.get``) or, for None, of the project (``projects.get``)."""
        if region is None:
            found = self.read("read the project's global quotas", f"projects/{self.project}",
                              attempts=self.retry.quota_read_attempts)
        else:
            found = self.read(f"read the quotas of region {region}", f"projects/{self.project}/regions/{region}",
                              attempts=self.retry.quota_read_attempts)
        return {q["metric"]: (float(q.get("limit", 0.0)), float(q.get("usage", 0.0)))
                for q in found.get("quotas", [])}
