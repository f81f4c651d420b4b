"""SSH transport: the local transport's on-instance layout, driven over one cached connection per host.

Every operation is one remote ``sh -c`` script on a paramiko channel of a cached fabric ``Connection``
(a university node's login shell may be csh; ``sh`` is everywhere). Raw channels rather than
``Connection.run``: logs are bytes (offsets are byte offsets) and ``put`` streams a tar archive into
``tar -x`` in one round trip, which is far faster than an sftp call per file.

Host keys are pinned (``host_keys.pin``): the server must show a key the endpoint expects (a cloud VM's
published keys, or the ``known_hosts`` entry of an inventory host); fabric's default AutoAddPolicy, which
accepts any key, is replaced on every connection.
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import re
import shlex
import stat
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path

import paramiko
from fabric import Config, Connection
from paramiko.config import SSHConfig
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from orchestrator.clock import WALL, Clock
from orchestrator.model.instances import ProcState, ProcStatus
from orchestrator.transport.base import (
    Endpoint,
    FatalTransportError,
    Transport,
    TransportError,
    check_relative,
    wrapped_command,
)
from orchestrator.transport.host_keys import HostKeyError, mismatch, pin

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SKIP = ("__pycache__", ".pytest_cache")
_CONN_ERRORS = (paramiko.SSHException, OSError, EOFError)  # socket.timeout is an OSError

# "Alive" as the local transport means it: the pid exists and is not a zombie (an orphan whose parent,
# e.g. a container's init, does not reap it). Without /proc, fall back to kill -0.
_ALIVE = r"""alive() {
  if [ -d /proc/self ]; then
    [ -r "/proc/$1/stat" ] || return 1
    s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$s" ] && [ "$s" != Z ]
  else
    kill -0 "$1" 2>/dev/null
  fi
}
"""
# A pid file holding 0 or 1 must never turn into `kill -KILL -1` (every process of the user).
_READ_PID = """pid=$(cat "procs/{name}.pid" 2>/dev/null)
case "$pid" in ''|*[!0-9]*) pid=0;; esac
"""


class UnreachableError(TransportError, TimeoutError):
    """The instance did not answer SSH in time (also a TimeoutError, like the local transport's)."""


class _Dropped(TransportError):
    """The server closed the connection before the handshake (sshd past MaxStartups): retried a few times."""


DROP_RETRIES = 4


class SshAuthError(FatalTransportError):
    """The server refused our key: a fixed host will refuse it again (a booting VM may not, see wait_reachable)."""


class _LibraryDetailToDebug(logging.Filter):
    """paramiko's transport thread logs each failed handshake at ERROR with its traceback, one record per
    line: on a console that is a wall of library internals for what the caller reports in one line. They
    stay in the debug log (a handler at DEBUG still gets them), never on an INFO console."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


logging.getLogger("paramiko.transport").addFilter(_LibraryDetailToDebug())


def check_key_file(path: str) -> None:
    """Refuse a private key that others can read, as ssh itself does, with the fix in the message."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        raise TransportError(f"SSH key {path} does not exist") from None
    if mode & 0o077:
        raise TransportError(f"SSH key {path} has mode {mode:04o}; it must be 0600 (run: chmod 600 {path})")


def remote_path(path: str) -> str:
    """``path`` quoted for sh; a leading ``~/`` still means the remote home directory."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"process name {name!r} must match {_NAME.pattern}")
    return name


def _where(ep: Endpoint) -> str:
    return f"{ep.user + '@' if ep.user else ''}{ep.host}:{ep.port}"


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    base = posixpath.basename(info.name)
    if base in _SKIP or base.endswith(".pyc"):
        return None
    if info.issym() or info.islnk():
        target = info.linkname
        if target.startswith("/") or ".." in target.split("/"):
            # tar -x on the host would create it, and a later member could be written through it.
            log.warning("not pushing link %s -> %s: it points outside the pushed folder", info.name, target)
            return None
    elif not (info.isreg() or info.isdir()):
        return None  # devices, fifos: nothing a job needs
    info.uid = info.gid = 0
    info.uname = info.gname = ""  # the remote user owns what it extracts
    return info


_ConnKey = tuple[str, int, str | None, str | None]


class SshTransport(Transport):
    def __init__(self, *, connect_timeout_s: float = 10.0, command_timeout_s: float = 120.0,
                 clock: Clock = WALL) -> None:
        self.clock = clock
        self.connect_timeout_s = connect_timeout_s
        self.command_timeout_s = command_timeout_s
        self._conns: dict[_ConnKey, Connection] = {}
        self._locks: dict[_ConnKey, threading.Lock] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- connections

    @staticmethod
    def _key(ep: Endpoint) -> _ConnKey:
        return (ep.host, ep.port, ep.user, ep.key_path)

    def _connection(self, ep: Endpoint, connect_timeout_s: float) -> Connection:
        key = self._key(ep)
        with self._lock:
            conn_lock = self._locks.setdefault(key, threading.Lock())
        with conn_lock:  # one connect per host at a time; different hosts connect in parallel
            with self._lock:
                conn = self._conns.get(key)
            if conn is not None and conn.is_connected:
                return conn
            if conn is not None:
                conn.close()
            # sshd drops connections past MaxStartups (many instances connecting at once): a few quick
            # retries, jittered so that the crowd spreads out, before the pass counts a failure.
            conn = None
            for tried in Retrying(retry=retry_if_exception_type(_Dropped), stop=stop_after_attempt(DROP_RETRIES),
                                  wait=wait_random_exponential(multiplier=0.2, max=2.0), reraise=True):
                with tried:
                    conn = _open(ep, connect_timeout_s)
            assert conn is not None
            with self._lock:
                self._conns[key] = conn
            return conn

    def _drop(self, ep: Endpoint) -> None:
        with self._lock:
            conn = self._conns.pop(self._key(ep), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close every cached connection."""
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()

    def _exec(self, ep: Endpoint, script: str, stdin: bytes | None = None, *, timeout_s: float | None = None,
              connect_timeout_s: float | None = None) -> tuple[int, bytes, bytes]:
        """Run ``script`` under ``sh`` on the host: (exit code, stdout, stderr)."""
        timeout = timeout_s or self.command_timeout_s
        for attempt in (0, 1):
            conn = self._connection(ep, connect_timeout_s or self.connect_timeout_s)
            try:
                return _run_channel(conn, "sh -c " + shlex.quote(script), stdin, timeout)
            except _CONN_ERRORS as e:
                # A cached connection may have died (instance rebooted, NAT timeout): reconnect once.
                self._drop(ep)
                if attempt:
                    raise TransportError(f"SSH to {_where(ep)} failed: {type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")

    def _check(self, ep: Endpoint, script: str, what: str, stdin: bytes | None = None, *,
               timeout_s: float | None = None, connect_timeout_s: float | None = None) -> bytes:
        code, out, err = self._exec(ep, script, stdin, timeout_s=timeout_s,
                                    connect_timeout_s=connect_timeout_s)
        if code != 0:
            detail = err.decode(errors="replace").strip()[-500:]
            raise TransportError(f"{what} on {_where(ep)} failed (exit {code})"
                                 f"{': ' + detail if detail else ''}")
        return out

    # ---------------------------------------------------------------- Transport

    def wait_reachable(self, ep: Endpoint, timeout_s: float) -> None:
        """Connect and create the work directory, retrying until ``timeout_s`` with jittered exponential
        backoff (sshd drops connections past MaxStartups: a crowd retrying in step would be dropped again).

        A wrong host key is fatal at once. A refused login is too, except on a VM whose keys are published at
        boot (``host_key_source``): its guest agent installs our login key at boot as well, maybe late."""
        deadline = self.clock.monotonic() + timeout_s
        refused: list[SshAuthError] = []

        def attempt() -> None:
            remaining = max(0.0, deadline - self.clock.monotonic())
            try:
                self._check(ep, f"mkdir -p {remote_path(ep.workdir)}", "mkdir",
                            connect_timeout_s=max(0.5, min(self.connect_timeout_s, remaining)),
                            timeout_s=max(1.0, min(self.command_timeout_s, remaining)))
            except SshAuthError as exc:
                refused.append(exc)
                raise

        def retryable(exc: BaseException) -> bool:
            if isinstance(exc, SshAuthError):
                return ep.host_key_source is not None
            return isinstance(exc, TransportError) and not isinstance(exc, FatalTransportError)

        def give_up(state: RetryCallState) -> None:
            assert state.outcome is not None
            last = state.outcome.exception()
            if isinstance(last, FatalTransportError):
                raise last
            if refused:
                # The host answered and refused our key: that is the diagnosis, not the last try's cut-short
                # connect (its timeout shrinks to what is left of the deadline).
                raise refused[-1]
            raise UnreachableError(f"{_where(ep)} not reachable within {timeout_s:.0f}s: {last}")

        for tried in Retrying(retry=retry_if_exception(retryable), stop=stop_after_delay(timeout_s),
                              wait=wait_random_exponential(multiplier=0.25, max=10.0),
                              sleep=_sleep_until(deadline, self.clock),
                              retry_error_callback=give_up, reraise=True):
            with tried:
                attempt()

    def put(self, ep: Endpoint, local: Path, remote_rel: str) -> None:
        if not local.exists():
            raise FileNotFoundError(local)
        dest = posixpath.join(ep.workdir, check_relative(remote_rel, str(local)))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
            if local.is_dir():
                tar.add(local, arcname=".", filter=_tar_filter)
            else:
                tar.add(local, arcname=posixpath.basename(dest), filter=_tar_filter)
                dest = posixpath.dirname(dest)
        d = remote_path(dest)
        self._check(ep, f"mkdir -p {d} && tar -xzf - -C {d}", f"put {local}", buf.getvalue(),
                    timeout_s=max(self.command_timeout_s, 300.0))

    def write(self, ep: Endpoint, remote_rel: str, text: str) -> None:
        path = posixpath.join(ep.workdir, check_relative(remote_rel))
        d, name = posixpath.dirname(path) or ".", posixpath.basename(path)
        tmp = remote_path(posixpath.join(d, f".{name}.tmp"))
        self._check(ep, f"mkdir -p {remote_path(d)} && cat > {tmp} && mv -f {tmp} {remote_path(path)}",
                    f"write {remote_rel}", text.encode())

    def start(self, ep: Endpoint, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        _check_name(name)
        merged = {**ep.env, **(env or {})}
        for k in merged:
            if not _ENV_KEY.match(k):
                raise ValueError(f"environment variable name {k!r} is not valid")
        # The variables (secrets among them) travel on the channel's stdin and are eval'd by the remote
        # shell: a command line is world-readable in /proc/*/cmdline, the script below is only code.
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in merged.items())
        wd = remote_path(ep.workdir)
        # setsid without fork (the background child of a non-interactive sh is no group leader), so $! is
        # the new process group that stop() kills. Every fd is redirected: an open one would keep the
        # SSH channel (and this call) waiting for the task to end.
        script = (
            f'vars=$(cat) || exit 96\nmkdir -p {wd}/procs {wd}/logs && cd {wd} || exit 97\n'
            f"{_ALIVE}{_READ_PID.format(name=name)}"
            f'if [ "$pid" -gt 1 ] && alive "$pid"; then exit 0; fi\n'
            f'rm -f procs/{name}.pid procs/{name}.exit\neval "$vars"\nunset vars\n'
            f"setsid nohup sh -c {shlex.quote(wrapped_command(name, argv))} >/dev/null 2>&1 </dev/null &\n"
            f"echo $! > procs/{name}.pid.tmp && mv -f procs/{name}.pid.tmp procs/{name}.pid\n"
        )
        self._check(ep, script, f"start {name}", exports.encode())

    def status(self, ep: Endpoint, names: list[str]) -> dict[str, ProcStatus]:
        for n in names:
            _check_name(n)
        out: dict[str, ProcStatus] = {n: ProcStatus(ProcState.ABSENT) for n in names}
        if not names:
            return out
        script = (
            f"cd {remote_path(ep.workdir)} 2>/dev/null || exit 0\n{_ALIVE}"
            f"for n in {' '.join(names)}; do\n"
            '  pid=$(cat "procs/$n.pid" 2>/dev/null)\n'
            '  case "$pid" in \'\'|*[!0-9]*) echo "$n absent"; continue;; esac\n'
            '  if alive "$pid"; then echo "$n running"; continue; fi\n'
            '  echo "$n exited $(cat "procs/$n.exit" 2>/dev/null)"\n'
            "done\n"
        )
        for line in self._check(ep, script, "status").decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) < 2 or parts[0] not in out:
                continue
            if parts[1] == "running":
                out[parts[0]] = ProcStatus(ProcState.RUNNING)
            elif parts[1] == "exited":
                try:
                    code = int(parts[2])
                except (IndexError, ValueError):
                    code = -9  # killed before the shell could record a code
                out[parts[0]] = ProcStatus(ProcState.EXITED, code)
        return out

    def stop(self, ep: Endpoint, name: str) -> None:
        _check_name(name)
        script = (
            f"cd {remote_path(ep.workdir)} 2>/dev/null || exit 0\n{_ALIVE}{_READ_PID.format(name=name)}"
            '[ "$pid" -gt 1 ] || exit 0\n'
            'kill -KILL -"$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null\n'
            'i=0; while alive "$pid" && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done\n'
            "exit 0\n"
        )
        self._check(ep, script, f"stop {name}")

    def read_log(self, ep: Endpoint, name: str, offset: int = 0) -> bytes:
        _check_name(name)
        script = (f"cd {remote_path(ep.workdir)} 2>/dev/null || exit 0\n"
                  f"tail -c +{int(offset) + 1} logs/{name}.log 2>/dev/null; exit 0\n")
        return self._check(ep, script, f"read log {name}")

    # ---------------------------------------------------------------- beyond the interface (providers)

    def kill_all(self, ep: Endpoint) -> int:
        """Kill every process group recorded under ``procs/`` (deleting an instance). Returns how many."""
        script = (
            f"cd {remote_path(ep.workdir)} 2>/dev/null || {{ echo 0; exit 0; }}\n{_ALIVE}"
            "k=0\nfor f in procs/*.pid; do\n"
            '  [ -f "$f" ] || continue\n  pid=$(cat "$f" 2>/dev/null)\n'
            '  case "$pid" in \'\'|*[!0-9]*) continue;; esac\n  [ "$pid" -gt 1 ] || continue\n'
            '  alive "$pid" || continue\n'
            '  kill -KILL -"$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null; k=$((k+1))\n'
            "done\necho $k\n"
        )
        out = self._check(ep, script, "kill processes").decode().strip()
        return int(out) if out.isdigit() else 0

    def remove_workdir(self, ep: Endpoint) -> None:
        """Delete the instance's work directory (its "disk")."""
        if ep.workdir.strip("/ ") in ("", "~", "."):
            raise ValueError(f"refusing to remove work directory {ep.workdir!r}")
        self._check(ep, f"rm -rf -- {remote_path(ep.workdir)}", "remove work directory")


def _open(ep: Endpoint, connect_timeout_s: float) -> Connection:
    """A new connection to ``ep``, its host key pinned; failures mapped to one-line TransportErrors."""
    kwargs: dict[str, object] = {
        "timeout": connect_timeout_s, "banner_timeout": connect_timeout_s,
        "auth_timeout": connect_timeout_s, "channel_timeout": connect_timeout_s,
    }
    if ep.key_path is not None:
        check_key_file(ep.key_path)
        # Only the job's key: no agent, no ~/.ssh keys tried (and maybe locking us out first).
        kwargs.update(key_filename=[ep.key_path], look_for_keys=False, allow_agent=False)
    # An explicit empty SSHConfig: the user's ~/.ssh/config must not redirect our hosts.
    conn = Connection(ep.host, user=ep.user, port=ep.port, config=Config(ssh_config=SSHConfig()),
                      connect_kwargs=kwargs)
    source = pin(conn.client, ep)
    try:
        conn.open()
    except HostKeyError:
        conn.close()
        raise
    except paramiko.BadHostKeyException as e:
        conn.close()
        raise mismatch(ep, e, source) from None
    except paramiko.AuthenticationException as e:
        conn.close()
        with_key = f" with key {ep.key_path}" if ep.key_path else ""
        raise SshAuthError(
            f"SSH authentication to {_where(ep)} failed{with_key} ({e}): add that key's public half to "
            f"~{ep.user or ''}/.ssh/authorized_keys on {ep.host}, or fix the inventory's user/key fields") from None
    except (*_CONN_ERRORS, ValueError) as e:
        conn.close()
        # Closed before or during the banner: the server dropped us (MaxStartups), not a dead host (a timeout).
        dropped = isinstance(e, EOFError | ConnectionResetError) or (
            isinstance(e, paramiko.SSHException) and isinstance(e.__context__, EOFError | ConnectionResetError))
        error = _Dropped if dropped else TransportError
        raise error(f"cannot connect to {_where(ep)}: {type(e).__name__}: {e}") from None
    return conn


def _sleep_until(deadline: float, clock: Clock) -> Callable[[float], None]:
    """tenacity's sleep, never past ``deadline`` (the last attempt then reports in time)."""
    def sleep(seconds: float) -> None:
        clock.sleep(max(0.0, min(seconds, deadline - clock.monotonic())))
    return sleep


def _run_channel(conn: Connection, command: str, stdin: bytes | None,
                 timeout: float) -> tuple[int, bytes, bytes]:
    transport = conn.transport
    if transport is None or not transport.active:
        raise paramiko.SSHException("connection closed")
    chan = transport.open_session(timeout=timeout)
    try:
        chan.settimeout(timeout)
        chan.exec_command(command)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        # stdout, then stderr: our scripts write little to stderr, so it never fills the channel window.
        out = _drain(chan.recv)
        err = _drain(chan.recv_stderr)
        if not chan.status_event.wait(timeout):
            raise TimeoutError(f"no exit status within {timeout:.0f}s")
        return chan.exit_status, out, err
    finally:
        chan.close()


def _drain(recv: Callable[[int], bytes]) -> bytes:
    chunks: list[bytes] = []
    while True:
        data = recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)
