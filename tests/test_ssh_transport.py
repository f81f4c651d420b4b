"""SshTransport against a real sshd on 127.0.0.1 (fails, never skips, when sshd is not installed)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.model.instances import ProcState, ProcStatus
from orchestrator.transport.base import Endpoint, TransportError
from orchestrator.transport.keys import delete_job_key, job_key
from orchestrator.transport.local import pid_alive
from orchestrator.transport.ssh import DROP_RETRIES, SshTransport, UnreachableError, remote_path
from orchestrator_testing.sshd import Sshd


@pytest.fixture(scope="module")
def sshd() -> Iterator[Sshd]:
    with Sshd() as server:
        yield server


@pytest.fixture(scope="module")
def transport() -> Iterator[SshTransport]:
    t = SshTransport(connect_timeout_s=3.0)
    yield t
    t.close()


@pytest.fixture
def ep(sshd: Sshd, tmp_path: Path) -> Endpoint:
    key, public = job_key("job1")
    sshd.authorize(public)
    return sshd.endpoint(workdir=str(tmp_path / "disk"), key_path=str(key))


def wait_status(t: SshTransport, ep: Endpoint, name: str, state: ProcState) -> ProcStatus:
    deadline = time.monotonic() + 10
    while True:
        st = t.status(ep, [name])[name]
        if st.state == state or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def test_job_key_is_private_and_stable() -> None:
    key, public = job_key("job-k")
    assert os.stat(key).st_mode & 0o777 == 0o600
    assert public.startswith("ssh-ed25519 ") and public.endswith(" orchestrator-job-k")
    assert job_key("job-k") == (key, public)
    delete_job_key("job-k")
    assert not key.exists()
    delete_job_key("job-k")  # missing is fine


def test_start_is_detached_status_stop_and_exit_code(transport: SshTransport, ep: Endpoint) -> None:
    transport.wait_reachable(ep, 10)
    assert Path(ep.workdir).is_dir()
    t0 = time.monotonic()
    transport.start(ep, "sleeper", ["sh", "-c", "sleep 60 & echo $! > child.pid; wait"])
    assert time.monotonic() - t0 < 3, "start must not wait for the process"
    st = transport.status(ep, ["sleeper", "never"])
    assert st == {"sleeper": ProcStatus(ProcState.RUNNING), "never": ProcStatus(ProcState.ABSENT)}
    pid = int((Path(ep.workdir) / "procs" / "sleeper.pid").read_text())
    transport.start(ep, "sleeper", ["true"])  # already running: a no-op
    assert int((Path(ep.workdir) / "procs" / "sleeper.pid").read_text()) == pid

    child_file = Path(ep.workdir) / "child.pid"
    deadline = time.monotonic() + 5
    while not child_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    child = int(child_file.read_text())
    transport.stop(ep, "sleeper")
    assert transport.status(ep, ["sleeper"])["sleeper"] == ProcStatus(ProcState.EXITED, -9)
    assert not pid_alive(child), "stop kills the whole process group"
    transport.stop(ep, "sleeper")  # not running: success
    transport.stop(ep, "never")

    transport.start(ep, "fails", ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert wait_status(transport, ep, "fails", ProcState.EXITED) == ProcStatus(ProcState.EXITED, 3)
    assert transport.read_log(ep, "fails") == b"out\nerr\n"
    transport.start(ep, "fails", ["true"])  # exited: starts again, with a fresh exit code
    assert wait_status(transport, ep, "fails", ProcState.EXITED) == ProcStatus(ProcState.EXITED, 0)


def test_env_log_offsets_and_missing_workdir(transport: SshTransport, ep: Endpoint) -> None:
    ep = replace(ep, env={"A": "from endpoint", "B": "x"})
    argv = ["sh", "-c", 'printf "%s|%s|" "$A" "$B"; printf "\\377\\n"']
    transport.start(ep, "env", argv, env={"B": "it's b"})
    assert wait_status(transport, ep, "env", ProcState.EXITED).exit_code == 0
    log = transport.read_log(ep, "env")
    assert log == b"from endpoint|it's b|\xff\n"  # bytes, not decoded text
    assert transport.read_log(ep, "env", 5) == log[5:]
    assert transport.read_log(ep, "env", 1000) == b""
    assert transport.read_log(ep, "nolog") == b""
    nowhere = replace(ep, workdir=ep.workdir + "-missing")
    assert transport.status(nowhere, ["env"]) == {"env": ProcStatus(ProcState.ABSENT)}
    assert transport.read_log(nowhere, "env") == b""
    transport.stop(nowhere, "env")
    with pytest.raises(ValueError):
        transport.start(ep, "bad name", ["true"])


def test_put_tree_file_and_write(transport: SshTransport, ep: Endpoint, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
    (src / "pkg" / "m.pyc").write_bytes(b"x")
    (src / "pkg" / "m.py").write_text("print('hi')\n")
    (src / "top.txt").write_text("top")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    for i in range(50):  # a payload of many small files goes in one round trip
        (src / "pkg" / f"f{i}.py").write_text(f"x = {i}\n")
    t0 = time.monotonic()
    transport.put(ep, src, "payload")
    elapsed = time.monotonic() - t0
    dest = Path(ep.workdir) / "payload"
    assert (dest / "pkg" / "m.py").read_text() == "print('hi')\n"
    assert (dest / "top.txt").read_text() == "top"
    assert len(list((dest / "pkg").glob("f*.py"))) == 50
    assert os.access(dest / "run.sh", os.X_OK)
    assert not (dest / "pkg" / "__pycache__").exists() and not (dest / "pkg" / "m.pyc").exists()
    assert elapsed < 5

    transport.put(ep, src / "top.txt", "a/b/renamed.txt")
    assert (Path(ep.workdir) / "a" / "b" / "renamed.txt").read_text() == "top"
    transport.put(ep, src, "payload")  # again: overwrites in place
    with pytest.raises(FileNotFoundError):
        transport.put(ep, src / "missing", "x")

    transport.write(ep, "cfg/task.json", '{"a": "ü"}')
    transport.write(ep, "cfg/task.json", '{"a": 2}')
    assert (Path(ep.workdir) / "cfg" / "task.json").read_text() == '{"a": 2}'
    assert sorted(p.name for p in (Path(ep.workdir) / "cfg").iterdir()) == ["task.json"]


def test_key_permissions_are_enforced(transport: SshTransport, ep: Endpoint) -> None:
    assert ep.key_path is not None
    os.chmod(ep.key_path, 0o644)
    try:
        with pytest.raises(TransportError, match="must be 0600"):
            SshTransport().status(ep, ["x"])
    finally:
        os.chmod(ep.key_path, 0o600)
    with pytest.raises(TransportError, match="does not exist"):
        SshTransport().status(replace(ep, key_path=ep.key_path + ".nope"), ["x"])


def test_unknown_key_and_unreachable_host(sshd: Sshd, tmp_path: Path) -> None:
    key, _ = job_key("not-authorized")
    t = SshTransport(connect_timeout_s=2.0)
    with pytest.raises(TransportError, match="authentication"):
        t.status(sshd.endpoint(str(tmp_path), str(key)), ["x"])

    dead = Sshd(tmp_path / "dead").start()
    port = dead.port
    dead.close()
    ep = Endpoint(workdir=str(tmp_path), host="127.0.0.1", port=port, user=sshd.user, key_path=str(key))
    t0 = time.monotonic()
    with pytest.raises(UnreachableError, match="not reachable within"):
        t.wait_reachable(ep, 1.0)
    assert time.monotonic() - t0 < 4
    with pytest.raises(TransportError, match="cannot connect"):
        t.status(ep, ["x"])


def test_connection_reused_and_reestablished_after_restart(tmp_path: Path) -> None:
    key, public = job_key("job2")
    with Sshd(tmp_path / "sshd") as server:
        server.authorize(public)
        ep = server.endpoint(str(tmp_path / "disk"), str(key))
        t = SshTransport(connect_timeout_s=2.0)
        t.wait_reachable(ep, 10)
        conn = t._conns[t._key(ep)]
        t.status(ep, ["a"])
        assert t._conns[t._key(ep)] is conn, "one cached connection per host"
        server.stop()  # the "host" goes away, with its open sessions
        with pytest.raises(TransportError):
            t.status(ep, ["a"])
        server.start()  # back at the same address
        assert t.status(ep, ["a"]) == {"a": ProcStatus(ProcState.ABSENT)}
        t.close()


def test_remote_path_quoting() -> None:
    assert remote_path("/a b/c") == "'/a b/c'"
    assert remote_path("~/x y") == "\"$HOME\"/'x y'"
    assert remote_path("~") == '"$HOME"'
    assert remote_path("rel/dir") == "rel/dir"


class _DroppingProxy:
    """Closes the first ``drop`` connections at once (as sshd past MaxStartups does), forwards the rest."""

    def __init__(self, target: int, drop: int) -> None:
        self.target, self.drop, self.accepted = target, drop, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted <= self.drop:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()


def test_dropped_connections_are_retried_with_backoff(sshd: Sshd, ep: Endpoint) -> None:
    proxy = _DroppingProxy(sshd.port, drop=DROP_RETRIES - 1)
    via = replace(ep, port=proxy.port)  # the same server (and pinned key) behind the proxy
    t = SshTransport(connect_timeout_s=3.0)
    try:
        assert t.status(via, ["x"]) == {"x": ProcStatus(ProcState.ABSENT)}
        assert proxy.accepted == DROP_RETRIES
    finally:
        t.close()
        proxy.close()
    always = _DroppingProxy(sshd.port, drop=1000)
    t = SshTransport(connect_timeout_s=3.0)
    try:
        with pytest.raises(TransportError, match="cannot connect"):
            t.status(replace(ep, port=always.port), ["x"])
        assert always.accepted == DROP_RETRIES, "bounded: a server that always drops is not retried forever"
    finally:
        t.close()
        always.close()
