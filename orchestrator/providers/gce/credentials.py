"""Which credentials the GCE clients use: ADC by default, or a key file; anonymous for a loopback endpoint.

The endpoint decides whether credentials are sent at all (model/spec/provider.py ``check_api_endpoint``): the
user's go only over https to a Google API host; a Compute API on this machine's loopback (http://127.0.0.1:PORT)
is called with anonymous credentials, so no bearer token ever reaches a port another local process could hold.
"""

from __future__ import annotations

import os

import google.auth
from google.auth import exceptions as auth_exc
from google.auth.credentials import AnonymousCredentials, Credentials
from google.oauth2 import service_account

from orchestrator.providers.gce.errors import AUTH_HINT, GceCredentialsError
from orchestrator.providers.gce.requests import CLOUD_PLATFORM_SCOPE


def load_credentials(credentials: Credentials | str | os.PathLike[str] | None, project: str,
                     anonymous: bool = False) -> Credentials:
    """Anonymous if ``anonymous`` (a loopback endpoint: nothing of the user's is read or sent), else a
    Credentials object as given, a key file if a path is given, else ADC."""
    if anonymous:
        return AnonymousCredentials()  # type: ignore[no-untyped-call]
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
    try:
        creds, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except auth_exc.DefaultCredentialsError:
        raise GceCredentialsError("no Google credentials found: " + AUTH_HINT.format(project=project)) from None
    return creds
