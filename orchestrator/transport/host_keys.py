"""SSH host keys, pinned: a connection goes on only if the server shows a key we already know for it.

Where the expected keys come from:

- an inventory host: its ``known_hosts`` file (the inventory's ``known_hosts`` field, else
  ``~/.ssh/known_hosts``), looked up as OpenSSH does (``host`` on port 22, ``[host]:port`` otherwise,
  hashed entries included);
- a GCE VM: the keys its guest agent publishes in the instance's guest attributes (``hostkeys/``), read
  through the Compute API (an authenticated channel, unlike the first SSH packet), given to the
  ``Endpoint`` as ``host_key_source``.

An unknown or different key is refused with the fix in the message: a man in the middle (or a recycled
address) must not receive the job's commands, data or credentials.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Iterable
from pathlib import Path

import paramiko

from orchestrator.transport.base import Endpoint, FatalTransportError, TransportError

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


class HostKeyError(FatalTransportError):
    """The server's host key is not the one we expected (or we have none to compare with)."""


class HostKeyPending(TransportError):
    """No host key is published for the instance yet (a booting VM): try again."""


def known_hosts_name(host: str, port: int) -> str:
    """How OpenSSH names a host in ``known_hosts``."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...`` as ``ssh-keygen -l`` prints it."""
    return str(key.fingerprint)


def parse_key(line: str) -> paramiko.PKey:
    """A public key from ``ssh-ed25519 AAAA... [comment]`` (or ``TYPE BASE64`` without a comment)."""
    parts = line.split()
    if len(parts) < 2:
        raise ValueError(f"not a public key line: {line[:40]!r}")
    try:
        blob = base64.b64decode(parts[1], validate=True)
        return paramiko.PKey.from_type_string(parts[0], blob)
    except (binascii.Error, paramiko.SSHException, ValueError) as e:
        raise ValueError(f"not a {parts[0]} public key: {e}") from None


def known_hosts_keys(path: str, host: str, port: int) -> list[paramiko.PKey]:
    """The keys ``path`` lists for ``host:port`` (none if the file or the entry is missing)."""
    file = Path(os.path.expanduser(path))
    if not file.exists():
        return []
    try:
        keys = paramiko.HostKeys(str(file))
    except (OSError, paramiko.SSHException) as e:
        raise HostKeyError(f"cannot read known_hosts file {file}: {e}") from None
    found = keys.lookup(known_hosts_name(host, port))
    return list(found.values()) if found else []


def expected_keys(ep: Endpoint) -> tuple[list[paramiko.PKey], str]:
    """(the keys ``ep``'s server may show, where they came from). Raises HostKeyPending while a VM's
    guest agent has not published its keys yet."""
    if ep.host_keys or ep.host_key_source is not None:
        lines: Iterable[str] = ep.host_keys or ()
        if ep.host_key_source is not None:
            lines = [*lines, *ep.host_key_source()]
        try:
            keys = [parse_key(line) for line in lines]
        except ValueError as e:
            raise HostKeyError(f"{ep.host}:{ep.port}: bad pinned host key: {e}") from None
        if not keys:
            raise HostKeyPending(f"no SSH host key published yet for {ep.host}:{ep.port}")
        return keys, "the instance's published host keys"
    path = ep.known_hosts or DEFAULT_KNOWN_HOSTS
    return known_hosts_keys(path, ep.host, ep.port), f"known_hosts file {os.path.expanduser(path)}"


def _fix(ep: Endpoint) -> str:
    path = os.path.expanduser(ep.known_hosts or DEFAULT_KNOWN_HOSTS)
    return (f"check the fingerprint with the host's owner, then add it (ssh-keyscan -p {ep.port} {ep.host} >> "
            f"{path}) or point the inventory's known_hosts field at a file that lists it")


class _RejectUnknown(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko is untyped
    """Called by paramiko only when no key at all is known for the host name."""

    def __init__(self, ep: Endpoint, source: str) -> None:
        self.ep, self.source = ep, source

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyError(f"host key of {hostname} ({key.get_name()} {fingerprint(key)}) is unknown: "
                           f"the {self.source} has no entry for it; {_fix(self.ep)}")


def pin(client: paramiko.SSHClient, ep: Endpoint) -> str:
    """Make ``client`` accept only ``ep``'s expected host keys (paramiko compares them, and prefers
    their key types in the negotiation). Returns where the keys came from, for error messages."""
    keys, source = expected_keys(ep)
    store = client.get_host_keys()
    store.clear()
    name = known_hosts_name(ep.host, ep.port)
    for key in keys:
        store.add(name, key.get_name(), key)
    client.set_missing_host_key_policy(_RejectUnknown(ep, source))
    return source


def mismatch(ep: Endpoint, exc: paramiko.BadHostKeyException, source: str) -> HostKeyError:
    """The one-line error for a server that shows a key other than the pinned one."""
    got, wanted = exc.key, exc.expected_key
    name = known_hosts_name(ep.host, ep.port)
    if ep.host_keys or ep.host_key_source is not None:
        pinned = source
        fix = "the instance publishes other keys: something answers in its place; check the network path"
    else:  # the file's path once, in the fix (the reason must fit one DB field)
        path = os.path.expanduser(ep.known_hosts or DEFAULT_KNOWN_HOSTS)
        pinned = "known_hosts"
        fix = (f"if its owner confirms the new key: ssh-keygen -R '{name}' -f {path}, then "
               f"ssh-keyscan -p {ep.port} {ep.host} >> that file")
    return HostKeyError(
        f"host key of {name} does not match: it shows {got.get_name()} {fingerprint(got)}, {pinned} pins "
        f"{fingerprint(wanted)}; refusing to connect (a man in the middle, or a reinstalled host); {fix}")
