"""Which credentials the GCE clients use: ADC by default, a key file, or anonymous for an emulator."""

from __future__ import annotations

import os

import google.auth
from google.auth import exceptions as auth_exc
from google.auth.credentials import AnonymousCredentials, Credentials
from google.oauth2 import service_account

from orchestrator.providers.gce.errors import AUTH_HINT, GceCredentialsError
from orchestrator.providers.gce.requests import CLOUD_PLATFORM_SCOPE


def load_credentials(
    credentials: Credentials | str | os.PathLike[str] | None, api_endpoint: str | None, project: str
) -> Credentials:
    """ADC by default, a key file if a path is given, anonymous for an emulator endpoint."""
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
                f"cannot load service-account key file {path} ({type(exc).__name__}); "
                + AUTH_HINT.format(project=project)
            ) from None
    if api_endpoint:
        return AnonymousCredentials()  # type: ignore[no-untyped-call]
    try:
        creds, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except auth_exc.DefaultCredentialsError:
        raise GceCredentialsError("no Google credentials found: " + AUTH_HINT.format(project=project)) from None
    return creds
