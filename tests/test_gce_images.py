"""The default gce image carries the job's framework (data/gce_images.csv): Google's PyTorch Deep Learning VM
family for PyTorch jobs, the base family with TensorFlow installed at first boot for TensorFlow jobs (Google
has no current TensorFlow family). The dry run shows it in every body, the backend's key includes the
framework, tasks wait for the first-boot set-up, an image with only the other framework is refused (exit 2,
one line, nothing created), and `plan` says the first-boot figures are estimates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.cloud import compute_v1

from orchestrator.control import execute
from orchestrator.model import timings
from orchestrator.model.gce_rules import load_gce_rules
from orchestrator.model.spec import validate_spec
from orchestrator.model.torch_spec import payload_framework
from orchestrator.providers import registry
from orchestrator.providers.gce import backend as gce_backend
from orchestrator.providers.gce.dry_run import gce_dry_run
from orchestrator.transport.base import wrapped_command
from tests.cli_inproc import run_cli
from tests.test_gce_rules import DEBIAN, GROUPS, doc

REPO = Path(__file__).resolve().parent.parent
FAMILY = "projects/deeplearning-platform-release/global/images/family/"
TORCH_FAMILY = FAMILY + "pytorch-2-9-cu129-ubuntu-2204-nvidia-580"
BASE_FAMILY = FAMILY + "common-cu129-ubuntu-2204-nvidia-580"
EXPECTED = {"pytorch": (TORCH_FAMILY, "dlvm"), "tensorflow": (BASE_FAMILY, "dlvm-base")}


def framework_doc(framework: str, group: dict[str, Any], zone: str, **provider: Any) -> dict[str, Any]:
    document = doc(group, zone, **provider)
    document["training"]["framework"] = framework
    return document


@pytest.mark.parametrize("framework", list(EXPECTED))
@pytest.mark.parametrize("name", list(GROUPS))
def test_every_body_boots_the_frameworks_image_and_sets_it_up_at_first_boot(name: str, framework: str) -> None:
    group, zone, _ = GROUPS[name]
    image, route = EXPECTED[framework]
    out = gce_dry_run(validate_spec(framework_doc(framework, group, zone)))
    for insert in out["instances.insert"]:
        body = insert["body"]
        compute_v1.Instance.from_json(json.dumps(body))  # strict: an unknown field would raise
        assert body["disks"][0]["initializeParams"]["sourceImage"] == insert["image"] == image
        assert (insert["framework"], insert["image_route"], insert["first_boot_setup"]) == (framework, route, True)
        spot = body["scheduling"].get("provisioningModel") == "SPOT"
        assert insert["boot_s"] == timings.BOOT_S + timings.image_boot_extra_s(route) + (15.0 if spot else 0.0)
        assert "ESTIMATE" in insert["boot_s_source"]
        script = {i["key"]: i["value"] for i in body["metadata"]["items"]}["startup-script"]
        # The payload's packages (and, on the base family, the framework) come from the bake recipe itself.
        assert f"FRAMEWORK={framework} " in script and "ORCHESTRATOR_RECIPE" in script
        assert (REPO / "images" / "gpu-worker.sh").read_text() in script
        gpu_vm = "-worker-" in body["name"]
        assert ("SKIP_GPU_CHECK=0" in script) == gpu_vm and ("SKIP_GPU_CHECK=1" in script) == (not gpu_vm)


def test_the_framework_comes_from_the_payload() -> None:
    group, zone, _ = GROUPS["l4"]
    base = doc(group, zone)
    assert payload_framework(validate_spec(base)) == "pytorch"
    assert payload_framework(validate_spec(framework_doc("tensorflow", group, zone))) == "tensorflow"
    run = {**base, "training": {"run": "python train.py", "train_steps": 10}}
    assert payload_framework(validate_spec(run)) == "pytorch"  # torchrun
    command = {**base, "training": {"job": "command", "command": "python train.py", "train_steps": 10}}
    assert payload_framework(validate_spec(command)) == "tensorflow"  # TF_CONFIG is what a command gets
    command["training"]["model"] = {"torch": "torchvision:resnet18"}
    assert payload_framework(validate_spec(command)) == "pytorch"


def test_the_backend_key_and_settings_follow_the_framework(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_cache", {})
    group, zone, _ = GROUPS["l4"]
    torch = validate_spec(doc(group, zone, api_endpoint="http://127.0.0.1:9"))  # clients are built lazily
    tf = validate_spec(framework_doc("tensorflow", group, zone, api_endpoint="http://127.0.0.1:9"))
    assert torch.provider == tf.provider  # one provider section ...
    a, b = registry.backend_for(torch), registry.backend_for(tf)
    assert a is not b and a.key != b.key  # ... two backends: the default image differs
    assert {a.provider.settings.framework, b.provider.settings.framework} == {"pytorch", "tensorflow"}  # type: ignore[attr-defined]
    assert a.provider.settings.image_for("l4") == TORCH_FAMILY  # type: ignore[attr-defined]
    assert b.provider.settings.image_for("l4") == BASE_FAMILY  # type: ignore[attr-defined]
    assert a.python == b.python == gce_backend.BOOT_PYTHON  # tasks wait for the first-boot set-up
    for backend in (a, b):
        backend.provider.close()  # type: ignore[attr-defined]


def test_a_baked_image_has_no_first_boot_setup() -> None:
    group, zone, _ = GROUPS["l4"]
    spec = validate_spec(doc(group, zone, image="images/family/orchestrator-worker-torch-l4"))
    provider = spec.provider.as_gce()
    assert provider is not None
    settings = gce_backend.request_settings(provider, "pytorch")
    assert not settings.boot_setup("l4") and gce_backend.task_python(provider, settings) == "python3"
    insert = gce_dry_run(spec)["instances.insert"][0]
    assert insert["image_route"] == "baked" and not insert["first_boot_setup"]
    assert "startup-script" not in {i["key"] for i in insert["body"]["metadata"]["items"]}
    # Google's installer route: the driver first, then the framework, in one startup script.
    installer = validate_spec(doc(group, zone, image=DEBIAN, gpu_driver="installer"))
    body = gce_dry_run(installer)["instances.insert"][0]["body"]
    script = {i["key"]: i["value"] for i in body["metadata"]["items"]}["startup-script"]
    assert script.index("cuda_installer.pyz") < script.index("FRAMEWORK=pytorch ")


def test_a_command_task_waits_for_the_first_boot_setup_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_cache", {})
    group, zone, _ = GROUPS["l4"]
    line = "python train.py --lr 0.1 'a b'"
    command = {"job": "command", "command": line, "train_steps": 10}
    spec = validate_spec({**doc(group, zone, api_endpoint="http://127.0.0.1:9"), "training": command})
    backend = registry.backend_for(spec)
    backend.provider.close()
    assert backend.python == gce_backend.BOOT_PYTHON  # the base family: TensorFlow installed at first boot
    argv = execute._task_argv(spec, backend.python, backend.command_prefix)
    # The one wait (jobs/boot_wait.sh, fixed text), then the command's argv as on any provider: one argument.
    assert argv == ["/bin/sh", "-c", (REPO / "jobs" / "boot_wait.sh").read_text(), "boot_wait", "/bin/sh", "-c", line]
    assert execute._task_argv(spec, "python3") == ["/bin/sh", "-c", line]  # local and ssh: no prefix
    # An image with its framework baked in (or a spec's own interpreter): nothing to wait for.
    torch_command = {**command, "model": {"torch": "torchvision:resnet18"}}  # a PyTorch job: the torch image's
    baked = validate_spec({**doc(group, zone, image="images/family/orchestrator-worker-torch-l4",
                                 api_endpoint="http://127.0.0.1:9"), "training": torch_command})
    other = registry.backend_for(baked)
    other.provider.close()
    assert other.python == "python3" and other.command_prefix == ()


def test_a_task_waits_for_the_first_boot_setup(tmp_path: Path) -> None:
    wrapper = REPO / gce_backend.BOOT_PYTHON
    assert os.access(wrapper, os.X_OK)  # pushed with jobs/ (tar keeps the mode) and run as the interpreter
    boot, work = tmp_path / "boot", tmp_path / "work"
    boot.mkdir()
    work.mkdir()
    env = {**os.environ, "ORCHESTRATOR_BOOT_DIR": str(boot), "ORCHESTRATOR_BOOT_PYTHON": sys.executable,
           "ORCHESTRATOR_BOOT_WAIT_S": "0"}
    # A `job: command` task's argv as the transports start it (wrapped_command: quoted, logged, exit kept);
    # its arguments must reach the command unchanged, never read by a shell.
    command = [*gce_backend.command_prefix(gce_backend.BOOT_PYTHON),
               sys.executable, "-c", "import sys; print(sys.argv[1:])", "a b", "$HOME'; exit 9"]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(wrapper), "-c", "print('trained')"], capture_output=True, text=True, env=env,
                              timeout=30)

    def run_command() -> tuple[int, str]:
        (work / "logs" / "task.log").unlink(missing_ok=True)
        subprocess.run(["/bin/sh", "-c", wrapped_command("task", command)], cwd=work, env=env, timeout=30,
                       check=True)
        return int((work / "procs" / "task.exit").read_text()), (work / "logs" / "task.log").read_text()

    out = run()
    assert out.returncode == 3 and "not done after 0s" in out.stderr  # no set-up yet: never the bare python3
    code, log = run_command()
    assert code == 3 and "not done after 0s" in log
    (boot / "boot.log").write_text("pip: no matching distribution\n")
    (boot / "boot-failed").touch()
    out = run()
    assert out.returncode == 3 and "no matching distribution" in out.stderr
    code, log = run_command()
    assert code == 3 and "no matching distribution" in log
    (boot / "boot-failed").unlink()
    (boot / "boot-ready").touch()
    out = run()
    assert out.returncode == 0 and out.stdout.strip() == "trained"
    code, log = run_command()
    assert code == 0 and log.strip() == str(["a b", "$HOME'; exit 9"])


def test_an_image_with_only_the_other_framework_is_refused_exit_2(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "ORCHESTRATOR_DB_URL": f"sqlite:///{home / 'o.db'}",
           "PYTHONPATH": str(REPO)}
    group, zone, _ = GROUPS["l4"]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(framework_doc("tensorflow", group, zone, image=TORCH_FAMILY)))
    for dry in ([], ["--dry-run"]):  # the console script, then in this interpreter (tests/cli_inproc.py)
        args = ["launch", *dry, str(path)]
        out = run_cli(args, env, Path.cwd()) if dry else subprocess.run(
            [sys.executable, "-m", "orchestrator.cli.main", *args], capture_output=True, text=True, env=env,
            timeout=120)
        assert out.returncode == 2, out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert "has no TensorFlow" in line and "leave provider.image out (common-cu129-ubuntu-2204-nvidia-580" in line
        assert "orchestrator image bake --role worker --gpu l4 --framework tensorflow" in line
        assert "nothing was created" in line and "Traceback" not in out.stderr
    assert not (home / "o.db").exists()
    # The base family trains either framework (it is installed at first boot): not refused.
    validate_spec(framework_doc("pytorch", group, zone, image=BASE_FAMILY))
    assert load_gce_rules().framework_message(BASE_FAMILY, "p", "tensorflow", "l4") is None


def test_plan_says_the_first_boot_figures_are_estimates() -> None:
    from orchestrator.costmodel.planner import plan

    group, zone, _ = GROUPS["l4"]
    notes = plan(validate_spec(framework_doc("tensorflow", group, zone))).notes
    (boot,) = [n for n in notes if n.startswith("first boot")]
    assert "dlvm-base +300 s" in boot and "ESTIMATES, not measured" in boot


def test_a_flex_start_request_says_how_long_it_waits_for_capacity() -> None:
    from orchestrator.model.timings import FLEX_START_REQUEST_VALID_S

    group, zone, _ = GROUPS["h100-flex"]
    (insert,) = gce_dry_run(validate_spec(doc(group, zone)))["instances.insert"]
    body = insert["body"]
    # v1 carries requestValidForDuration in the instance's params (google-cloud-compute 1.57: InstanceParams),
    # next to Google's other flex-start fields; a Spot VM has none.
    assert body["params"] == {"requestValidForDuration": {"seconds": str(int(FLEX_START_REQUEST_VALID_S))}}
    assert compute_v1.Instance.from_json(json.dumps(body)).params.request_valid_for_duration.seconds == 1800
    spot_group, spot_zone, _ = GROUPS["h100"]
    assert "params" not in gce_dry_run(validate_spec(doc(spot_group, spot_zone)))["instances.insert"][0]["body"]


def test_a_vm_s_first_boot_installs_the_extras_pins() -> None:
    """images/gpu-worker.sh installs the versions pyproject.toml's extras pin, torchft among them: a PyTorch job
    runs on replica groups by default (model.torch_spec.fault_tolerance), so a VM without torchft fails it."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = dict(p.split("==") for p in extras["train"] + extras["torch"] if "==" in p)
    script = (REPO / "images" / "gpu-worker.sh").read_text()
    for package, var in (("tensorflow", "TF_VERSION"), ("torch", "TORCH_VERSION"), ("torchft", "TORCHFT_VERSION")):
        assert f'{var}="{pins[package]}"' in script, (package, pins[package])
    assert 'common+=("torchft==$TORCHFT_VERSION")' in script and "torch.distributed.checkpoint, torchft;" in script
