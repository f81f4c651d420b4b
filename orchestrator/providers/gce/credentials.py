"""Which credentials the GCE clients use: ADC by default, or a key file; anonymous only under the test setting.

Credentials are never inferred from an endpoint: a custom ``api_endpoint`` (a regional endpoint, a proxy)
gets the user's own credentials like the default one. Anonymous credentials, and VMs reached at this
machine's loopback address, come only from the explicit test setting (providers/gce/test_setting.py), which the
tests and orchestrator_testing set when they talk to the Compute API emulator.
"""

from __future__ import annotations

import os

import google.auth
from google.auth import exceptions as auth_exc
from google.auth.credentials import AnonymousCredentials, Credentials
from google.oauth2 import service_account

from orchestrator.providers.gce.errors import AUTH_HINT, GceCredentialsError
from orchestrator.providers.gce.requests import CLOUD_PLATFORM_SCOPE
from orchestrator.providers.gce.test_setting import emulator_mode


def load_credentials(credentials: Credentials | str | os.PathLike[str] | None, project: str) -> Credentials:
    """A Credentials object as given, a key file if a path is given, anonymous under the test setting, else ADC."""
    if isinstance(credentials, Credentials):
        return credentials
    if credentials is not None:
        path = os.fspath(credentials)
        try:
            loaded: Credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                path, scopes=[CLOUD_PLATFORM_SCOPE]
            )
            return loaded
        except (OSError, ValueError, auth_exc.GoogleAuthError) as exc:
            # Only the exception type: a parse error message could quote the key file.
            raise GceCredentialsError(
                f"provider.credentials: cannot load service-account key file {path} ({type(exc).__name__}); "
                + AUTH_HINT.format(project=project)
            ) from None
    if emulator_mode():
        return AnonymousCredentials()  # type: ignore[no-untyped-call]
    try:
        creds, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except auth_exc.DefaultCredentialsError:
        raise GceCredentialsError("no Google credentials found: " + AUTH_HINT.format(project=project)) from None
    return creds
