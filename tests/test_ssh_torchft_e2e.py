"""torchft replica groups on the ssh provider (a lab's own machines), end to end (about 25 s): two inventory hosts on a
real sshd, the built-in PyTorch job on replica groups. Each host reaches the controller's Lighthouse through its own
reverse SSH forward (control/lighthouse.reach, pinned to the inventory's known_hosts), the job succeeds, and the
forwards end with it."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import yaml
from e2e_helpers import cli, processes_under
from sqlalchemy import create_engine, text

from orchestrator.transport.keys import generate_keypair, write_private
from orchestrator_testing.sshd import Sshd

pytestmark = pytest.mark.slow
pytest.importorskip("torchft")
VENV_BIN = str(Path(sys.executable).parent)


def test_replica_groups_on_inventory_hosts_reach_their_lighthouse_through_ssh(tmp_path: Path) -> None:
    # The hosts' python3 is this venv's (a lab machine's own environment with torch and torchft)
    with Sshd(tmp_path / "sshd", env={"PATH": f"{VENV_BIN}:/usr/bin:/bin"}) as sshd:
        private, public = generate_keypair("lab")
        write_private(tmp_path / "keys" / "id_ed25519", private)
        sshd.authorize(public)
        (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {sshd.endpoint('.').host_keys[0]}\n")
        base = {"host": "127.0.0.1", "port": sshd.port, "user": sshd.user, "key": "keys/id_ed25519", "gpu": "t4",
                "gpus": 1, "price_per_hour": 0.3}
        hosts = [{**base, "name": f"box{i}", "workdir": str(tmp_path / f"box{i}")} for i in range(2)]
        (tmp_path / "hosts.yaml").write_text(yaml.safe_dump({"hosts": hosts, "known_hosts": "known_hosts"}))
        (tmp_path / "spec.yaml").write_text(
            f"name: lab-ft\nprovider: {{kind: ssh, inventory: hosts.yaml}}\nstorage: {tmp_path / 'runs'}\n"
            "training: {framework: pytorch, fault_tolerance: torchft, hparam_set: resnet_tiny, "
            "problem: image_cifar10, train_steps: 100, global_batch: 32, checkpoint_every: 50, log_every: 10}\n"
            "cluster: {workers: [{gpu: t4, count: 2}]}\npolicy: {on_revocation: replace, max_replacements: 1}\n")
        env = {"ORCHESTRATOR_HOME": str(tmp_path / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/r.db"}
        forwards: set[str] = set()
        done = threading.Event()

        def watch() -> None:  # the forwards' port files, while the job runs (they go with it)
            while not done.wait(0.2):
                forwards.update(p.name for p in (tmp_path / "home" / "tunnels").glob("*/*.port"))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            out = cli("launch", str(tmp_path / "spec.yaml"), "--quiet", env=env, timeout=300)
        finally:
            done.set()
            watcher.join()
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        with create_engine(env["ORCHESTRATOR_DB_URL"]).connect() as conn:
            summary = conn.execute(text("SELECT * FROM job_summary")).mappings().one()
        assert summary["status"] == "succeeded" and summary["final_step"] == 100, summary
        assert len(forwards) == 2, forwards  # one forward per host's worker
        assert not list((tmp_path / "home" / "tunnels").glob("*/*"))  # gone with the job
    assert processes_under(tmp_path) == []
