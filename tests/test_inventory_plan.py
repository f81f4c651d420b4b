"""`plan` and `launch` of an ssh spec price the hosts as the ledger bills them (the inventory's price_per_hour, not
the price book's) and say where the inventory differs from the plan: the cost model counts one GPU a host, the run
trains on every GPU of a PyTorch node's host."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.planning.admission import judge_file
from orchestrator.planning.inventory import placement
from orchestrator.providers.ssh.provider import load_inventory
from tests.cli_inproc import run_cli

TORCH = "{framework: pytorch, hparam_set: resnet_tiny, problem: image_cifar10, train_steps: 2000, global_batch: 512}"


def _spec(tmp_path: Path, hosts: str, training: str = TORCH, workers: str = "[{gpu: v100, count: 2, spot: false}]"
          ) -> Path:
    (tmp_path / "kh").write_text("")
    (tmp_path / "hosts.yaml").write_text("known_hosts: kh\nhosts:\n" + hosts)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: lab\nprovider: {{kind: ssh, inventory: hosts.yaml}}\nstorage: ./runs\n"
                    f"training: {training}\ncluster: {{workers: {workers}}}\n")
    return spec


LAB = ("  - {name: box2, host: 127.0.0.2, gpu: v100, gpus: 4, price_per_hour: 0.5}\n"
       "  - {name: box1, host: 127.0.0.1, gpu: v100, gpus: 4, price_per_hour: 0.5}\n"
       "  - {name: dear, host: 127.0.0.4, gpu: v100, gpus: 1, price_per_hour: 3.0}\n"
       "  - {name: cpu, host: 127.0.0.3}\n")


def test_the_notes_name_the_hosts_the_provider_would_pick_their_gpus_and_prices(tmp_path: Path) -> None:
    checked = judge_file(_spec(tmp_path, LAB))
    # The provider's order: the cheapest fitting hosts, then by name; the 1-GPU host at $3/h stays free.
    assert [h.name for _, h in placement(checked.plan, load_inventory(tmp_path / "hosts.yaml"))] == ["box1", "box2"]
    gpus, prices = checked.notes
    assert "box1 (4x v100), box2 (4x v100)" in gpus and "faster than planned" in gpus
    planned = checked.plan.cluster_usd_per_hour
    assert "$1.0000/h for these 2 hosts" in prices and f"${planned:.4f}/h" in prices


def test_an_inventory_that_agrees_with_the_plan_adds_no_note(tmp_path: Path) -> None:
    first = judge_file(_spec(tmp_path, LAB, workers="[{gpu: v100, count: 1, spot: false}]"))
    price = first.plan.cluster_usd_per_hour  # the price book's, as the plan prices the one host
    agrees = f"  - {{name: box1, host: 127.0.0.1, gpu: v100, price_per_hour: {price}}}\n"
    checked = judge_file(_spec(tmp_path, agrees, workers="[{gpu: v100, count: 1, spot: false}]"))
    assert checked.notes == ()


def test_a_tensorflow_job_gets_the_price_note_only(tmp_path: Path) -> None:
    tf = "{hparam_set: resnet_tiny, problem: image_cifar10, train_steps: 200}"
    checked = judge_file(_spec(tmp_path, LAB, training=tf, workers="[{gpu: v100, count: 2}]"))
    assert len(checked.notes) == 1 and "price_per_hour" in checked.notes[0]


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_plan_prints_the_notes(tmp_path: Path, fmt: str) -> None:
    spec = _spec(tmp_path, LAB)
    env = {**os.environ, "ORCHESTRATOR_DB_URL": f"sqlite:///{tmp_path}/cli.db", "COLUMNS": "200",
           "HOME": str(tmp_path)}
    out = run_cli(["plan", str(spec), "--format", fmt], env, tmp_path)
    assert out.returncode == 0, out.stderr
    if fmt == "json":
        notes = json.loads(out.stdout)["inventory_notes"]
        assert len(notes) == 2 and notes[0].startswith("ssh inventory: the workers would get box1 (4x v100)")
    else:
        assert "note: ssh inventory: the workers would get box1 (4x v100), box2 (4x v100)" in out.stdout


def test_the_budget_check_and_the_plan_use_the_inventorys_prices(tmp_path: Path) -> None:
    """2 V100 hosts at $0.50/h: the price book's $2.67/h each would refuse a budget the inventory's prices meet."""
    from orchestrator.model.errors import UserError

    spec = _spec(tmp_path, LAB)
    free = judge_file(spec)
    judged = free.result.chosen
    assert judged is not None and judged.hourly_usd == pytest.approx(1.0)
    assert [w.price_per_hour for w in judged.workers] == [0.5, 0.5]
    assert judged.cost_usd == pytest.approx(judged.time_s / 3600 * 1.0)
    book = free.plan.cluster_usd_per_hour * judged.time_s / 3600  # what the price book's prices would cost
    assert book > 4 * judged.cost_usd
    text = spec.read_text()
    spec.write_text(text.replace("cluster:", f"policy: {{budget_usd: {(judged.cost_usd + book) / 2:.4f}}}\ncluster:"))
    met = judge_file(spec)
    assert met.result.feasible and met.estimate is not None and met.estimate.cost_usd == pytest.approx(judged.cost_usd)
    spec.write_text(text.replace("cluster:", f"policy: {{budget_usd: {judged.cost_usd / 2:.4f}}}\ncluster:"))
    with pytest.raises(UserError, match=rf"cost \${judged.cost_usd:.4f} is over the budget"):
        judge_file(spec)
