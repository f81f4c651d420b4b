"""SshInventoryProvider: inventory validation, host assignment, reachability as the instance's state."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.model.cloud_errors import CapacityError
from orchestrator.model.instances import InstanceRequest, ObservedState, ProcState, Role, instance_name
from orchestrator.model.paths import user_dir
from orchestrator.providers.ssh.provider import InventoryError, SshInventoryProvider, load_inventory
from orchestrator.transport.keys import generate_keypair, write_private
from orchestrator.transport.local import pid_alive
from orchestrator_testing.sshd import Sshd


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with Sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def key(sshd: Sshd, tmp_path: Path) -> Path:
    private, public = generate_keypair("inventory-user")
    path = tmp_path / "keys" / "id_ed25519"
    write_private(path, private)
    path.with_name("id_ed25519.pub").write_text(public + "\n")
    sshd.authorize(public)
    return path


def dead_port(tmp_path: Path) -> int:
    server = Sshd(tmp_path / "gone").start()
    port = server.port
    server.close()
    return port


def write_inventory(path: Path, hosts: list[dict[str, object]], known_hosts: str | None = None) -> Path:
    path.write_text(yaml.safe_dump({"hosts": hosts, **({"known_hosts": known_hosts} if known_hosts else {})}))
    return path


def known_hosts_of(sshd: Sshd, path: Path) -> str:
    """A known_hosts file listing the test server's host key (host keys are pinned)."""
    path.write_text(f"[127.0.0.1]:{sshd.port} {sshd.endpoint('.').host_keys[0]}\n")
    return path.name


def request(job: str, role: Role, index: int, gpu: str | None, generation: int = 0) -> InstanceRequest:
    return InstanceRequest(name=instance_name(job, role, index, generation), job_id=job, role=role,
                           index=index, generation=generation, zone="campus", machine_type="n1-standard-4",
                           spot=True, gpu=gpu, gpu_count=1 if gpu else 0)


@pytest.fixture
def inventory(sshd: Sshd, key: Path, tmp_path: Path) -> Path:
    base = {"host": "127.0.0.1", "port": sshd.port, "user": sshd.user, "key": "keys/id_ed25519"}
    return write_inventory(tmp_path / "inventory.yaml", [
        {**base, "name": "gpu-a", "gpu": "k80", "gpus": 2, "workdir": str(tmp_path / "a"),
         "price_per_hour": 0.5},
        {**base, "name": "cpu-b", "workdir": str(tmp_path / "b")},
        {**base, "name": "t4-dead", "port": dead_port(tmp_path), "gpu": "t4", "workdir": str(tmp_path / "c")},
    ], known_hosts=known_hosts_of(sshd, tmp_path / "known_hosts"))


def test_load_inventory_defaults_and_relative_key(inventory: Path, key: Path) -> None:
    inv = load_inventory(inventory)
    a = inv.hosts[0]
    assert (a.name, a.gpu, a.gpus, a.key) == ("gpu-a", "k80", 2, key.resolve())
    assert inv.hosts[2].gpus == 1  # a GPU type without a count means one
    assert inv.hosts[1].gpu is None and inv.hosts[1].price_per_hour == 0.0


def test_inventory_errors_name_the_field(tmp_path: Path, key: Path) -> None:
    ok = {"host": "h", "key": str(key)}
    path = write_inventory(tmp_path / "bad.yaml", [
        {**ok, "name": "n0"}, {**ok, "name": "n1"}, {**ok, "name": "n2", "gpu": "x"}, {**ok, "name": "n1"},
    ])
    with pytest.raises(InventoryError) as exc:
        load_inventory(path)
    msg = str(exc.value)
    assert "inventory.hosts[2].gpu: 'x' is not a GPU type; known: k80" in msg
    assert "inventory.hosts[3].name: 'n1' is listed twice" in msg

    path = write_inventory(tmp_path / "bad2.yaml", [{"name": "n0", "hots": "h", "port": 0}])
    msg = str(pytest.raises(InventoryError, load_inventory, path).value)
    assert "inventory.hosts[0].host: required field is missing" in msg
    assert "inventory.hosts[0].hots: unknown field" in msg
    assert "inventory.hosts[0].port:" in msg

    key.chmod(0o644)
    path = write_inventory(tmp_path / "bad3.yaml", [{**ok, "name": "n0"},
                                                    {"name": "n1", "host": "h", "key": "nope"}])
    msg = str(pytest.raises(InventoryError, load_inventory, path).value)
    assert "inventory.hosts[0].key:" in msg and "must be 0600" in msg
    assert "inventory.hosts[1].key:" in msg and "does not exist" in msg
    key.chmod(0o600)

    with pytest.raises(InventoryError, match="cannot read inventory"):
        load_inventory(tmp_path / "none.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(InventoryError, match=r"inventory\.hosts: required"):
        load_inventory(tmp_path / "empty.yaml")


def test_assignment_matches_gpu_and_is_idempotent(inventory: Path, sshd: Sshd, tmp_path: Path) -> None:
    p = SshInventoryProvider(inventory)
    worker = request("j1", Role.WORKER, 0, "k80")
    p.create(worker)
    p.create(worker)  # same name: nothing changes
    ps = request("j1", Role.PS, 0, None)
    p.create(ps)  # CPU role: the CPU-only host, although the GPU host would do
    state = json.loads((user_dir() / "ssh-assignments.json").read_text())["assignments"]
    assert {n: a["host"] for n, a in state.items()} == {worker.name: "gpu-a", ps.name: "cpu-b"}

    with pytest.raises(CapacityError, match="no free reachable host"):
        p.create(request("j1", Role.WORKER, 1, "k80"))  # the only k80 host is taken
    with pytest.raises(CapacityError, match="1 free but unreachable"):
        p.create(request("j1", Role.WORKER, 2, "t4"))  # the only t4 host does not answer

    observed = {o.name: o for o in p.list(["j1"])}
    assert set(observed) == {worker.name, ps.name}
    w = observed[worker.name]
    assert (w.state, w.role, w.index, w.gpu, w.zone, w.preempted) == (
        ObservedState.RUNNING, Role.WORKER, 0, "k80", "campus", False)
    assert w.workdir == str(tmp_path / "a" / worker.name)
    ep = p.endpoint(w)
    assert (w.host, w.ssh_port) == ("127.0.0.1", sshd.port)
    assert (ep.host, ep.port, ep.user, ep.workdir) == ("127.0.0.1", sshd.port, sshd.user, w.workdir)
    assert ep.key_path is not None and ep.key_path.endswith("id_ed25519")
    assert p.list(["other-job"]) == []

    # The ledger bills an on-prem host at its inventory price, not a cloud price book's.
    assert (p.price_per_hour(worker.name), p.price_per_hour(ps.name), p.price_per_hour("unknown")) == (0.5, 0.0, None)
    # A PyTorch node on the two-GPU host runs two ranks; the CPU-only host has no GPU to count.
    assert (p.gpus_on(worker.name), p.gpus_on(ps.name), p.gpus_on("unknown")) == (2, None, None)

    # A second controller (another provider object) sees the same assignments.
    assert {o.name for o in SshInventoryProvider(inventory).list()} == {worker.name, ps.name}


def test_delete_kills_processes_and_frees_the_host(inventory: Path) -> None:
    p = SshInventoryProvider(inventory)
    worker = request("j2", Role.WORKER, 0, "k80")
    p.create(worker)
    (obs,) = p.list(["j2"])
    ep = p.endpoint(obs)
    p.transport.wait_reachable(ep, 10)
    p.transport.start(ep, "task", ["sleep", "60"])
    pid = int((Path(ep.workdir) / "procs" / "task.pid").read_text())
    assert p.transport.status(ep, ["task"])["task"].state == ProcState.RUNNING

    p.delete(worker.name, "campus")
    assert not pid_alive(pid)
    assert not Path(ep.workdir).exists()
    assert p.list(["j2"]) == []
    p.delete(worker.name, "campus")  # not found is success
    p.create(request("j2", Role.WORKER, 0, "k80", generation=1))  # the host is free again
    p.close()


def test_unreachable_host_is_terminated_and_cleaned_up_on_reuse(key: Path, tmp_path: Path) -> None:
    with Sshd(tmp_path / "node") as node:
        node.authorize(key.with_name("id_ed25519.pub").read_text())
        inv = write_inventory(tmp_path / "inv.yaml", [{
            "name": "flaky", "host": "127.0.0.1", "port": node.port, "user": node.user, "key": str(key),
            "gpu": "v100", "workdir": str(tmp_path / "w")}], known_hosts_of(node, tmp_path / "known_hosts"))
        p = SshInventoryProvider(inv, probe_ttl_s=0.0, probe_timeout_s=0.5)
        first = request("j3", Role.WORKER, 0, "v100")
        p.create(first)
        (obs,) = p.list()
        assert obs.state == ObservedState.RUNNING
        ep = p.endpoint(obs)
        p.transport.wait_reachable(ep, 10)
        p.transport.start(ep, "task", ["sleep", "60"])
        pid = int((Path(ep.workdir) / "procs" / "task.pid").read_text())

        node.stop()  # the machine drops off the network: this provider's revocation
        (obs,) = p.list()
        assert (obs.state, obs.preempted) == (ObservedState.TERMINATED, False)
        t0 = time.monotonic()
        p.delete(first.name, "campus")  # frees the host although nothing could be killed
        assert time.monotonic() - t0 < 3
        assert p.list() == []
        assert pid_alive(pid)

        node.start()  # back: the leftover process is killed before the host is handed out again
        p.create(request("j3", Role.WORKER, 0, "v100", generation=1))
        deadline = time.monotonic() + 5
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pid_alive(pid)
        assert json.loads((user_dir() / "ssh-assignments.json").read_text())["cleanup"] == []
        p.close()
