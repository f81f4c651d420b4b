"""A ``training.model: {torch: MODULE:FACTORY}`` factory never runs in the controller (issue 56, item 1).

`plan`, `launch --dry-run` and `model profile --torch` find the factory's file without running it (the cache
key is its source's sha256), refuse a builtin or standard-library callable before any process starts, and
profile the user's own factory in a child process (orchestrator/profiler/sandbox.py): no DB URL, no cloud
credentials, none of the spec's secrets, a wall-time and a memory limit, and however it ends, one line naming
the field, exit 2. Real processes throughout: every child Python that starts records itself through a
``sitecustomize`` on the PYTHONPATH the child inherits (the CLI itself runs in this interpreter, where site
ran long ago), so "nothing ran" and "a cache hit starts no child" are counted, not assumed.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.cli_inproc import run_cli  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESNET = f"{REPO}/examples/own-script/models.py:resnet50"
FIX = "point it at a factory in your own file, e.g. examples/own-script/models.py:resnet50"
SPEC = """name: sandbox
provider: {kind: local, time_scale: 60, revocations: none, emulation_k80_step_s: 0}
storage: ./runs
training:
  run: python train.py
  files: [train.py]
  secrets: [DEMO_TOKEN, {name: PASSED_ON, env: LC_SANDBOX_SPEC_SECRET}]
  train_steps: 200
  batch_per_worker: 32
  model: {torch: "REF"}
cluster: {workers: [{gpu: v100, count: 1, spot: false}]}
policy: {budget_usd: 1000, deadline: 100h}
pricing: {book: 2019-02}
"""
FACTORIES = '''
import json, os, signal, subprocess, sys, time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def tiny(batch):
    return torch.nn.Linear(8, 4), (torch.randn(batch, 8),)


def sysexit(batch):
    raise SystemExit("x")


def exit2(batch):
    os._exit(2)


def exit0(batch):
    os._exit(0)


def forged(batch):
    print(json.dumps({"profile": {}}), flush=True)  # printed output is never read as the answer
    os._exit(0)


def sigkill(batch):
    os.kill(os.getpid(), signal.SIGKILL)


def sleepy(batch):
    helper = subprocess.Popen(["sleep", "600"])  # what the factory starts must not outlive its profiling
    (HERE / "helper.pid").write_text(str(helper.pid))
    time.sleep(600)


def hog(batch):
    return bytearray(6 * 2**30)  # address space only (never touched): past a 3 GiB limit, harmless without one


def snoop(batch):
    seen = {"env": dict(os.environ), "cwd": os.getcwd(), "stdin": os.read(0, 1).decode()}
    (HERE / "seen.json").write_text(json.dumps(seen))
    return tiny(batch)
'''


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A spec's folder: train.py, the factories, and a sitecustomize that logs every Python started with it."""
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "train.py").write_text("print('training')\n")
    (spec_dir / "factories.py").write_text(FACTORIES)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import sys\nwith open({str(tmp_path / 'children.log')!r}, 'a') as fh:\n"
        "    fh.write(' '.join(sys.orig_argv) + '\\n')\n")
    return spec_dir


def children(folder: Path) -> list[str]:
    """The profiling children started so far (the processes that ran the sitecustomize)."""
    log = folder.parent / "children.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if "orchestrator.profiler.child" in line]


def spec(folder: Path, ref: str) -> Path:
    path = folder / "job.yaml"
    path.write_text(SPEC.replace("REF", ref))
    return path


def cli(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(args, {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(folder.parent / "site"), **env},
                   folder)


def one_error_line(out: subprocess.CompletedProcess[str], field: str = "training.model.torch") -> str:
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert out.stdout == "" and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), out.stderr
    return lines[0]


STDLIB = sysconfig.get_paths()["stdlib"]


@pytest.mark.parametrize("ref", ["os:system", "subprocess:getoutput", "builtins:exec", "os.path:join",
                                 f"{STDLIB}/shutil.py:rmtree", "orchestrator.cli.main:main",
                                 f"{REPO}/orchestrator/store/db.py:open_session"])
def test_a_builtin_or_standard_library_callable_is_refused_before_anything_runs(folder: Path, ref: str) -> None:
    path = spec(folder, ref)
    for verb in (["plan", str(path)], ["launch", "--dry-run", str(path)]):
        line = one_error_line(cli(folder, *verb))
        assert f"'{ref}' is not a model factory of your own" in line and FIX in line, line
    line = one_error_line(cli(folder, "model", "profile", "--torch", ref), field="--torch")
    assert "is not a model factory of your own" in line
    assert children(folder) == []  # refused in the controller: no process was started to import it


def test_a_users_file_handing_on_a_standard_library_function_is_refused(folder: Path) -> None:
    (folder / "sneaky.py").write_text("from os import system as build\nfrom subprocess import getoutput as out\n")
    line = one_error_line(cli(folder, "plan", str(spec(folder, "sneaky.py:build"))))
    assert "'sneaky.py:build' is not a model factory of your own (build is posix.system: posix is a built-in" \
        in line and FIX in line, line
    line = one_error_line(cli(folder, "plan", str(spec(folder, "sneaky.py:out"))))
    assert "out is subprocess.getoutput: subprocess is a standard-library module" in line, line
    assert len(children(folder)) == 2  # these two are refused once imported, in their child
    (folder / "code.py").write_text(FACTORIES)  # a file of the user's named like a standard-library module
    line = one_error_line(cli(folder, "plan", str(spec(folder, "code:tiny"))))
    assert "(code is a standard-library module; your code.py is named by its path: code.py:tiny)" in line, line
    assert len(children(folder)) == 2


@pytest.mark.parametrize(("factory", "env", "said"), [
    ("sysexit", {}, "the factory 'factories.py:sysexit' exited with status 1 while being profiled; its last "
                    "output: x"),
    ("exit2", {}, "the factory 'factories.py:exit2' exited with status 2 while being profiled"),
    ("exit0", {}, "the factory 'factories.py:exit0' exited (status 0) before its profile was written"),
    ("forged", {}, "the factory 'factories.py:forged' exited (status 0) before its profile was written; its last "
                   'output: {"profile": {}}'),
    ("sigkill", {}, "the factory 'factories.py:sigkill' was killed by SIGKILL while being profiled (if it ran past "
                    "the memory limit of 16384 MiB, ORCHESTRATOR_PROFILE_MEMORY_MB raises it)"),
    ("sleepy", {"ORCHESTRATOR_PROFILE_TIMEOUT_S": "8"},
     "the factory 'factories.py:sleepy' did not finish within 8 s while being profiled and was stopped "
     "(ORCHESTRATOR_PROFILE_TIMEOUT_S raises the limit)"),
    ("hog", {"ORCHESTRATOR_PROFILE_MEMORY_MB": "3072"},
     "the factory 'factories.py:hog' ran out of memory while being profiled (the limit is 3072 MiB; "
     "ORCHESTRATOR_PROFILE_MEMORY_MB raises it)"),
])
def test_however_the_factory_ends_the_cli_says_so_in_one_line_and_exits_2(folder: Path, factory: str,
                                                                          env: dict[str, str], said: str) -> None:
    line = one_error_line(cli(folder, "plan", str(spec(folder, f"factories.py:{factory}")), **env))
    assert line == f"error: training.model.torch: {said}", line
    assert len(children(folder)) == 1
    if factory == "sleepy":  # the process group is killed: what the factory started is gone too
        pid = int((folder / "helper.pid").read_text())
        for _ in range(100):  # the kill is sent; the reaping (by init) is not ours to time
            if _gone(pid):
                break
            time.sleep(0.1)
        assert _gone(pid)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def test_the_factory_sees_no_secret_of_the_controller(folder: Path) -> None:
    secrets = {"GOOGLE_APPLICATION_CREDENTIALS": "/nowhere/key.json", "AWS_SECRET_ACCESS_KEY": "aws-s3cr3t",
               "DEMO_TOKEN": "demo-s3cr3t", "LC_SANDBOX_SPEC_SECRET": "spec-s3cr3t", "MY_API_TOKEN": "tok-s3cr3t"}
    assert os.environ["ORCHESTRATOR_DB_URL"] and os.environ["ORCHESTRATOR_HOME"]  # set by conftest
    out = cli(folder, "plan", str(spec(folder, "factories.py:snoop")), "--json", LC_SANDBOX_OK="1", **secrets)
    assert out.returncode == 0, out.stderr
    seen = json.loads((folder / "seen.json").read_text())
    leaked = [k for k in seen["env"] if k in secrets or k.startswith(("ORCHESTRATOR_", "GOOGLE_", "AWS_"))]
    assert leaked == [] and not any("s3cr3t" in v or "sqlite" in v for v in seen["env"].values()), seen["env"]
    assert seen["env"]["LC_SANDBOX_OK"] == "1" and seen["env"]["PATH"]  # the allowlist, less the spec's secrets
    assert seen["cwd"] == str(folder) and seen["stdin"] == ""  # the spec's folder; stdin closed
    assert json.loads(out.stdout)["model"] == "torch:factories.py:snoop"


def test_resnet50_profiles_in_a_child_and_a_second_time_comes_from_the_cache(folder: Path) -> None:
    path = spec(folder, RESNET)
    first = cli(folder, "plan", str(path), "--json", "--host-load", "0")  # an idle host: the same plan twice
    assert first.returncode == 0, first.stderr
    assert len(children(folder)) == 1
    again = cli(folder, "model", "profile", "--torch", RESNET, "--json")
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["cached"] is True and doc["totals"]["params"] == 25_557_032
    second = cli(folder, "plan", str(path), "--json", "--host-load", "0")
    assert second.returncode == 0, second.stderr
    assert len(children(folder)) == 1  # the cache key is made in the controller: no child for a hit
    assert json.loads(second.stdout)["chosen"] == json.loads(first.stdout)["chosen"]


def test_a_dotted_module_is_found_without_importing_it(folder: Path) -> None:
    from orchestrator.profiler.factory_ref import resolve_factory

    pkg = folder / "mynets"  # a namespace package (no __init__.py) holding the module
    pkg.mkdir()
    (pkg / "small.py").write_text(f"from pathlib import Path\nPath({str(folder / 'imported')!r}).touch()\n"
                                  "import torch\n\ndef build(batch):\n"
                                  "    return torch.nn.Linear(8, 2), (torch.randn(batch, 8),)\n")
    src = resolve_factory("mynets.small:build", folder)
    assert (src.kind, src.path, src.root) == ("module", str(pkg / "small.py"), str(folder))
    assert not (folder / "imported").exists()
    out = cli(folder, "model", "profile", "--torch", "mynets.small:build", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["totals"]["params"] == 8 * 2 + 2 and (folder / "imported").exists()
    assert len(children(folder)) == 1


def test_the_controller_and_the_daemon_never_import_the_factory(folder: Path) -> None:
    (folder / "mine.py").write_text(
        "import os\nfrom pathlib import Path\n"
        "with (Path(__file__).parent / 'imported-by').open('a') as fh:\n    fh.write(f'{os.getpid()}\\n')\n"
        "import torch\n\ndef build(batch):\n    return torch.nn.Linear(8, 4), (torch.randn(batch, 8),)\n")
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "plan", str(spec(folder, "mine.py:build"))],
                            cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    importers = (folder / "imported-by").read_text().split()
    assert len(importers) == 1 and importers[0] != str(proc.pid)  # the child imported it, not `plan`
    (folder / "imported-by").unlink()
    # The daemon's code (every module of the control layer) reads the profile by name and imports nothing of it.
    code = ("import importlib, json, pkgutil, sys\nimport orchestrator.control as control\n"
            "for m in pkgutil.walk_packages(control.__path__, 'orchestrator.control.'):\n"
            "    importlib.import_module(m.name)\n"
            "from orchestrator.costmodel.profiles import get_profile\n"
            "p = get_profile('torch:mine.py:build')\n"
            "print(json.dumps({'params': p.params, 'modules': [n for n in sys.modules if n == 'torch' or "
            "n.startswith(('orchestrator.profiler', 'torch.', '_factory_')) or n == 'mine']}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"params": 8 * 4 + 4, "modules": []}
    assert not (folder / "imported-by").exists()


def test_only_the_profiler_imports_the_profiler_or_loads_code_by_name() -> None:
    # The static half of the pin: no module below the CLI (the daemon's layers) imports orchestrator.profiler,
    # and nothing outside the profiler imports a module by a name or a path it is given.
    loaders = {"import_module", "__import__", "exec_module", "spec_from_file_location", "run_path", "run_module"}
    found = []
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        rel = path.relative_to(REPO / "orchestrator").parts
        if rel[0] == "profiler":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if rel[0] != "cli" and any(n.startswith("orchestrator.profiler") for n in names):
                found.append(f"{path}: imports {names}")
            if isinstance(node, ast.Attribute | ast.Name) and getattr(node, "attr", getattr(node, "id", "")) in loaders:
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_torchvision_refs_stay_a_librarys_factory() -> None:
    from orchestrator.profiler.factory_ref import ProfileError, resolve_factory

    try:
        src = resolve_factory("torchvision:resnet18")
    except ProfileError as exc:  # not installed here: the same advice as before, not a refusal
        assert "torchvision is not installed" in str(exc)
    else:
        assert src.kind == "torchvision" and src.fingerprint.startswith("torchvision ")


def test_the_limits_come_from_the_environment_and_are_checked(folder: Path) -> None:
    line = one_error_line(cli(folder, "plan", str(spec(folder, "factories.py:tiny")),
                              ORCHESTRATOR_PROFILE_TIMEOUT_S="soon"))
    assert "ORCHESTRATOR_PROFILE_TIMEOUT_S='soon' is not a number" in line
    assert children(folder) == []
