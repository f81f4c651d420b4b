"""A throwaway OpenSSH server on 127.0.0.1 for tests: its own host key, config and authorized_keys.

    with Sshd() as sshd:
        key_path, public = job_key("job1")
        sshd.authorize(public)
        ep = sshd.endpoint(workdir=str(tmp_path / "disk"), key_path=str(key_path))
        SshTransport().wait_reachable(ep, 10)

Logs in as the user running the tests (root in CI: ``PermitRootLogin prohibit-password``). Requires the
``sshd`` binary (Debian: ``apt-get install openssh-server``); without it ``start`` raises ``SshdMissing``
so that tests fail rather than silently skip.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from orchestrator.providers.ports import free_port
from orchestrator.transport.base import Endpoint
from orchestrator.transport.keys import generate_keypair, write_private

_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")


class SshdMissing(RuntimeError):
    pass


def find_sshd() -> str:
    found = shutil.which("sshd") or next((p for p in _CANDIDATES if os.access(p, os.X_OK)), None)
    if found is None:
        raise SshdMissing("sshd is not installed; install it (Debian/Ubuntu: "
                          "apt-get install -y openssh-server openssh-client) - .ci/run does this")
    return found


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (sshd's per-connection processes start their own sessions)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


class Sshd:
    def __init__(self, root: Path | None = None, env: dict[str, str] | None = None) -> None:
        self._owned_root = root is None
        self.env = dict(env or {})  # set in every session (a lab machine's own PATH, say)
        self.root = Path(tempfile.mkdtemp(prefix="orch-sshd-")) if root is None else root
        self.host = "127.0.0.1"
        self.port = 0
        self.user = getpass.getuser()
        self.authorized_keys = self.root / "authorized_keys"
        self.log_path = self.root / "sshd.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> Sshd:
        binary = find_sshd()
        self.root.mkdir(parents=True, exist_ok=True)
        host_key = self.root / "ssh_host_ed25519_key"
        if not host_key.exists():
            private, public = generate_keypair("orchestrator-test-host")
            write_private(host_key, private)
            (self.root / "ssh_host_ed25519_key.pub").write_text(public + "\n")
        self.authorized_keys.touch()
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege-separation directory
        last = ""
        for attempt in range(3):  # the free port may be taken between probing and sshd binding it
            # A restarted server keeps its port: the "host" comes back at the same address.
            self.port = self.port if self.port and attempt == 0 else free_port()
            config = self.root / "sshd_config"
            config.write_text("\n".join([
                f"ListenAddress {self.host}", f"Port {self.port}", f"HostKey {host_key}",
                f"PidFile {self.root / 'sshd.pid'}", f"AuthorizedKeysFile {self.authorized_keys}",
                "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no", "UseDNS no",
                "Subsystem sftp internal-sftp", "MaxStartups 100:30:200", "MaxSessions 100",
                # bash sources ~/.bashrc for SSH commands only at shell level 1; a developer's slow
                # .bashrc (pyenv init: ~0.7 s) would otherwise be paid on every transport call.
                "SetEnv SHLVL=1 " + " ".join(f"{k}={v}" for k, v in self.env.items()), "LogLevel INFO", "",
            ]))
            with self.log_path.open("ab") as logf:
                self._proc = subprocess.Popen([binary, "-D", "-e", "-f", str(config)],
                                              stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                              start_new_session=True)
            if self._wait_banner(timeout_s):
                return self
            last = self.log_path.read_text(errors="replace")[-2000:]
            self._kill()
            if "Address already in use" not in last:
                break
        raise RuntimeError(f"sshd did not start on {self.host}:{self.port}; its log:\n{last}")

    def _wait_banner(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return True
            except OSError:
                time.sleep(0.05)
        return False

    def authorize(self, public_key_line: str) -> None:
        """Let the holder of this key log in (one ``ssh-ed25519 AAAA... comment`` line)."""
        with self.authorized_keys.open("a") as f:
            f.write(public_key_line.strip() + "\n")

    def endpoint(self, workdir: str, key_path: str | None = None) -> Endpoint:
        host_key = (self.root / "ssh_host_ed25519_key.pub").read_text().strip()  # pinned (security helper)
        return Endpoint(workdir=workdir, host=self.host, port=self.port, user=self.user, key_path=key_path,
                        host_keys=(host_key,))

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # Open sessions must die too, or a cached client connection would outlive the "host".
        for pid in [*_children(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=5)

    def stop(self) -> None:
        """Kill the server and its sessions (processes started detached over SSH are left alone)."""
        self._kill()

    def close(self) -> None:
        self.stop()
        if self._owned_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Sshd:
        return self.start() if not self.running else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
