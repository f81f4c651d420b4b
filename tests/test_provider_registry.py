"""The provider registry: one entry per provider kind, and a gce endpoint's differences come from settings."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from orchestrator.model.errors import UserError
from orchestrator.model.instances import ObservedInstance, ObservedState, Role
from orchestrator.model.spec import GceProvider, JobSpec, ProviderSpec, validate_spec
from orchestrator.model.spec.base import SpecError
from orchestrator.providers import registry
from orchestrator.providers.base import TF_PORT
from orchestrator.providers.gce.backend import TF_PORTS, firewall_ports
from orchestrator_testing.cloud import provider_settings


def _kinds() -> set[str]:
    union = typing.get_args(ProviderSpec)[0]
    return {str(cls.model_fields["kind"].default) for cls in typing.get_args(union)}


def gce_spec(**provider: object) -> JobSpec:
    return validate_spec(
        {
            "name": "registry",
            "provider": {"kind": "gce", "project": "test-project", **provider},  # a project key overrides
            "training": {"job": "command", "command": "sleep 1", "train_steps": 1, "mode": "sync"},
            "cluster": {
                "parameter_servers": {"count": 0},
                "workers": [{"gpu": "t4", "count": 1, "zone": "us-central1-c"}],
            },
        }
    )


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_cache", {})


def test_every_provider_kind_has_one_registry_entry() -> None:
    assert set(registry.KINDS) == _kinds() == {"local", "gce", "ssh"}


def test_local_backend_gives_each_task_its_own_port_and_keeps_addresses() -> None:
    spec = validate_spec(
        {
            "name": "registry",
            "training": {"job": "command", "command": "sleep 1", "train_steps": 1, "mode": "sync"},
            "cluster": {"parameter_servers": {"count": 0}, "workers": [{"gpu": "k80", "count": 1}]},
        }
    )
    backend = registry.backend_for(spec)
    assert backend is registry.backend_for(spec)  # cached: one provider.list() per pass for its jobs
    assert backend.fixed_task_port is None and backend.stable_addresses
    assert backend.task_port(None) != 0 and backend.task_port(4321) == 4321


def test_gce_defaults_are_real_gce() -> None:
    spec = gce_spec(api_endpoint="http://127.0.0.1:9")  # no request is sent: clients are built lazily
    backend = registry.backend_for(spec)
    # The default image gets the job's framework at first boot: tasks wait for it (jobs/boot_python.sh).
    assert backend.python == "jobs/boot_python.sh" and backend.fixed_task_port == TF_PORT
    assert not backend.stable_addresses
    observed = ObservedInstance(
        name="registry-1a2b3c-worker-0-0",
        job_id="registry-1a2b3c",
        role=Role.WORKER,
        index=0,
        generation=0,
        zone="us-central1-c",
        state=ObservedState.RUNNING,
        host="10.0.0.7",
    )
    ep = backend.endpoint(observed)
    assert (ep.user, ep.host, ep.port, ep.workdir) == ("orchestrator", "10.0.0.7", 22, "orchestrator")
    backend.provider.close()


def test_an_emulator_is_reached_by_settings_alone(tmp_path: Path) -> None:
    settings = provider_settings("http://127.0.0.1:9")
    backend = registry.backend_for(gce_spec(**settings))
    assert backend.python == settings["python"] and backend.fixed_task_port is None and backend.stable_addresses
    observed = ObservedInstance(
        name="registry-1a2b3c-worker-0-0",
        job_id="registry-1a2b3c",
        role=Role.WORKER,
        index=0,
        generation=0,
        zone="us-central1-c",
        state=ObservedState.RUNNING,
        host="127.0.0.1",
        ssh_port=2200,
        workdir=str(tmp_path),
    )
    ep = backend.endpoint(observed)  # what the endpoint reported: the VM's sshd port and work directory
    assert (ep.user, ep.port, ep.workdir) == (settings["ssh_user"], 2200, str(tmp_path))
    backend.provider.close()


def test_firewall_opens_a_task_port_outside_the_default_range() -> None:
    assert firewall_ports(GceProvider(project="test-project")) == TF_PORTS
    assert firewall_ports(GceProvider(project="test-project", task_port=8470)) == f"{TF_PORTS},8470-8471"
    # a PyTorch job's run-time ports (c10d store, gloo pairs, torchft replica groups), between the job's VMs only
    assert firewall_ports(GceProvider(project="test-project"), "pytorch") == "1024-65535"


def test_capabilities_are_asked_of_the_registry_never_of_a_kind() -> None:
    """cli/ and control/ ask for a capability (set-up check, dry run, quotas, image baking), not for ``gce``."""
    local = validate_spec({"name": "registry",
                           "training": {"job": "command", "command": "sleep 1", "train_steps": 1, "mode": "sync"},
                           "cluster": {"parameter_servers": {"count": 0}, "workers": [{"gpu": "k80", "count": 1}]}})
    registry.check_setup(local)  # the local provider needs nothing
    assert registry.dry_run_for(local) is None and registry.quota_source(local) is None
    with pytest.raises(UserError, match="provider.kind: gce"):
        registry.image_builder_for(local)
    gce = gce_spec(api_endpoint="http://127.0.0.1:9")  # a loopback endpoint: anonymous credentials
    registry.check_setup(gce, probe=False)
    assert registry.dry_run_for(gce) is not None and registry.image_builder_for(gce).kind == "gce"
    assert registry.backend_for(gce).cloud_deadline is not None and registry.backend_for(local).cloud_deadline is None
    with pytest.raises(SpecError, match="provider.project: 'Bad_Project' is not a GCE project id"):
        gce_spec(project="Bad_Project")  # refused by the spec's typed field, before any set-up check
