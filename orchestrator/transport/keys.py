"""Per-job SSH keys: one ed25519 pair per job, so deleting the job revokes exactly its own access."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from orchestrator.model.paths import user_dir

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PRIVATE_NAME = "id_ed25519"


def generate_keypair(comment: str) -> tuple[bytes, str]:
    """A new ed25519 key: (OpenSSH private key bytes, ``ssh-ed25519 AAAA... comment`` public line)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, f"{public.decode()} {comment}"


def write_private(path: Path, data: bytes) -> None:
    """Write a secret with mode 0600 from the first byte (never world-readable, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)  # O_CREAT's mode is filtered by the umask and ignored for an existing file
    tmp.replace(path)


def _key_dir(job_id: str) -> Path:
    if not _JOB_ID.match(job_id):
        raise ValueError(f"job id {job_id!r} cannot name a key directory")
    return user_dir() / "keys" / job_id


def job_key(job_id: str) -> tuple[Path, str]:
    """The job's key pair, created on first use: (private key path, public key line)."""
    d = _key_dir(job_id)
    private, public = d / PRIVATE_NAME, d / f"{PRIVATE_NAME}.pub"
    if private.exists() and public.exists():
        return private, public.read_text().strip()
    d.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    d.mkdir(mode=0o700, exist_ok=True)
    # Two controllers racing must not each hand out a different key for the same job.
    with (d / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if private.exists() and public.exists():
            return private, public.read_text().strip()
        data, line = generate_keypair(f"orchestrator-{job_id}")
        write_private(private, data)
        tmp = public.with_name(f".{public.name}.tmp{os.getpid()}")
        tmp.write_text(line + "\n")
        tmp.replace(public)  # the public file last: its presence means the pair is complete
        return private, line


def delete_job_key(job_id: str) -> None:
    """Forget the job's key (missing is fine)."""
    shutil.rmtree(_key_dir(job_id), ignore_errors=True)
