"""A throwaway service-account key, as Application Default Credentials find it (GOOGLE_APPLICATION_CREDENTIALS).

Made fresh (an RSA key no Google project knows), so a test has the credentials a user's machine would, and a
call that carried them anywhere would show it. Calls to a loopback endpoint never carry them.
"""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

PROJECT = "throwaway-project"
EMAIL = f"caller@{PROJECT}.iam.gserviceaccount.com"


def write_key(path: Path) -> Path:
    """Write a service-account key file at ``path`` (0600); its token endpoint refuses (loopback port 9)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path.touch(mode=0o600)
    path.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "1", "private_key": pem,
        "client_email": EMAIL, "client_id": "1", "token_uri": "http://127.0.0.1:9/token"}))
    return path
