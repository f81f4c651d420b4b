"""JobSpec -> SimCluster: prices from the book, zones, checkpoint cost, preemptible cap, errors."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.model import timings
from orchestrator.model.catalog import load_catalog
from orchestrator.model.spec import Cluster, JobSpec, validate_spec
from orchestrator.sim.engine import NoRevocations, simulate
from orchestrator.sim.from_spec import SimSpecError, cluster_from_spec, model_size_mb

RATES = {"k80": 12.0, "p100": 9.0, "v100": 4.0}


def gce_spec(**over: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": "v100x4",
        "provider": {"kind": "gce", "project": "my-project", "zones": ["us-central1-c", "us-central1-a"]},
        "training": {
            "job": "resnet-cifar",
            "hparam_set": "resnet_cifar_32",
            "train_steps": 64000,
            "batch_per_worker": 128,
            "checkpoint_every": 1000,
        },
        "cluster": {
            "parameter_servers": {"count": 1, "machine_type": "n1-standard-4"},
            "workers": [{"gpu": "v100", "count": 4, "spot": True, "zone": "us-central1-c"}],  # K80: retired from GCE
        },
        "policy": {
            "on_revocation": "fallback-on-demand",
            "max_replacements": 7,
            "budget_usd": 40,
            "deadline": "12h",
        },
        "pricing": {"book": "2019-02"},
    }
    data.update(over)
    return validate_spec(data)


def test_slots_prices_and_policy_come_from_the_spec() -> None:
    c = cluster_from_spec(gce_spec(), step_rates=RATES, ps_capacity_steps_per_s=30.0)
    book = load_catalog().price_book("2019-02")
    assert [s.name for s in c.slots] == ["ps-0", "chief-0", "worker-0", "worker-1", "worker-2", "worker-3"]
    w = c.slots[2]
    assert (w.gpu, w.zone, w.spot, w.batch, w.step_rate) == ("v100", "us-central1-c", True, 128, 4.0)
    assert w.price_per_hour == book.instance_price("n1-standard-8", "v100", 1, True)
    assert w.on_demand_price_per_hour == book.instance_price("n1-standard-8", "v100", 1, False)
    assert w.replacement_zones == ("us-central1-a",)
    assert c.slots[0].price_per_hour == book.instance_price("n1-standard-4", None, 0, False)
    assert (c.policy, c.max_replacements, c.budget_usd, c.deadline_s) == (
        "fallback-on-demand",
        7,
        40.0,
        43200.0,
    )
    assert c.preemptible  # the 2019-02 book: preemptible VMs with the 24 h cap
    assert c.checkpoint_cost_s == pytest.approx(3.75 + 0.02 * c.model_mb)
    # 70 s measured (ICAC'19) + the default image route's first boot (a TensorFlow job: the Deep Learning VM
    # base family, TensorFlow installed at first boot; an estimate).
    assert c.boot_delay_s == 70.0 + timings.image_boot_extra_s("dlvm-base") and c.spot_extra_boot_s == 15.0
    base = simulate(c, NoRevocations())
    assert base.wall_time_s == pytest.approx(c.boot_delay_s + 15.0 + 64000 / 16.0 + 63 * c.checkpoint_cost_s)
    # The planner's accounting of the same cluster (boot, checkpoint pauses, teardown) is the simulator's.
    from orchestrator.costmodel.accounting import run_accounting

    acc = run_accounting(gce_spec())
    assert acc.failure_free_s(64000, 1000, 16.0, spot_critical=True) == pytest.approx(base.wall_time_s)


def test_current_book_means_spot_without_cap_and_override() -> None:
    spec = gce_spec(pricing={"book": "current"})
    assert not cluster_from_spec(spec, step_rates=RATES).preemptible
    assert cluster_from_spec(spec, step_rates=RATES, price_book="2019-02").preemptible
    assert cluster_from_spec(spec, step_rates=RATES, preemptible=True).preemptible


def test_model_size_from_the_cost_model_profile() -> None:
    assert 0.5 < model_size_mb("resnet_cifar_32") < 10.0
    assert model_size_mb("no-such-model") == 2.0


def test_search_only_spec_needs_a_plan() -> None:
    spec = gce_spec(cluster=None, search={"gpus": ["t4", "v100"]})
    with pytest.raises(SimSpecError, match="orchestrator plan"):
        cluster_from_spec(spec, step_rates=RATES)
    chosen = Cluster.model_validate({"workers": [{"gpu": "v100", "count": 2, "zone": "us-central1-a"}]})
    c = cluster_from_spec(spec, step_rates=RATES, cluster=chosen)
    assert [s.gpu for s in c.workers] == ["v100", "v100"]


def test_missing_step_rate_is_reported() -> None:
    with pytest.raises(SimSpecError, match="no step rate for GPU 'v100'"):
        cluster_from_spec(gce_spec(), step_rates={"k80": 1.0})


def test_local_provider_revocation_modes() -> None:
    def local(revocations: str, schedule: list[dict[str, Any]] | None = None) -> JobSpec:
        provider: dict[str, Any] = {"kind": "local", "revocations": revocations}
        if schedule:
            provider["schedule"] = schedule
        return gce_spec(provider=provider, cluster={"workers": [{"gpu": "k80", "count": 2}]})

    assert cluster_from_spec(local("model"), step_rates=RATES).schedule is None
    assert cluster_from_spec(local("none"), step_rates=RATES).schedule == ()
    revs = [{"instance": "worker-1", "at_s": 90}, {"instance": "ps-0", "at_s": 50}]  # the PS is on-demand
    sched = cluster_from_spec(local("schedule", revs), step_rates=RATES)
    assert sched.schedule == (("worker-1", 90.0),)
    by_step = cluster_from_spec(local("schedule", [{"instance": "worker-1", "at_step": 100}]), step_rates=RATES)
    assert by_step.schedule is not None and len(by_step.schedule) == 1
    ((slot, at),) = by_step.schedule  # the time training reaches step 100 at the slowest worker's rate (sync)
    rate = min(s.step_rate for s in by_step.workers)
    assert slot == "worker-1" and at > 100 / rate
    assert sched.slots[-1].zone == "local"  # -> the revocation model's pooled fit for the GPU


def test_cost_model_step_rates() -> None:
    c = cluster_from_spec(gce_spec())
    assert c.rate_fn is not None
    assert all(s.step_rate > 0 for s in c.workers)
    four = c.rate_fn((2, 3, 4, 5))
    three = c.rate_fn((2, 3, 4))
    assert 0 < three <= 1.01 * four  # past the PS plateau the incast penalty may cost a little


def test_torchft_groups_pause_for_the_measured_quorum_not_a_world_restart() -> None:
    from pathlib import Path

    from orchestrator.model.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[1] / "examples/local-torch-hetero.yaml")
    doc = spec.model_dump(mode="json", exclude_none=True)
    torchrun = cluster_from_spec(validate_spec(doc))
    doc["training"]["fault_tolerance"] = "torchft"
    torchft = cluster_from_spec(validate_spec(doc))
    assert torchft.regroup_s == timings.TORCHFT_PAUSE_S < torchrun.regroup_s
