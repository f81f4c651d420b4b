"""Every listing verb piped at COLUMNS=80: no line over 80, no id split across lines; --format json and csv parse.

Each verb runs with stdout a pipe, as `orchestrator status | less` would, on a finished job's real rows
(tests/obs_helpers.py) in a real SQLite results DB: in this interpreter as a fresh process would start
(tests/cli_inproc.py), and a few through the real console script, which must print the same.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.cli import main as cli_main
from orchestrator.cli.listing import Col, cut, cut_words, fit_widths, unwrap, wrap
from orchestrator.store.db import open_session
from tests.cli_inproc import run_cli, run_cli_subprocess
from tests.obs_helpers import finished_job

REPO = Path(__file__).resolve().parent.parent
JOB = "obs-abc123"
INSTANCES = [f"{JOB}-worker-0-0", f"{JOB}-worker-0-1", f"{JOB}-worker-1-0", f"{JOB}-ps-0-0", f"{JOB}-chief-0-0"]

VERBS: list[list[str]] = [
    ["catalog"],
    ["status"],
    ["status", JOB],
    ["plan", "examples/local-hetero.yaml"],
    ["plan", "examples/gce-plan-search.yaml"],
    ["logs", JOB, "-n", "500"],
    ["db", "current"],
    ["model", "profile"],
    ["model", "profile", "--model", "transformer_base", "--gpu", "v100"],
    ["model", "predict", "--model", "resnet_cifar_32", "--gpu", "v100", "--batch", "128"],
    ["model", "validate", "--measurements", "data/measurements"],
]
IDS = {"status": [JOB, *INSTANCES], "logs": [JOB, *INSTANCES]}


@pytest.fixture(scope="module")
def db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("listing")
    url = f"sqlite:///{tmp / 'obs.db'}"
    with open_session(url) as session:
        assert finished_job(session, tmp / "runs") == JOB
    return url


def _env(url: str) -> dict[str, str]:
    return {**os.environ, "ORCHESTRATOR_DB_URL": url, "COLUMNS": "80"}


def _run(url: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    # stdout is a pipe, as in `orchestrator status | less` (no terminal, so no terminal width)
    return run_cli_subprocess(args, _env(url), REPO)


def _run_all(url: str, cases: Sequence[Sequence[str]]) -> list[subprocess.CompletedProcess[str]]:
    return [run_cli(a, _env(url), REPO) for a in cases]


def test_every_listing_verb_fits_80_columns_piped(db_url: str) -> None:
    for args, out in zip(VERBS, _run_all(db_url, VERBS), strict=True):
        assert out.returncode == 0, (args, out.stderr[-800:])
        lines = out.stdout.splitlines()
        assert lines, args
        long = [ln for ln in lines if len(ln) > 80]
        assert not long, (args, long[:3])
        for ident in IDS.get(args[0], []) if len(args) > 1 or args[0] == "status" else []:
            if ident in INSTANCES and args == ["status"]:
                continue  # the job list names jobs only
            assert any(ident in ln for ln in lines), (args, ident)  # whole on one line, never split
        assert not [ln for ln in lines if re.search(r"obs-abc[\w-]*…", ln)], args  # no id cut short


@pytest.mark.parametrize("args", [["status", JOB], ["model", "profile"]], ids=" ".join)
def test_the_console_script_prints_what_the_in_process_run_does(db_url: str, args: list[str]) -> None:
    shell, here = _run(db_url, args), run_cli(args, _env(db_url), REPO)
    assert shell.returncode == 0, shell.stderr[-800:]
    assert (here.returncode, here.stdout, here.stderr) == (shell.returncode, shell.stdout, shell.stderr)


def _in_process(url: str, args: Sequence[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
                ) -> str:
    """The verb run in this interpreter (json and csv are plain writes to stdout; no width to check)."""
    monkeypatch.setenv("ORCHESTRATOR_DB_URL", url)
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["orchestrator", *args])
    with pytest.raises(SystemExit) as done:
        cli_main.main()
    out = capsys.readouterr()
    assert done.value.code == 0, (args, out.err[-800:])
    return out.out


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_every_listing_verb_has_json_and_csv(db_url: str, fmt: str, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    for args in VERBS:
        text = _in_process(db_url, [*args, "--format", fmt], monkeypatch, capsys)
        if fmt == "json":
            assert json.loads(text), args
        else:
            rows = list(csv.reader(io.StringIO(text)))
            assert len(rows) >= 2 and all(len(r) == len(rows[0]) for r in rows), (args, rows[:3])
    if fmt == "json":
        catalog = json.loads(_in_process(db_url, ["catalog", "--format", "json"], monkeypatch, capsys))
        assert all(r["source"] for r in catalog["gpus"]) and all(r["source"] for r in catalog["machine_types"])
        status = json.loads(_in_process(db_url, ["status", JOB, "--format", "json"], monkeypatch, capsys))
        assert {i["name"] for i in status["instances"]} == set(INSTANCES) and status["events"]
    else:
        rows = list(csv.DictReader(io.StringIO(_in_process(db_url, ["catalog", "--format", "csv"], monkeypatch,
                                                           capsys))))
        h100 = next(r for r in rows if r["gpu"] == "h100")
        assert h100["gce_accelerator"] == "nvidia-h100-80gb" and float(h100["spot_usd_hr"]) > 0
        assert all(r["source"] and r["price_source"] for r in rows if r["spot_usd_hr"])  # a source per row


def test_a_bad_format_is_one_line_exit_2(db_url: str) -> None:
    out = _run(db_url, ["catalog", "--format", "xml"])
    assert out.returncode == 2 and "--format: 'xml' is not one of table, json, csv" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""


def test_fit_cuts_text_never_ids_or_numbers() -> None:
    cols = [Col("job", whole=True), Col("n", right=True), Col("reason")]
    rows = [["local-demo-23dc25", "12345", "a long reason " * 10]]
    widths = fit_widths(cols, rows, 40)
    assert widths[:2] == [17, 5] and sum(widths) + 4 == 40
    assert cut("abcdefgh", 5) == "abcd…" and cut("abc", 5) == "abc"
    # A list of names is cut between names: "g2-standard-4…" would read as another machine type.
    names = "2x l4 (g2-standard-48), 1x a100"
    assert cut_words(names, 20) == "2x l4…" and cut_words(names, 22) == "2x l4 (g2-standard-48…"
    assert cut_words(names, 26) == "2x l4 (g2-standard-48)…" and cut_words(names, 40) == names
    assert cut_words("g2-standard-48", 6) == "g2-st…"  # one word: cut as any text
    wrapped = wrap("12:00:00 worker-1 (local-demo-23dc25-worker-1-0): training -> revoked: preemption notice", 30)
    assert all(len(ln) <= 30 for ln in wrapped if " " in ln.strip())
    assert any("local-demo-23dc25-worker-1-0" in ln for ln in wrapped)  # never split at its hyphens
    assert unwrap("\n".join(wrapped))[0].startswith("12:00:00 worker-1 (local-demo-23dc25-worker-1-0): training")
