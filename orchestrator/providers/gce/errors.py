r"""How the GCE provider maps what the Compute API says into the typed ``ProviderError``\ s of model.cloud_errors.

Errors reach the provider two ways: as HTTP errors from a call, and (real stockouts, most quota failures) as
errors on a DONE operation; both are mapped here. Errors the user fixes (credentials, permissions, an unknown
project) are also ``UserError``\ s whose one line says how.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc

from orchestrator.model.cloud_errors import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaError,
    TransientError,
)
from orchestrator.model.errors import UserError
from orchestrator.providers.gce.compute_api import compute_v1

AUTH_HINT = (
    "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file or run "
    "`gcloud auth application-default login`; the account needs roles/compute.instanceAdmin.v1 "
    "(and roles/iam.serviceAccountUser to attach the VMs' service account) on project {project}"
)
_QUOTA_RE = re.compile(
    r"Quota '(?P<metric>[A-Za-z0-9_]+)' exceeded\.\s*Limit:\s*[\d.]+\s*"
    r"(?:in region (?P<region>[a-z0-9-]+)|globally)?"
)
# 400/403 reasons that mean "not now" rather than "never".
_RETRYABLE_REASONS = {"resourceNotReady", "rateLimitExceeded", "userRateLimitExceeded", "backendError"}
_RETRYABLE_OP_CODES = {
    "RESOURCE_OPERATION_RATE_EXCEEDED",
    "RATE_LIMIT_EXCEEDED",
    "INTERNAL_ERROR",
    "RESOURCE_NOT_READY",
}


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


class GceCredentialsError(AuthError, UserError):
    """No usable Google credentials (none found, a bad key file, or rejected): the message says how to log in."""


class GcePermissionError(AuthError, UserError):
    """The credentials work but lack a permission on the project (HTTP 403): the message names the role."""


class GceProjectError(InvalidRequestError, UserError):
    """The project does not exist or the Compute API is not enabled in it: the message says what to check."""


_PROJECT_HINT = (
    "check provider.project ({project}): it must be an existing project id (not its name or number) with the "
    "Compute Engine API enabled (`gcloud services enable compute.googleapis.com --project {project}`)"
)


def map_exception(exc: Exception, what: str, zone: str | None, project: str) -> ProviderError | None:
    """The typed error for an exception from the client; None for anything that is not the cloud's."""
    if isinstance(exc, auth_exc.TransportError | gexc.RetryError) or getattr(exc, "retryable", False):
        return TransientError(f"{what}: {type(exc).__name__}: {exc}", zone=zone)
    if isinstance(exc, auth_exc.GoogleAuthError):
        # e.g. a 401 made google-auth refresh the token, and the refresh failed.
        return GceCredentialsError(
            f"{what}: credentials rejected ({type(exc).__name__}): "
            + AUTH_HINT.format(project=project),
            zone=zone,
        )
    if isinstance(exc, gexc.GoogleAPICallError):
        return _map_http_error(exc, what, zone, project)
    if isinstance(exc, OSError):  # requests' ConnectionError / Timeout derive from OSError
        return TransientError(f"{what}: {type(exc).__name__}: {exc}", zone=zone)
    return None

def _map_http_error(exc: gexc.GoogleAPICallError, what: str, zone: str | None, project: str) -> ProviderError:
    code = int(exc.code or 0)
    reasons = {e.get("reason") for e in exc.errors or () if isinstance(e, Mapping)}
    message = f"{what}: HTTP {code}: {exc.message}"
    if "quotaExceeded" in reasons or _QUOTA_RE.search(exc.message or ""):
        return _quota_error(message, exc.message or "", zone)
    if code == 429 or code >= 500 or reasons & _RETRYABLE_REASONS:
        return TransientError(message, zone=zone)
    return _user_error(code, message, exc.message or "", zone, project) or InvalidRequestError(message, zone=zone)

def _user_error(code: int, message: str, text: str, zone: str | None, project: str) -> ProviderError | None:
    """401 / 403 / unknown project: errors the user fixes, as one line that says how."""
    if code == 401:
        return GceCredentialsError(f"{message}; " + AUTH_HINT.format(project=project), zone=zone)
    if code == 404 and re.search(rf"projects/{re.escape(project)}'? (was )?not found", text):
        return GceProjectError(f"{message}; " + _PROJECT_HINT.format(project=project), zone=zone)
    if code == 403:
        if "has not been used" in text or "is disabled" in text or "not found" in text.lower():
            return GceProjectError(f"{message}; " + _PROJECT_HINT.format(project=project), zone=zone)
        return GcePermissionError(f"{message}; " + AUTH_HINT.format(project=project), zone=zone)
    return None

def _quota_error(message: str, text: str, zone: str | None, metric: str = "") -> QuotaError:
    m = _QUOTA_RE.search(text)
    if m is not None:
        metric = m["metric"]
    region = (m["region"] if m is not None and m["region"] else None) or (
        "global" if "globally" in text else (region_of(zone) if zone else "global")
    )
    return QuotaError(message, zone=zone, region=region, metric=metric)

def op_has_code(op: compute_v1.Operation, code: str) -> bool:
    return any(e.code == code for e in op.error.errors)

def operation_error(
    op: compute_v1.Operation, what: str, project: str, *, zone: str | None = None, resource: str = ""
) -> ProviderError | None:
    """The typed error a DONE operation carries, or None if it succeeded."""
    errors = list(op.error.errors)
    if not errors:
        return None
    codes = [e.code for e in errors]
    text = "; ".join(f"{e.code}: {e.message}" for e in errors)
    message = f"{what}: {text}"
    if any(c.startswith("ZONE_RESOURCE_POOL_EXHAUSTED") for c in codes) and zone is not None:
        return CapacityError(message, zone=zone, resource=resource)
    if "QUOTA_EXCEEDED" in codes:
        metric = next(
            (
                d.quota_info.metric_name
                for e in errors
                for d in e.error_details
                if d.quota_info.metric_name
            ),
            "",
        )
        return _quota_error(message, text, zone, metric=metric)
    status = op.http_error_status_code
    if (user := _user_error(status, message, text, zone, project)) is not None:
        return user
    if status == 429 or status >= 500 or set(codes) & _RETRYABLE_OP_CODES:
        return TransientError(message, zone=zone)
    return InvalidRequestError(message, zone=zone)
