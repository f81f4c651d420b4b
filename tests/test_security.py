"""Issue 13 item 10: who may reach a job's VMs, validated user names and paths, pinned SSH host keys.

Real parts: a real sshd (orchestrator_testing.sshd), the Compute API emulator driven through the real
google-cloud-compute client, a real HTTP server standing in for the public-address echo service.
"""

from __future__ import annotations

import http.server
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from orchestrator.model.instances import InstanceRequest, Role, instance_name
from orchestrator.model.spec import GceProvider as GceSpec
from orchestrator.providers.gce.network import (
    GUEST_ATTRIBUTES_KEY,
    IsolatedGceProvider,
    NetworkError,
    job_tag,
    public_address,
    ssh_source_ranges,
)
from orchestrator.providers.gce.provider import RetrySettings
from orchestrator.providers.ssh.provider import InventoryError, load_inventory
from orchestrator.transport.base import Endpoint, UnsafePathError, check_relative
from orchestrator.transport.host_keys import HostKeyError, HostKeyPending, expected_keys
from orchestrator.transport.keys import generate_keypair, job_key
from orchestrator.transport.local import LocalTransport
from orchestrator.transport.ssh import SshTransport
from orchestrator_testing.gce_emulator import GceEmulator
from orchestrator_testing.sshd import Sshd

P, Z = "proj", "us-central1-a"
FAST = {"boot_delay_s": 0.06, "stop_delay_s": 0.03, "delete_delay_s": 0.03, "op_delay_s": 0.02,
        "operation_wait_max_s": 5.0}
QUICK = RetrySettings(attempts=3, initial_backoff_s=0.005, max_backoff_s=0.02, request_timeout_s=5.0,
                      wait_call_timeout_s=2.0, operation_timeout_s=10.0)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with Sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def authorized(sshd: Sshd) -> str:
    key, public = job_key("security-test")
    sshd.authorize(public)
    return str(key)


def other_host_key() -> str:
    _, public = generate_keypair("someone-else")
    return " ".join(public.split()[:2])


# ---------------------------------------------------------------- c. user names


@pytest.mark.parametrize("user", ["alice\nssh-ed25519 AAAA attacker", "a:b", "-oProxyCommand=x", "a b", ""])
def test_gce_ssh_user_must_be_a_posix_name(user: str) -> None:
    with pytest.raises(ValidationError, match="ssh_user"):
        GceSpec(project="proj-123", ssh_user=user)
    assert GceSpec(project="proj-123", ssh_user="alice.b_2").ssh_user == "alice.b_2"


def test_inventory_user_must_be_a_posix_name(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"hosts": [{"name": "n0", "host": "h", "user": "bob\nroot"}]}))
    msg = str(pytest.raises(InventoryError, load_inventory, path).value)
    assert "inventory.hosts[0].user:" in msg


# ---------------------------------------------------------------- d. paths


@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/etc/passwd", "~/x", "", ".", "a/..\\..\\x"])
def test_paths_outside_the_work_directory_are_refused(rel: str, tmp_path: Path, sshd: Sshd) -> None:
    with pytest.raises(UnsafePathError, match="outside the instance's work directory"):
        check_relative(rel)
    src = tmp_path / "f.txt"
    src.write_text("x")
    # Refused before anything reaches a host: the endpoint's work directory is never touched.
    ep = Endpoint(workdir=str(tmp_path / "disk"), host="127.0.0.1", port=sshd.port)
    with pytest.raises(UnsafePathError):
        SshTransport().put(ep, src, rel)
    with pytest.raises(UnsafePathError):
        SshTransport().write(ep, rel, "x")
    with pytest.raises(UnsafePathError):
        LocalTransport().write(Endpoint(workdir=str(tmp_path / "disk")), rel, "x")
    assert not (tmp_path / "disk").exists()


def test_pushed_folder_drops_links_that_point_outside(tmp_path: Path, sshd: Sshd, authorized: str) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "train.py").write_text("print(1)")
    (src / "inside").symlink_to("train.py")
    (src / "escape").symlink_to("/etc")
    (src / "up").symlink_to("../..")
    ep = sshd.endpoint(str(tmp_path / "disk"), authorized)
    SshTransport().put(ep, src, "proj")
    out = tmp_path / "disk" / "proj"
    assert (out / "train.py").read_text() == "print(1)"
    assert os.readlink(out / "inside") == "train.py"
    assert not (out / "escape").is_symlink() and not (out / "up").is_symlink()


# ---------------------------------------------------------------- e. host keys


def test_pinned_host_key_accepted_and_a_different_one_refused(tmp_path: Path, sshd: Sshd, authorized: str) -> None:
    ep = sshd.endpoint(str(tmp_path / "disk"), authorized)
    SshTransport().wait_reachable(ep, 10)  # the server's own key: accepted
    wrong = Endpoint(workdir=ep.workdir, host=ep.host, port=ep.port, user=ep.user, key_path=authorized,
                     host_keys=(other_host_key(),))
    t0 = time.monotonic()
    with pytest.raises(HostKeyError, match=r"does not match: it shows ssh-ed25519 SHA256:.*refusing to connect"):
        SshTransport().wait_reachable(wrong, 30)
    assert time.monotonic() - t0 < 10, "a wrong key is not retried until the timeout"


def test_known_hosts_file_is_the_judge_for_inventory_hosts(tmp_path: Path, sshd: Sshd, authorized: str) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    ep = Endpoint(workdir=str(tmp_path / "disk"), host=sshd.host, port=sshd.port, user=sshd.user,
                  key_path=authorized, known_hosts=str(known))
    msg = str(pytest.raises(HostKeyError, SshTransport().status, ep, ["x"]).value)
    assert f"host key of [127.0.0.1]:{sshd.port}" in msg and "is unknown" in msg
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {known}" in msg

    known.write_text(f"[127.0.0.1]:{sshd.port} {other_host_key()}\n")
    with pytest.raises(HostKeyError, match="does not match"):
        SshTransport().status(ep, ["x"])

    known.write_text(f"[127.0.0.1]:{sshd.port} {sshd.endpoint('.').host_keys[0]}\n")
    assert SshTransport().status(ep, ["x"])["x"].state.value == "absent"


def test_inventory_known_hosts_field_is_resolved_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"known_hosts": "kh", "hosts": [{"name": "n0", "host": "h"}]}))
    with pytest.raises(InventoryError, match=r"inventory\.known_hosts: .*kh is not a file"):
        load_inventory(path)
    (tmp_path / "kh").write_text("")
    assert load_inventory(path).known_hosts == tmp_path / "kh"


@pytest.fixture
def emu(sshd: Sshd, tmp_path: Path) -> Iterator[GceEmulator]:
    emulator = GceEmulator({**FAST, "ssh_port": sshd.port, "workdir_root": str(tmp_path / "vms")})
    emulator.start()
    yield emulator
    emulator.stop()


def make_provider(emu: GceEmulator, **kwargs: object) -> IsolatedGceProvider:
    defaults: dict[str, object] = {"ports": "2222-2299", "learn_address": lambda: "198.51.100.7"}
    return IsolatedGceProvider(P, api_endpoint=emu.url, retry=QUICK, **{**defaults, **kwargs})  # type: ignore[arg-type]


def req(job: str, index: int = 0, metadata: dict[str, str] | None = None) -> InstanceRequest:
    return InstanceRequest(name=instance_name(job, Role.WORKER, index, 0), job_id=job, role=Role.WORKER, index=index,
                           generation=0, zone=Z, machine_type="n1-standard-4", spot=True,
                           metadata=metadata if metadata is not None else {GUEST_ATTRIBUTES_KEY: "TRUE"})


def wait_running(gce: IsolatedGceProvider, name: str) -> None:
    for _ in range(200):
        if any(o.name == name and o.state.value == "running" for o in gce.list()):
            return
        time.sleep(0.02)
    raise AssertionError(f"{name} never ran")


def test_gce_host_keys_come_from_guest_attributes_and_are_pinned(
    emu: GceEmulator, sshd: Sshd, tmp_path: Path, authorized: str
) -> None:
    gce = make_provider(emu)
    try:
        gce.create(req("hk"))
        gce.create(req("nokeys", metadata={}))  # guest attributes disabled: nothing is published
        name = instance_name("hk", Role.WORKER, 0, 0)
        wait_running(gce, name)
        wait_running(gce, instance_name("nokeys", Role.WORKER, 0, 0))
        real = sshd.endpoint(".").host_keys[0].split()[:2]
        assert gce.host_keys(name, Z) == [" ".join(real)]  # the real sshd's key, as GCE's agent publishes it
        assert gce.host_keys(instance_name("nokeys", Role.WORKER, 0, 0), Z) == []
        ep = Endpoint(workdir=str(tmp_path / "disk"), host=sshd.host, port=sshd.port, user=sshd.user,
                      key_path=authorized, host_key_source=lambda: gce.host_keys(name, Z))
        SshTransport().wait_reachable(ep, 10)
        pending = Endpoint(workdir=ep.workdir, host=ep.host, port=ep.port, host_key_source=lambda: [])
        with pytest.raises(HostKeyPending, match="no SSH host key published yet"):
            expected_keys(pending)
    finally:
        gce.close()


# ---------------------------------------------------------------- a. per-job network, b. SSH source


def test_each_job_gets_its_own_tag_and_rules_deleted_with_its_last_vm(emu: GceEmulator) -> None:
    gce = make_provider(emu)
    try:
        gce.create(req("joba"))
        gce.create(req("joba", 1))
        gce.create(req("jobb"))
        assert emu.instance(instance_name("joba", Role.WORKER, 0, 0))["tags"]["items"] == ["orch-joba"]  # type: ignore[index]
        assert emu.instance(instance_name("jobb", Role.WORKER, 0, 0))["tags"]["items"] == ["orch-jobb"]  # type: ignore[index]
        internal = emu.firewall("orch-joba-internal", P)
        assert internal is not None
        assert internal["sourceTags"] == ["orch-joba"] and internal["targetTags"] == ["orch-joba"]
        assert internal["allowed"] == [{"IPProtocol": "tcp", "ports": ["2222-2299"]}]
        ssh = emu.firewall("orch-joba-ssh", P)
        assert ssh is not None and ssh["sourceRanges"] == ["198.51.100.7/32"] and ssh["targetTags"] == ["orch-joba"]
        assert emu.firewall("orch-jobb-internal", P)["sourceTags"] == ["orch-jobb"]  # type: ignore[index]

        gce.delete(instance_name("joba", Role.WORKER, 0, 0), Z)
        assert emu.firewall("orch-joba-internal", P) is not None, "one of the job's VMs is left"
        gce.delete(instance_name("joba", Role.WORKER, 1, 0), Z)
        assert emu.firewall("orch-joba-internal", P) is None and emu.firewall("orch-joba-ssh", P) is None
        assert emu.firewall("orch-jobb-internal", P) is not None, "another job's rules stay"
    finally:
        gce.close()
    assert job_tag("x" * 70) == "orch-" + "x" * 58


def test_a_network_open_to_every_vm_is_refused_unless_accepted(emu: GceEmulator) -> None:
    gce = make_provider(emu)
    try:  # what GCE's `default` network ships (a rule as the API's JSON, as Firewalls.ensure takes it)
        gce.firewalls.ensure({"name": "default-allow-internal", "network": "global/networks/default",
                              "sourceRanges": ["10.128.0.0/9"], "allowed": [
                                  {"IPProtocol": "tcp", "ports": ["0-65535"]},
                                  {"IPProtocol": "udp", "ports": ["0-65535"]}]})
        msg = str(pytest.raises(NetworkError, gce.create, req("open")).value)
        assert "default-allow-internal" in msg and "provider.network" in msg and "allow_open_network" in msg
        assert emu.instance(instance_name("open", Role.WORKER, 0, 0)) is None, "nothing created"
    finally:
        gce.close()
    accepted = make_provider(emu, allow_open_network=True)
    try:
        accepted.create(req("open"))
        assert emu.firewall("orch-open-internal", P) is not None
    finally:
        accepted.close()


def test_ssh_from_the_controllers_address_by_default() -> None:
    assert ssh_source_ranges(["10.0.0.0/8"], lambda: "1.2.3.4") == ["10.0.0.0/8"]
    assert ssh_source_ranges(None, lambda: "203.0.113.9") == ["203.0.113.9/32"]
    with pytest.raises(NetworkError, match=r"provider\.ssh_source_ranges"):
        ssh_source_ranges(None, lambda: None)
    assert GceSpec(project="proj-123").ssh_source_ranges is None
    with pytest.raises(ValidationError, match="ssh_source_ranges"):
        GceSpec(project="proj-123", ssh_source_ranges=["0.0.0.0"])


def test_public_address_from_an_echo_service() -> None:
    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b"203.0.113.5\n" if self.path == "/ok" else b"<html>not an address</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert public_address([f"{base}/garbage", f"{base}/ok"], timeout_s=2.0) == "203.0.113.5"
        assert public_address([f"{base}/garbage"], timeout_s=2.0) is None
    finally:
        server.shutdown()
