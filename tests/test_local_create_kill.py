"""A local instance's create killed at any line leaves nothing running once it is deleted, garbage-collected,
or its create resent and then deleted; so does a delete killed at any line, once resent; a hypervisor whose
folder disappears ends itself and its job's processes; a delete never kills a process that took a recorded
pid since.

"A kill at each line": the create (or delete) runs in a forked child traced with ``sys.settrace``; the child SIGKILLs
itself before the N-th line it would run in the local provider's code (and the transport's spawn), for every
N, then once after the create returned (its sender dead before it could record the answer). What is left is
then handled from a fresh process, and the process table is polled (bounded) until nothing of it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import REPO, processes_under, wait_until

from orchestrator.model.instances import InstanceRequest, Role
from orchestrator.providers.local.host import WATCH_S
from orchestrator.providers.local.provider import LocalProvider
from orchestrator.transport.base import Endpoint
from orchestrator.transport.local import LocalTransport

HOST = "orchestrator.providers.local.host"
DELETE = ("import sys; from pathlib import Path; from orchestrator.providers.local.provider import LocalProvider; "
          "p = LocalProvider(Path(sys.argv[1]), time_scale=600); [p.delete(n, 'local') for n in sys.argv[2:]]")
GONE_WITHIN_S = 30.0  # the bound a test waits for processes to end (they end within WATCH_S on an idle host)

# Run by a child: the count, then one forked call per kill point. argv: provider root, output file, and the call:
# create, or delete (of an instance created untraced just before).
KILLER = r'''
import json, os, signal, sys
from pathlib import Path
import orchestrator.providers.local.provider as provider_module
import orchestrator.transport.local as transport_local
from orchestrator.model.instances import InstanceRequest, Role

root, out, call = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
TRACED = (os.path.dirname(provider_module.__file__) + os.sep, transport_local.__file__)
provider = provider_module.LocalProvider(root, time_scale=600)


def request(k):
    return InstanceRequest(name=f"kill-worker-{k}", job_id="kill", role=Role.WORKER, index=k, generation=0,
                           zone="local", machine_type="local", spot=False, gpu="k80", gpu_count=1)


def traced(k, kill_at):
    lines = []

    def line(frame, event, arg):
        if event == "line":
            if len(lines) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            where = Path(frame.f_code.co_filename)
            lines.append(f"{where.parent.name}/{where.name}:{frame.f_lineno}")
        return line

    sys.settrace(lambda frame, event, arg: line if frame.f_code.co_filename.startswith(TRACED) else None)
    try:
        if call == "create":
            provider.create(request(k))
        else:
            provider.delete(request(k).name, "local")
    finally:
        sys.settrace(None)
    return lines


def prepared(k):
    if call == "delete":  # a running instance, with a job process in its folder
        provider.create(request(k))
        disk = root / "instances" / request(k).name / "disk"
        transport_local.LocalTransport().start(transport_local.Endpoint(workdir=str(disk)), "task", ["sleep", "600"])


prepared(0)
lines = traced(0, -1)  # counted: this call runs to its end
# Before each line the call runs (at its first run: a loop's next turn changes nothing new), then after the end.
points = [n for n, where in enumerate(lines) if where not in lines[:n]] + [len(lines)]
for k, kill_at in enumerate(points, start=1):
    prepared(k)
    pid = os.fork()
    if pid == 0:
        traced(k, kill_at)
        os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
out.write_text(json.dumps({"lines": [lines[n] for n in points[:-1]], "instances": len(points) + 1}))
'''


def _python(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _kill_at_each_line(root: Path, out: Path, call: str = "create") -> list[str]:
    """Every kill point's instance, as the killed calls left them."""
    _python(KILLER, str(root), str(out), call)
    report = json.loads(out.read_text())
    assert len(report["lines"]) >= 10, report  # the trace saw the call's lines
    if call == "create":
        assert any(line.startswith("transport/") for line in report["lines"]), "killed inside the spawn too"
    return [f"kill-worker-{k}" for k in range(report["instances"])]


def _hosts(folder: Path) -> list[int]:
    """Live hypervisors of ``folder``, read from /proc here (not with the product's own finder)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and HOST.encode() in argv and str(folder).encode() in argv:
            found.append(int(proc.name))
    return found


def _nothing_runs(root: Path) -> None:
    wait_until(lambda: processes_under(root) == [], timeout=GONE_WITHIN_S, interval=0.1)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_a_kill_at_each_line_of_create_then_a_delete_from_a_fresh_process_leaves_nothing(home: Path) -> None:
    root = home / "local"
    names = _kill_at_each_line(root, home.parent / "kills.json")
    assert any(_hosts(root / "instances" / n) for n in names)  # some kills left a hypervisor running
    _python(DELETE, str(root), *names)
    _nothing_runs(root)
    assert sorted(os.listdir(root / "instances")) == []


def test_a_kill_at_each_line_of_create_then_gc_leaves_nothing(home: Path) -> None:
    root = home / "local"  # where the gc command's local provider looks (ORCHESTRATOR_HOME is ``home``)
    names = _kill_at_each_line(root, home.parent / "kills.json")
    assert any(_hosts(root / "instances" / n) for n in names)
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "gc", "--yes"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    _nothing_runs(root)


def test_a_create_resent_after_a_kill_at_each_line_starts_one_hypervisor_then_a_delete_leaves_nothing(
        home: Path) -> None:
    root = home / "local"
    names = _kill_at_each_line(root, home.parent / "kills.json")
    resend = ("import sys; from pathlib import Path; from orchestrator.model.instances import InstanceRequest, Role; "
              "from orchestrator.providers.local.provider import LocalProvider; "
              "p = LocalProvider(Path(sys.argv[1]), time_scale=600); "
              "[p.create(InstanceRequest(name=f'kill-worker-{k}', job_id='kill', role=Role.WORKER, index=k, "
              "generation=0, zone='local', machine_type='local', spot=False, gpu='k80', gpu_count=1)) "
              "for k in range(int(sys.argv[2]))]")
    _python(resend, str(root), str(len(names)))
    provider = LocalProvider(root, time_scale=600)
    for name in names:  # exactly one hypervisor each: the resend finished what the killed create began
        assert len(_hosts(root / "instances" / name)) == 1, name
    wait_until(lambda: sorted(o.name for o in provider.list() if o.state.value == "running") == sorted(names),
               timeout=GONE_WITHIN_S, interval=0.1)  # and each one booted
    _python(DELETE, str(root), *names)
    _nothing_runs(root)


def test_a_kill_at_each_line_of_delete_then_the_delete_resent_leaves_nothing(home: Path) -> None:
    root = home / "local"
    names = _kill_at_each_line(root, home.parent / "kills.json", "delete")
    _python(DELETE, str(root), *names)
    _nothing_runs(root)
    assert sorted(os.listdir(root / "instances")) == [] and sorted(os.listdir(root / "deleting")) == []
    assert sorted(p.stem for p in (root / "deleted").glob("*.json")) == sorted(names)  # each deletion recorded


def _request(name: str) -> InstanceRequest:
    return InstanceRequest(name=name, job_id="watch", role=Role.WORKER, index=0, generation=0, zone="local",
                           machine_type="local", spot=False, gpu="k80", gpu_count=1)


def _booted(provider: LocalProvider, name: str) -> None:
    wait_until(lambda: any(o.name == name and o.state.value == "running" for o in provider.list()),
               timeout=GONE_WITHIN_S, interval=0.1)


def test_a_hypervisor_whose_folder_disappears_ends_its_jobs_processes_and_itself(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "local", time_scale=600)
    provider.create(_request("watch-worker-0"))
    folder = provider.root / "watch-worker-0"
    _booted(provider, "watch-worker-0")
    LocalTransport().start(Endpoint(workdir=str(folder / "disk")), "task", ["sleep", "600"])
    wait_until(lambda: len(processes_under(folder)) >= 3, timeout=GONE_WITHIN_S, interval=0.1)  # host, sh, sleep
    shutil.rmtree(folder)  # no delete: a controller that never knew these pids
    _nothing_runs(tmp_path / "local")
    assert WATCH_S <= 1.0


def test_a_delete_never_kills_a_process_that_took_a_recorded_pid(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "local", time_scale=600)
    provider.create(_request("watch-worker-0"))
    folder = provider.root / "watch-worker-0"
    _booted(provider, "watch-worker-0")
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        (folder / "hypervisor.pid").write_text(str(bystander.pid))  # as if the system had reused the pid
        state = json.loads((folder / "instance.json").read_text())
        state["hypervisor_pid"] = bystander.pid
        (folder / "instance.json").write_text(json.dumps(state))
        provider.delete("watch-worker-0", "local")
        _nothing_runs(tmp_path / "local")  # the instance's own hypervisor is found by what it is
        assert bystander.poll() is None, "the bystander holding the recorded pid was killed"
    finally:
        bystander.kill()
        bystander.wait()


def test_gc_ends_a_hypervisor_that_outlived_its_folder(home: Path) -> None:
    provider = LocalProvider(home / "local", time_scale=600)
    provider.create(_request("watch-worker-0"))
    folder = provider.root / "watch-worker-0"
    _booted(provider, "watch-worker-0")
    (pid,) = _hosts(folder)
    os.kill(pid, signal.SIGSTOP)  # a hypervisor that cannot see its folder go (stopped, or an older version)
    try:
        shutil.rmtree(folder)
        assert _hosts(folder) == [pid]  # stopped: it stays until something ends it
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "gc", "--yes"], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        _nothing_runs(home / "local")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
