"""A free TCP port on this machine for a server that binds it a little later (a local task, a test's sshd).

Binding port 0 picks from the kernel's ephemeral range, the same range every outgoing connection takes its source
port from, so between the pick and the server's own bind any client on the machine (a database connection, a
storage call) can take the port. A port below that range is never handed out as a source port: only another
listener can take it, and each pick is random, so two jobs picking at once rarely meet.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # above the well-known and registered services a developer's machine usually runs
TRIES = 64


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range (Linux default 32768; IANA's 49152 where unreadable)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def _binds(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, below the ephemeral range where there is room (else the kernel's pick)."""
    low = ephemeral_low()
    pick = random.SystemRandom()
    if low - LOWEST >= 1024:
        for _ in range(TRIES):
            port = pick.randrange(LOWEST, low)
            if _binds(host, port):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
