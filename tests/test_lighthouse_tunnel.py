"""A remote worker's way to the controller's torchft Lighthouse (control/lighthouse.reach, transport/tunnel.py),
against a real sshd on 127.0.0.1 and the real Lighthouse: a reverse forward per instance, found again rather than
doubled, started anew on the port it had, pinned to the server's host key, and gone when the job ends."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.control import lighthouse
from orchestrator.storage import open_storage
from orchestrator.storage.base import JobStorage
from orchestrator.transport.base import Endpoint, TransportError
from orchestrator.transport.keys import generate_keypair, write_private
from orchestrator_testing.sshd import Sshd

pytest.importorskip("torchft")
JOB = "tunnel-job-1"


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[tuple[Sshd, Endpoint]]:
    with Sshd(tmp_path / "sshd") as server:
        private, public = generate_keypair("job")
        key = tmp_path / "job_key"
        write_private(key, private)
        server.authorize(public)
        yield server, server.endpoint(workdir=str(tmp_path / "vm"), key_path=str(key))


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[JobStorage]:
    s = open_storage(str(tmp_path / "runs"), JOB)
    yield s
    lighthouse.stop(s)
    lighthouse.stop_tunnels(JOB)


def _answers(url: str, tries: int = 100) -> bool:
    """The Lighthouse's HTTP side answers through ``url``'s port (once it listens: it was just started)."""
    port = int(url.rsplit(":", 1)[1])
    for _ in range(tries):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(16).startswith(b"HTTP/"):
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def test_each_instance_gets_its_own_forward_found_again_and_restarted_on_its_port(
        sshd: tuple[Sshd, Endpoint], storage: JobStorage) -> None:
    _, ep = sshd
    own = lighthouse.ensure(storage)
    url = lighthouse.reach(storage, JOB, "vm-0", ep)
    assert url != own and _answers(url)  # a port of the "VM"'s loopback, carried to the Lighthouse's
    assert lighthouse.reach(storage, JOB, "vm-0", ep) == url and len(lighthouse._tunnels(JOB)) == 1
    other = lighthouse.reach(storage, JOB, "vm-1", ep)
    assert other != url and len(lighthouse._tunnels(JOB)) == 2
    # The forward dies (a network blip): the next reach starts it on the port the worker's task.json names.
    assert lighthouse.stop_tunnels(JOB, only="vm-0") == 1
    assert lighthouse.reach(storage, JOB, "vm-0", ep) == url and _answers(url)
    assert lighthouse.stop_tunnels(JOB) == 2 and lighthouse._tunnels(JOB) == {}


def test_a_server_showing_another_host_key_gets_no_forward(sshd: tuple[Sshd, Endpoint],
                                                           storage: JobStorage) -> None:
    server, ep = sshd
    _, stranger = generate_keypair("someone-else")
    wrong = Endpoint(workdir=ep.workdir, host=ep.host, port=ep.port, user=ep.user, key_path=ep.key_path,
                     host_keys=(stranger,))
    with pytest.raises(TransportError, match="ended at once"):
        lighthouse.reach(storage, JOB, "vm-0", wrong)
    assert lighthouse._tunnels(JOB) == {}
