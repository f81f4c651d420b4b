"""Run the CLI in this interpreter and see what a shell would: exit code, stdout and stderr.

A fresh ``python -m orchestrator`` pays 0.3-8 s of interpreter start-up and imports (pydantic, SQLAlchemy, the
simulator, google.cloud.compute_v1) before it does a few milliseconds of work; tests that check many cheap
answers (usage errors, --help, dry runs) run them here instead. What a fresh process would start from is set up
for each call and undone after it:

* the environment is exactly ``env`` (as ``subprocess.run(env=...)``), the working directory is ``cwd``;
* stdout and stderr are pipes (not terminals); the Rich consoles are rebuilt as the CLI's import builds them,
  under that environment and those pipes (width from COLUMNS, no colour);
* the root logger has no handlers (a warning reaches stderr as Python's last-resort handler writes it) and the
  warning filters are a fresh interpreter's (pytest's capture of both is suspended);
* an exception ``main`` lets through is printed as the interpreter would (a traceback, exit 1);
* urllib's global opener (which keeps the proxies it was built with) is dropped after each call;
* ``main`` appends its sub-command groups to the app on every call; the list is put back after each call.

What it cannot see: the import of the CLI itself (one test per file still runs the real console script in a
subprocess, and ``test_in_process_answers_as_the_console_script`` compares the two).
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import traceback
import urllib.request
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.cli import main as cli_main
from orchestrator.cli import render


def _fresh_warning_filters() -> None:
    # The filters a plain `python` starts with (no -W, no PYTHONWARNINGS), newest first as warnings keeps them.
    warnings.resetwarnings()
    for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
        warnings.simplefilter("ignore", category)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")


def run_cli(args: Sequence[str], env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``orchestrator *args`` run in this interpreter; the result as ``subprocess.run(..., text=True)`` gives it."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["orchestrator", *args]
    saved_env = dict(os.environ)  # restored whole: the CLI itself sets variables (--db sets the DB URL's)
    try:
        with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
            os.environ.clear()
            os.environ.update(env)
            mp.chdir(cwd)
            mp.setattr(sys, "argv", argv)
            mp.setattr(sys, "stdout", out)
            mp.setattr(sys, "stderr", err)
            for name, fresh in (("console", Console()), ("err_console", Console(stderr=True))):
                target = getattr(render, name)  # the one object every module imported: rebuilt in place
                for attr, value in vars(fresh).items():
                    mp.setattr(target, attr, value, raising=False)
            mp.setattr(logging.root, "handlers", [])
            mp.setattr(logging.root, "level", logging.WARNING)
            mp.setattr(cli_main.app, "registered_groups", list(cli_main.app.registered_groups))
            _fresh_warning_filters()
            code = _exit_code(err)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        # urlopen's global opener keeps the proxies of the environment it was first built in: a call's
        # http_proxy must not outlive the call (a fresh process would not share it)
        urllib.request.install_opener(None)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def _exit_code(err: io.StringIO) -> int:
    """Run ``main`` and give the exit status the interpreter would."""
    try:
        cli_main.main()
    except SystemExit as done:
        if done.code is None:
            return 0
        if isinstance(done.code, int):
            return done.code
        print(done.code, file=err)  # sys.exit("message"): printed, exit 1
        return 1
    except Exception:  # the interpreter's own answer to an uncaught exception (Ctrl-C still stops pytest)
        err.write(traceback.format_exc())
        return 1
    return 0


def run_cli_subprocess(args: Sequence[str], env: Mapping[str, str], cwd: Path,
                       timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The same, as the shell runs it: a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, cwd=cwd,
                          env=dict(env), timeout=timeout)
