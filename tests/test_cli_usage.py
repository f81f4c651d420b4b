"""The CLI as a shell sees it: every verb's --help, and bad input for each verb: usage errors are one line
with exit 2, bad files one clear line, never a traceback, nothing created.

Each case runs in this interpreter as a fresh process would start (tests/cli_inproc.py: its own environment,
working directory, pipes for stdout and stderr); test_in_process_answers_as_the_console_script runs one case of
each kind through the real console script too and requires the same exit code, stdout and stderr.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import typer

import orchestrator
from orchestrator.cli import main as cli_main
from tests.cli_inproc import run_cli, run_cli_subprocess

REPO = Path(__file__).resolve().parent.parent


def _commands() -> list[tuple[list[str], Any]]:
    cli_main._register_groups()
    root = typer.main.get_command(cli_main.app)

    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        yield path, cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, [*path, name])

    return list(walk(root, []))


COMMANDS = _commands()
PATHS = [p for p, _ in COMMANDS]
REQUIRED = [p for p, c in COMMANDS if any(getattr(x, "required", False) for x in c.params)]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # A narrow terminal: Rich must not wrap a one-line error into two.
    return {**os.environ, "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/cli.db", "COLUMNS": "80",
            "HOME": str(tmp_path)}


def run(args: Sequence[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return run_cli(args, env, cwd)


def run_all(cases: Sequence[Sequence[str]], env: dict[str, str], cwd: Path = REPO
            ) -> list[subprocess.CompletedProcess[str]]:
    return [run(a, env, cwd) for a in cases]


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def no_traceback(out: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in out.stdout + out.stderr, out.args
    assert "Error:" not in out.stderr or "error:" in out.stderr  # not click's bare multi-line usage block


def test_the_walk_found_every_verb_and_sub_verb() -> None:
    names = {" ".join(p) for p in PATHS}
    for verb in ["launch", "plan", "status", "logs", "cancel", "report", "simulate", "daemon", "gc", "catalog",
                 "db upgrade", "db current", "db downgrade", "model calibrate", "model predict", "model validate",
                 "model profile", "image bake"]:
        assert verb in names


def test_every_verb_and_sub_verb_has_help(env: dict[str, str]) -> None:
    for path, out in zip(PATHS, run_all([[*p, "--help"] for p in PATHS], env), strict=True):
        assert out.returncode == 0, (path, out.stderr[-500:])
        assert "Usage" in out.stdout, path
        no_traceback(out)


def test_version(env: dict[str, str]) -> None:
    out = run(["--version"], env)
    assert out.returncode == 0 and out.stdout.strip() == f"orchestrator {orchestrator.__version__}"


@pytest.mark.parametrize("args", [["bogus"], ["db", "bogus"], ["model", "bogus"], ["image", "bogus"]])
def test_unknown_verb_is_one_line_exit_2(args: list[str], env: dict[str, str]) -> None:
    out = run(args, env)
    assert out.returncode == 2
    assert lines(out.stderr) == [ln for ln in lines(out.stderr) if "No such command 'bogus'" in ln]
    assert len(lines(out.stderr)) == 1 and "--help" in out.stderr
    no_traceback(out)


def test_bad_option_on_every_verb_is_one_line_exit_2(env: dict[str, str]) -> None:
    for path, out in zip(PATHS, run_all([[*p, "--no-such-option"] for p in PATHS], env), strict=True):
        assert out.returncode == 2, (path, out.stderr[-500:])
        assert len(lines(out.stderr)) == 1 and "No such option" in out.stderr, (path, out.stderr)
        no_traceback(out)


def test_missing_argument_is_one_line_exit_2(env: dict[str, str]) -> None:
    assert REQUIRED  # launch, plan, logs, cancel, db downgrade, model predict
    for path, out in zip(REQUIRED, run_all(REQUIRED, env), strict=True):
        assert out.returncode == 2, (path, out.stderr[-500:])
        assert len(lines(out.stderr)) == 1 and "Missing" in out.stderr, (path, out.stderr)
        no_traceback(out)


def _files(tmp_path: Path) -> dict[str, Path]:
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("name: caf\xe9\ncluster: {workers: [{gpu: t4}]}\n".encode("latin-1"))
    dup = tmp_path / "dup.yaml"
    dup.write_text("name: dup\ncluster: {workers: [{gpu: t4}]}\n"
                   "cluster: {workers: [{gpu: v100, count: 64, spot: false}]}\n")
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: " + "[" * 100_000 + "]" * 100_000 + "\n")
    good = tmp_path / "good.yaml"
    good.write_text("name: good\ncluster: {workers: [{gpu: t4}]}\n")
    list_json = tmp_path / "list.json"
    list_json.write_text("[1, 2]\n")
    object_json = tmp_path / "object.json"
    object_json.write_text('{"x": 1}\n')
    return {"latin": latin, "dup": dup, "deep": deep, "dir": tmp_path, "missing": tmp_path / "nope.yaml",
            "list_json": list_json, "object_json": object_json, "good": good,
            "passwd": Path("/etc/passwd"), "devnull": Path("/dev/null")}


# (args, exit code, a phrase of the one-line answer); {name} is a file from _files
BAD_INPUT: list[tuple[list[str], int, str]] = [
    (["launch", "{latin}"], 2, "is not UTF-8 text"),
    (["launch", "{dir}"], 2, "is a directory"),
    (["launch", "{passwd}"], 2, "must be a YAML mapping"),
    (["launch", "{missing}"], 2, "No such file"),
    (["launch", "{devnull}"], 2, "not a regular file"),
    (["launch", "{dup}"], 2, "appears twice"),
    (["launch", "{deep}"], 2, "nested more than"),
    (["launch", "--poll", "soon", "{dup}"], 2, "Invalid value for '--poll'"),
    (["launch", "--poll", "-1", "{dup}"], 2, "Invalid value for '--poll'"),  # refused before the job exists
    (["launch", "--poll", "nan", "--dry-run", "{dup}"], 2, "Invalid value for '--poll'"),
    (["plan", "{latin}"], 2, "is not UTF-8 text"),
    (["plan", "{dup}"], 2, "appears twice"),
    (["plan", "--top", "many", "{dup}"], 2, "Invalid value for '--top'"),
    (["plan", "--top", "-3", "{dup}"], 2, "Invalid value for '--top'"),
    (["plan", "--calibration", "{list_json}", "{good}"], 2, "is not a calibration file"),
    (["plan", "--calibration", "{object_json}", "{good}"], 2, "is not a calibration file"),
    (["logs", "-n", "-1", "no-such-job"], 2, "Invalid value for '--lines'"),
    (["report", "no-such-job", "--plot", "{missing}/x.png"], 2, "does not exist"),
    (["report", "no-such-job", "--plot", "x.jpg"], 2, "must end in .png or .svg"),
    (["simulate", "{dup}", "--plot", "x.jpg"], 2, "must end in .png or .svg"),
    (["simulate", "{dup}", "--policy", "bogus"], 2, "only with --availability-trace"),
    (["daemon", "--interval", "-1"], 2, "Invalid value for '--interval'"),
    (["daemon", "--gc-every", "inf"], 2, "Invalid value for '--gc-every'"),
    (["daemon", "--metrics-port", "99999"], 2, "Invalid value for '--metrics-port'"),
    (["dashboard", "--port", "99999"], 2, "Invalid value for '--port'"),
    (["dashboard", "--host", "999.1.1.1", "--port", "0"], 2, "--host"),
    (["model", "predict", "--model", "resnet_cifar_32", "--gpu", "t4", "--batch", "8", "--runtime", "bogus"], 2,
     "--runtime"),
    (["model", "predict", "--model", "resnet_cifar_32", "--gpu", "t4", "--batch", "8", "--precision", "fp8"], 2,
     "--precision"),
    (["status", "no-such-job"], 2, "no job 'no-such-job'"),
    (["logs", "no-such-job"], 2, "no job 'no-such-job'"),
    (["cancel", "no-such-job"], 2, "no job 'no-such-job'"),
    (["report", "--format", "xml"], 2, "--format"),
    (["report", "no-such-job"], 2, "no job 'no-such-job'"),
    (["simulate", "{missing}"], 2, "No such file"),
    (["simulate", "--runs", "many", "{dup}"], 2, "Invalid value for '--runs'"),
    (["daemon", "--interval", "often"], 2, "Invalid value for '--interval'"),
    (["gc", "--yes", "please"], 2, "unexpected extra argument"),
    (["catalog", "--gpu", "v200"], 2, "'v200' is not a GPU type"),
    (["db", "upgrade", "no-such-revision"], 2, "Can't locate revision"),
    (["db", "downgrade", "no-such-revision"], 2, "Can't locate revision"),
    (["model", "predict", "--model", "resnet_cifar_32", "--gpu", "v200", "--batch", "32"], 2, "'v200'"),
    (["model", "predict", "--model", "resnet_cifar_32", "--gpu", "t4", "--batch", "0"], 2, "'--batch'"),
    (["model", "calibrate", "--measurements", "{missing}"], 2, "cannot read"),
    (["model", "validate", "--measurements", "{missing}"], 2, "cannot read"),
    (["model", "profile", "--model", "bogus"], 2, "no cost-model profile"),
    (["image", "bake", "--spec", "{missing}"], 2, "No such file"),
    (["--db", "not a url", "status"], 2, "cannot parse the results-DB URL"),
]


def test_bad_input_for_each_verb_is_one_clear_line(tmp_path: Path, env: dict[str, str]) -> None:
    files = {k: str(v) for k, v in _files(tmp_path).items()}
    cases = [[a.format(**files) for a in args] for args, _, _ in BAD_INPUT]
    for (args, code, phrase), out in zip(BAD_INPUT, run_all(cases, env, cwd=tmp_path), strict=True):
        assert out.returncode == code, (args, out.returncode, out.stderr[-800:])
        assert len(lines(out.stderr)) == 1, (args, out.stderr)
        assert phrase.lower() in out.stderr.lower(), (args, out.stderr)
        no_traceback(out)
    assert not (tmp_path / "cli.db").exists() or _jobs(tmp_path / "cli.db") == 0


def test_plan_exits_nonzero_when_the_pinned_cluster_breaks_a_constraint(tmp_path: Path, env: dict[str, str]) -> None:
    spec = tmp_path / "over.yaml"
    spec.write_text("name: over-budget\nstorage: ./runs\ntraining: {hparam_set: resnet_cifar_56, train_steps: 640000}\n"
                    "cluster: {workers: [{gpu: v100, count: 8, spot: false}]}\npolicy: {budget_usd: 1, deadline: 1h}\n")
    out, js = run_all([["plan", str(spec)], ["plan", "--json", str(spec)]], env, cwd=tmp_path)
    assert out.returncode == 2 and "breaks a constraint" in out.stderr and "budget" in out.stderr
    assert js.returncode == 1 and '"chosen"' in js.stdout
    no_traceback(out)
    no_traceback(js)


def _jobs(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        return conn.execute("select count(*) from jobs").fetchone()[0] if "jobs" in tables else 0


@pytest.mark.parametrize("inventory", ["missing", "directory", "duplicate-host", "not-utf8"])
def test_launch_with_a_bad_ssh_inventory_records_nothing(inventory: str, tmp_path: Path, env: dict[str, str]) -> None:
    inv = tmp_path / "hosts.yaml"
    if inventory == "directory":
        inv.mkdir()
    elif inventory == "duplicate-host":
        inv.write_text("hosts:\n  - {name: a, host: 127.0.0.1, gpu: t4}\n  - {name: a, host: 127.0.0.2, gpu: t4}\n")
    elif inventory == "not-utf8":
        inv.write_bytes(b"hosts: \xff\n")
    spec = tmp_path / "ssh.yaml"
    spec.write_text("name: on-my-hosts\nprovider: {kind: ssh, inventory: hosts.yaml}\nstorage: ./runs\n"
                    "cluster: {workers: [{gpu: t4}]}\n")
    modes = [[], ["--detach"], ["--dry-run"]] if inventory == "missing" else [[]]
    for mode in modes:
        out = run(["launch", *mode, str(spec)], env, cwd=REPO)  # run elsewhere: found next to the spec
        assert out.returncode == 2, out.stderr
        assert "inventory" in out.stderr and "nothing was created" in out.stderr
        no_traceback(out)
    assert not (tmp_path / "cli.db").exists() or _jobs(tmp_path / "cli.db") == 0
    assert not (tmp_path / "runs").exists()


# One case of each kind above, through the real console script (a fresh interpreter, its stdout a pipe).
CONSOLE_SCRIPT_CASES: list[list[str]] = [
    ["--help"],
    ["--version"],
    ["db", "bogus"],
    ["model", "predict", "--help"],
    ["plan", "--no-such-option"],
    ["logs"],
    ["launch", "{latin}"],
    ["status", "no-such-job"],
    ["daemon", "--interval", "often"],
    ["--db", "not a url", "status"],
]


def test_in_process_answers_as_the_console_script(tmp_path: Path, env: dict[str, str]) -> None:
    files = {k: str(v) for k, v in _files(tmp_path).items()}
    cases = [[a.format(**files) for a in args] for args in CONSOLE_SCRIPT_CASES]
    with ThreadPoolExecutor(4) as pool:  # each is a fresh interpreter; 2 cores stay busy
        real = list(pool.map(lambda a: run_cli_subprocess(a, env, tmp_path, timeout=120), cases))
    for args, shell in zip(cases, real, strict=True):
        here = run(args, env, tmp_path)
        assert (here.returncode, here.stdout, here.stderr) == (shell.returncode, shell.stdout, shell.stderr), args
        no_traceback(shell)
