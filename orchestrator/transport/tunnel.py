"""A reverse SSH port forward: a port on the instance's loopback that reaches a port on this machine's.

What a job's remote workers reach the controller's torchft Lighthouse through (control/lighthouse.py): the
Lighthouse listens on the controller's loopback, which a cloud VM cannot reach (the controller may sit behind a
NAT, and a training port is never opened to the internet), so each worker gets a port on its own loopback that
OpenSSH's client carries back over the SSH login the controller already has. OpenSSH's ``ssh -N -R`` rather than a
paramiko forward: it is a process of its own (it outlives a daemon that is killed, and a later daemon finds it by
its log path in /proc), with keep-alives and its exit on a lost server built in.

The argv is a list (no shell); the key is a file (0600) named by path, never on the command line; the server's
host key is pinned as every connection's is (``host_keys.expected_keys``), through a known_hosts file of those
keys alone.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from orchestrator.transport.base import Endpoint, FatalTransportError
from orchestrator.transport.host_keys import expected_keys, known_hosts_name

# DEBUG1: the log says when the server accepted the forward and which port a `-R 0` was given (one line each, and
# the server's rare keep-alive requests). A lost server ends the forward
# after about 15 s (3 keep-alives 5 s apart unanswered); a refused forward ends it at once (ExitOnForwardFailure),
# so a process that runs is a forward that holds.
OPTIONS = ("-N", "-o", "LogLevel=DEBUG1", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes",
           "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "StrictHostKeyChecking=yes",
           "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=15")
_ALLOCATED = re.compile(rb"Allocated port (\d+) for remote forward to 127\.0\.0\.1:(\d+)")
_ACCEPTED = re.compile(rb"remote forward success for: listen 127\.0\.0\.1:(\d+), connect 127\.0\.0\.1:(\d+)")


class NoSshClient(FatalTransportError):
    """OpenSSH's client is not installed on the controller."""


def ssh_binary() -> str:
    found = shutil.which("ssh")
    if found is None:
        raise NoSshClient("torchft replica groups on remote workers reach their Lighthouse through OpenSSH's client, "
                          "and `ssh` is not on PATH; install it (Debian/Ubuntu: apt-get install openssh-client)")
    return found


def write_known_hosts(ep: Endpoint, path: Path) -> Path:
    """A known_hosts file that lists only the keys ``ep``'s server may show (raises HostKeyPending while a VM has
    published none yet)."""
    keys, _ = expected_keys(ep)
    name = known_hosts_name(ep.host, ep.port)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{name} {k.get_name()} {k.get_base64()}\n" for k in keys))
    return path


def reverse_forward_argv(ep: Endpoint, *, local_port: int, remote_port: int, known_hosts: Path,
                         log: Path) -> list[str]:
    """``ssh`` that opens ``remote_port`` (0: the server picks one, written to ``log``) on the instance's loopback
    and carries it to ``local_port`` on this machine's loopback."""
    if ep.key_path is None:
        raise FatalTransportError(f"no SSH key for {ep.host}: a reverse forward logs in with the job's key")
    argv = [ssh_binary(), *OPTIONS, "-o", f"UserKnownHostsFile={known_hosts}", "-E", str(log),
            "-i", ep.key_path, "-p", str(ep.port), "-R", f"127.0.0.1:{remote_port}:127.0.0.1:{local_port}"]
    if ep.user:
        argv += ["-l", ep.user]
    return [*argv, "--", ep.host]  # "--": a host is never read as an option


def allocated_port(log_text: bytes, local_port: int, asked: int = 0) -> int | None:
    """The remote port the server gave the forward to ``local_port``, once it accepted it, or None: ``asked`` itself,
    or for ``-R 0`` (``asked`` 0) the one OpenSSH logs it was given."""
    accepted = [int(m.group(1)) for m in _ACCEPTED.finditer(log_text) if int(m.group(2)) == local_port]
    if asked:
        return asked if asked in accepted else None
    found = [int(m.group(1)) for m in _ALLOCATED.finditer(log_text) if int(m.group(2)) == local_port]
    return found[-1] if found and 0 in accepted else None
