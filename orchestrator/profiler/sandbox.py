"""Run a user's model factory where it cannot reach the controller: a child process, a scrubbed environment,
limits, and every way it can end named as one error.

The controller (``plan``, ``launch``, ``simulate``, ``model profile|predict --torch``) never imports the
user's module: ``factory_ref`` finds it without running it, and this starts ``orchestrator.profiler.child``
with

* an environment built from an allowlist (the path, locale, home and temporary folder, and what Python and
  torch need to start from the same interpreter): no DB URL, no cloud credentials, none of the spec's
  ``secrets:``; no GPU (``CUDA_VISIBLE_DEVICES`` empty: the meta device needs none);
* an address-space limit (set by the child on itself before the user's code is imported) and a wall-time
  limit (its process group killed at it), stdin closed, its working folder the spec's folder, its own
  session (a Ctrl-C of the CLI reaches the CLI, which stops it);
* its answer in a file of a private temporary folder, read only when it exits 0.

It is a fence against a factory that reads the controller's secrets, exits, hangs or eats memory; not a
jail: the factory still runs as the user, with the user's files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orchestrator
from orchestrator.clock import WALL
from orchestrator.costmodel.profiles.model import ModelProfile
from orchestrator.profiler.child import MEMORY_ERROR_EXIT
from orchestrator.profiler.factory_ref import FactorySource, ProfileError

ENV_TIMEOUT = "ORCHESTRATOR_PROFILE_TIMEOUT_S"
ENV_MEMORY = "ORCHESTRATOR_PROFILE_MEMORY_MB"
DEFAULT_TIMEOUT_S = 120.0  # ResNet-50 takes ~5 s with torch's import on a CPU
DEFAULT_MEMORY_MB = 16 * 1024  # address space: torch's import maps ~0.7 GiB (CPU build), a CUDA build a few GiB
FILE_MB = 256  # the largest file the child may write (its output log among them)
TAIL_CHARS = 200
# What the child may see of the controller's environment (names; LC_* by prefix). Anything else (the DB URL,
# GOOGLE_*/AWS_* credentials, tokens, the spec's secrets) stays out.
ALLOWED_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "TERM",
    "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE",
    "PYTHONNOUSERSITE", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "TORCH_HOME", "XDG_CACHE_HOME",
})
ALLOWED_PREFIXES = ("LC_",)
SECRET_LOOKING = re.compile(r"SECRET|TOKEN|PASSW|CREDENTIAL|API_?KEY|PRIVATE|AUTH", re.IGNORECASE)


def _number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        raise ProfileError(f"{name}={os.environ[name]!r} is not a number") from None
    if not 0 < value < math.inf:
        raise ProfileError(f"{name} must be a number above 0 (it is {os.environ[name]})")
    return value


def child_env(withhold: frozenset[str] = frozenset()) -> dict[str, str]:
    """The child's environment: the allowlisted variables, less ``withhold`` (the spec's secret names) and any
    whose name looks like a secret; the orchestrator's own folder on its Python path (a checkout)."""
    env = {k: v for k, v in os.environ.items()
           if (k in ALLOWED_ENV or k.startswith(ALLOWED_PREFIXES)) and k not in withhold
           and not SECRET_LOOKING.search(k)}
    package_root = str(Path(orchestrator.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [package_root])
    env["CUDA_VISIBLE_DEVICES"] = ""  # the meta device needs no GPU; the controller's stays its own
    return env


def _tail(log: Path) -> str:
    """The last line the child printed (one line, control characters dropped, at most TAIL_CHARS)."""
    try:
        with log.open("rb") as fh:
            fh.seek(max(0, log.stat().st_size - 4096))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    lines = ["".join(c for c in line if c.isprintable()).strip() for line in text.splitlines()]
    last = next((line for line in reversed(lines) if line), "")
    return last if len(last) <= TAIL_CHARS else last[: TAIL_CHARS - 1] + "…"


def _said(log: Path) -> str:
    return f"; its last output: {last}" if (last := _tail(log)) else ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _ended(src: FactorySource, code: int, log: Path, memory_mb: float) -> ProfileError:
    """The one error for a child that ended without an answer."""
    what = f"the factory '{src.ref}'"
    if code < 0:  # the kernel's OOM killer sends SIGKILL, a failed C++ allocation aborts
        hint = f" (if it ran past the memory limit of {memory_mb:g} MiB, {ENV_MEMORY} raises it)" \
            if -code in (signal.SIGKILL, signal.SIGABRT) else ""
        return ProfileError(f"{what} was killed by {_signal_name(-code)} while being profiled{hint}{_said(log)}")
    if code == 0:
        return ProfileError(f"{what} exited (status 0) before its profile was written{_said(log)}")
    if code == MEMORY_ERROR_EXIT:
        return ProfileError(f"{what} ran out of memory while being profiled (the limit is {memory_mb:g} MiB; "
                            f"{ENV_MEMORY} raises it)")
    return ProfileError(f"{what} exited with status {code} while being profiled{_said(log)}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started (its own session)


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether the child exited within ``timeout_s``; it is left unreaped (WNOWAIT), so its pid, which is
    its process group's id, cannot be reused before the group is killed."""
    deadline = WALL.monotonic() + timeout_s  # a real child process: real time
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if WALL.monotonic() >= deadline:
            return False
        WALL.sleep(0.05)
    return True


def _run(src: FactorySource, folder: Path, cwd: Path, env: dict[str, str], timeout_s: float,
         memory_mb: float) -> dict[str, Any]:
    log = folder / "output.log"
    with log.open("wb") as out:
        try:
            proc = subprocess.Popen([sys.executable, "-P", "-m", "orchestrator.profiler.child", str(folder)],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                    start_new_session=True, close_fds=True)
        except OSError as exc:
            raise ProfileError(f"cannot start the process that profiles '{src.ref}' (in {cwd}): {exc}") from None
        try:
            finished = _wait(proc, timeout_s)
        finally:  # also on Ctrl-C: nothing it started outlives it
            _kill_group(proc)
            code = proc.wait()
    if not finished:
        raise ProfileError(f"the factory '{src.ref}' did not finish within {timeout_s:g} s while being profiled "
                           f"and was stopped ({ENV_TIMEOUT} raises the limit){_said(log)}")
    result = folder / "result.json"
    if code != 0 or not result.is_file():
        raise _ended(src, code, log, memory_mb)
    try:
        doc = json.loads(result.read_text())
    except (OSError, ValueError):
        raise ProfileError(f"profiling '{src.ref}': the child wrote an unreadable result{_said(log)}") from None
    if not isinstance(doc, dict):
        raise ProfileError(f"profiling '{src.ref}': the child wrote an unreadable result")
    return doc


def profile_in_child(src: FactorySource, cwd: Path, withhold: frozenset[str] = frozenset(),
                     default_batch: int = 64) -> ModelProfile:
    """``src``'s profile, made in a child process (see the module's docstring); ProfileError names any failure."""
    timeout_s, memory_mb = _number(ENV_TIMEOUT, DEFAULT_TIMEOUT_S), _number(ENV_MEMORY, DEFAULT_MEMORY_MB)
    folder = Path(tempfile.mkdtemp(prefix="orchestrator-profile-"))  # 0700: the answer is read from here
    try:
        (folder / "request.json").write_text(json.dumps({
            "source": src.to_dict(), "default_batch": default_batch, "timeout_s": timeout_s,
            "memory_mb": round(memory_mb), "memory_env": ENV_MEMORY, "file_mb": FILE_MB}))
        doc = _run(src, folder, cwd, child_env(withhold), timeout_s, memory_mb)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if "error" in doc:
        raise ProfileError(" ".join(str(doc["error"]).split()))
    try:
        return ModelProfile.from_dict(doc["profile"])
    except (KeyError, ValueError, TypeError):
        raise ProfileError(f"profiling '{src.ref}': the child wrote an unreadable profile") from None
