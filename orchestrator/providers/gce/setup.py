"""Is this machine set up to launch on GCE? Checked before a job row is written (``launch``, ``--dry-run``).

In order, each failure one line naming what is missing and the fix: the project id is well-formed;
credentials are found (``provider.credentials``, ``GOOGLE_APPLICATION_CREDENTIALS`` or gcloud's
application-default login, through ``google.auth.default``; none for a loopback ``api_endpoint``, which is
called anonymously);
and, for a launch, one ``projects.get`` with them: rejected credentials, a missing permission, an unknown
project or a disabled Compute API are refused there, before anything is created. An API that does not
answer is not a refusal (the launch's own calls retry and report it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from orchestrator.model.cloud_errors import ProviderError
from orchestrator.model.errors import UserError
from orchestrator.model.spec import GceProvider as GceSpec
from orchestrator.model.spec.provider import loopback_endpoint
from orchestrator.providers.base import Provider

log = logging.getLogger(__name__)
# Google's rule: 6-30 lowercase letters, digits or hyphens, starting with a letter, not ending with a hyphen;
# legacy domain-scoped ids carry a "domain:" prefix.
PROJECT_ID = re.compile(r"^(?:[a-z0-9][a-z0-9.-]{0,61}[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")
LOGIN_FIX = ("run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS (or "
             "provider.credentials) to a service-account key file; nothing was created")
PROBE_TIMEOUT_S = 20.0


def check_setup(spec: GceSpec, provider: Callable[[], Provider] | None) -> None:
    """Raise a one-line UserError if a gce launch of ``spec`` cannot work on this machine as set up."""
    if not PROJECT_ID.match(spec.project):
        raise UserError(f"provider.project: {spec.project!r} is not a Google Cloud project id",
                        hint="6-30 lowercase letters, digits or hyphens, starting with a letter "
                             "(`gcloud projects list` shows yours); nothing was created")
    _check_credentials(spec)
    if provider is not None:
        _probe(provider())


def _check_credentials(spec: GceSpec) -> None:
    if loopback_endpoint(spec.api_endpoint):
        return  # called with anonymous credentials (the spec refuses a key file beside it)
    if spec.credentials is not None:
        path = spec.credentials.expanduser()
        if not path.is_file():
            raise UserError(f"provider.credentials: {path} is not a file", hint=LOGIN_FIX)
        from orchestrator.providers.gce.credentials import load_credentials  # google-auth: gce only

        load_credentials(path, spec.project)  # a key file that does not parse: one line, no key material
        return
    import google.auth  # google-auth (~0.2 s): only for gce specs
    from google.auth import exceptions as auth_exc  # with it

    try:
        google.auth.default()
    except auth_exc.DefaultCredentialsError:
        raise UserError(f"no Google credentials found for gce project {spec.project} (provider.credentials, "
                        "GOOGLE_APPLICATION_CREDENTIALS and gcloud's application-default login are all unset)",
                        hint=LOGIN_FIX) from None


def _probe(provider: Provider) -> None:
    """One ``projects.get``, one attempt: the credentials, the permission and the project, as the API sees them."""
    from orchestrator.providers.gce.errors import map_exception  # a gce launch only
    from orchestrator.providers.gce.provider import GceProvider  # with it

    if not isinstance(provider, GceProvider):
        return
    api = provider.api
    try:
        api.projects.get(project=api.project, retry=None, timeout=PROBE_TIMEOUT_S)
    except Exception as exc:
        error = map_exception(exc, f"read project {api.project}", None, api.project)
        if error is None:
            raise
        if isinstance(error, UserError):  # credentials rejected, permission denied, no such project / API off
            raise error from None
        log.warning("could not check the gce project's set-up (%s); going on", _short(error))


def _short(error: ProviderError) -> str:
    return error.message.splitlines()[0][:200]
