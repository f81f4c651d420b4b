"""The local task port and the tests' servers take a port below the kernel's ephemeral range, where no outgoing
connection's source port can take it between the pick and the server's bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from orchestrator.providers import ports


def test_a_port_is_free_and_below_the_ephemeral_range() -> None:
    low = ports.ephemeral_low()
    picked = {ports.free_port() for _ in range(20)}
    assert all(ports.LOWEST <= p < low for p in picked) and len(picked) > 1
    for p in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_listened_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.LOWEST))
        taken.listen()
        answers = iter(range(ports.LOWEST, ports.LOWEST + ports.TRIES))  # the listened one first
        monkeypatch.setattr(ports.random.SystemRandom, "randrange", lambda self, a, b: next(answers))
        assert ports.free_port() > ports.LOWEST


def test_the_range_is_read_from_the_kernel_and_a_narrow_one_falls_back(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("20500\t60999\n")
    assert ports.ephemeral_low(setting) == 20500
    assert ports.ephemeral_low(tmp_path / "missing") == 49152
    monkeypatch.setattr(ports, "ephemeral_low", lambda: 20500)  # no room below: the kernel's own pick
    assert ports.free_port() > 20500  # the kernel's ephemeral range (32768 and up by default)
