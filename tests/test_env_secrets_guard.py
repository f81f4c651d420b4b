"""Issue 56 item 6: the task's environment from a spec (env:, secrets:) and who may reach the VMs' ssh.

* `launch --dry-run` refuses a secret this machine cannot read, as `launch` does (one check, before anything);
* one variable in both env: and secrets: (or a secret twice) is refused: the task would get one of two values;
* loader variables (LD_PRELOAD, LD_LIBRARY_PATH, DYLD_*, PYTHONHOME, ...) are refused as PATH is, in env: and as
  a secret's name;
* ssh_source_ranges open to the whole internet (0.0.0.0/0, ::/0) is allowed, with a warning from `plan` and the
  dry run.

The real CLI in this interpreter (tests/cli_inproc.py); the gce dry run against the Compute API emulator.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.model.spec import SpecError, validate_spec
from orchestrator_testing.gce_emulator import GceEmulator
from tests.cli_inproc import run_cli

RUN: dict[str, Any] = {"name": "envjob", "storage": "./runs",
                       "training": {"run": "python train.py --steps 10", "files": ["train.py"], "train_steps": 10},
                       "cluster": {"workers": [{"gpu": "v100", "count": 1, "spot": False}]},
                       "pricing": {"book": "2019-02"}}
ABSENT = "ORCH_TEST_ABSENT_SECRET"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/o.db",
            "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "COLUMNS": "200", **extra}


def _spec(tmp_path: Path, **training: Any) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    doc = {**RUN, "training": {**RUN["training"], **training}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _one_error_line(out: Any) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), (out.returncode, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr
    return str(lines[0])


def test_the_dry_run_refuses_a_secret_this_machine_lacks_as_the_launch_does(tmp_path: Path) -> None:
    spec = _spec(tmp_path, secrets=[ABSENT])
    dry = _one_error_line(run_cli(["launch", "--dry-run", str(spec)], _env(tmp_path), tmp_path))
    launch = _one_error_line(run_cli(["launch", "--detach", str(spec)], _env(tmp_path), tmp_path))
    assert f"training.secrets {ABSENT}: the controller's environment has no {ABSENT}" in dry, dry
    assert dry == launch  # one check, one message
    assert not (tmp_path / "o.db").exists() and not (tmp_path / "home").exists()
    ok = run_cli(["launch", "--dry-run", str(spec)], _env(tmp_path, **{ABSENT: "s3cret"}), tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "s3cret" not in ok.stdout + ok.stderr


def test_a_variable_in_both_env_and_secrets_or_a_secret_twice_is_refused(tmp_path: Path) -> None:
    both = _one_error_line(run_cli(["plan", str(_spec(tmp_path, env={"HF_TOKEN": "x"}, secrets=["HF_TOKEN"]))],
                                   _env(tmp_path), tmp_path))
    assert "training.secrets: HF_TOKEN is also in training.env; give it in one place" in both, both
    twice = _one_error_line(run_cli(["plan", str(_spec(tmp_path, secrets=["HF_TOKEN", {"name": "HF_TOKEN",
                                                                                       "file": "t.txt"}]))],
                                    _env(tmp_path), tmp_path))
    assert "training.secrets: HF_TOKEN is listed twice" in twice, twice


LOADER = ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "PYTHONHOME", "PYTHONSTARTUP",
          "PYTHONUSERBASE", "BASH_ENV", "GCONV_PATH"]


def test_ld_preload_is_refused_by_plan_dry_run_and_launch_as_path_is(tmp_path: Path) -> None:
    spec = _spec(tmp_path, env={"LD_PRELOAD": "/tmp/evil.so"})
    for verb in (("plan",), ("launch", "--dry-run"), ("launch", "--detach")):
        line = _one_error_line(run_cli([*verb, str(spec)], _env(tmp_path), tmp_path))
        assert "training.env: LD_PRELOAD is read by the loader or the interpreter" in line, (verb, line)
        assert "pick another name" in line, line
    path = _one_error_line(run_cli(["plan", str(_spec(tmp_path, env={"PATH": "/tmp"}))], _env(tmp_path), tmp_path))
    assert "training.env: PATH is set by torchrun / the orchestrator; pick another name" in path, path
    assert not (tmp_path / "o.db").exists()


@pytest.mark.parametrize("name", LOADER)
def test_loader_variables_are_refused_in_env_and_as_a_secret_s_name(name: str) -> None:
    for training, field in (({"env": {name: "x"}}, "training.env"), ({"secrets": [name]}, "training.secrets[0].name")):
        with pytest.raises(SpecError) as caught:
            validate_spec({**RUN, "training": {**RUN["training"], **training}})
        assert [e.path for e in caught.value.errors] == [field], caught.value.errors
        assert f"{name} is read by the loader or the interpreter" in caught.value.errors[0].message
    validate_spec({**RUN, "training": {**RUN["training"], "env": {"MY_LD_PRELOAD_NOTE": "x"}}})  # a name like it


@pytest.fixture(scope="module")
def emu() -> Iterator[GceEmulator]:
    with GceEmulator({"boot_delay_s": 0.05, "op_delay_s": 0.01, "operation_wait_max_s": 5.0}) as emulator:
        yield emulator


def _gce(tmp_path: Path, emu: GceEmulator, ranges: list[str]) -> Path:
    doc = {"name": "sshwide", "storage": "gs://my-bucket/x",
           "provider": {"kind": "gce", "project": "my-project-1", "zones": ["us-central1-a"],
                        "api_endpoint": emu.url, "ssh_source_ranges": ranges},
           "training": {"job": "resnet-cifar", "hparam_set": "resnet_cifar_15", "mode": "sync", "train_steps": 100,
                        "batch_per_worker": 32}, "cluster": {"workers": [{"gpu": "t4", "count": 1}]}}
    path = tmp_path / "gce.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("wide", ["0.0.0.0/0", "::/0"])
def test_ssh_open_to_the_internet_is_a_warning_of_plan_and_the_dry_run(tmp_path: Path, emu: GceEmulator,
                                                                       wide: str) -> None:
    warning = f"warning: provider.ssh_source_ranges: {wide} lets every address on the internet try ssh"
    spec = _gce(tmp_path, emu, ["203.0.113.7/32", wide])
    plan = run_cli(["plan", str(spec)], _env(tmp_path), tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert warning in " ".join(plan.stdout.split()), plan.stdout[-1500:]
    listed = run_cli(["plan", "--format", "json", str(spec)], _env(tmp_path), tmp_path)
    assert any(w.startswith(warning.removeprefix("warning: ")) for w in json.loads(listed.stdout)["warnings"])
    dry = run_cli(["launch", "--dry-run", str(spec)], _env(tmp_path), tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert warning in dry.stderr, dry.stderr
    json.loads(dry.stdout)  # stdout stays the requests' JSON
    narrow = run_cli(["launch", "--dry-run", str(_gce(tmp_path, emu, ["203.0.113.7/32"]))], _env(tmp_path), tmp_path)
    assert narrow.returncode == 0 and "ssh_source_ranges" not in narrow.stderr, narrow.stderr
