"""Parameter-server model (plateau, second PS, sharding), all-reduce, and the memory model."""

from __future__ import annotations

import pytest

from orchestrator.costmodel import DEFAULT_CALIBRATION, cluster_steps_per_s, max_batch, ps_capacity_steps_per_s
from orchestrator.costmodel.comm import Sharding, ps_capacity, shard_model, shard_sizes
from orchestrator.costmodel.memory import fits, memory_bytes, usable_bytes
from orchestrator.costmodel.profiles import get_profile
from orchestrator.model.catalog import load_catalog

PS = "n1-standard-4"


def rates(ps_count: int, max_workers: int = 16, model: str = "resnet_cifar_32") -> list[float]:
    return [
        cluster_steps_per_s(model, ["k80"] * w, [128] * w, ps_count, PS, "async")
        for w in range(1, max_workers + 1)
    ]


def test_one_ps_plateaus_and_a_second_lifts_it() -> None:
    one, two = rates(1), rates(2)
    # Linear at first: every worker adds its own rate.
    assert one[1] == pytest.approx(2 * one[0], rel=1e-6)
    assert all(b >= 0.97 * a for a, b in zip(one[:5], one[1:6], strict=True))  # incast: a slight dip
    # Then flat at the PS capacity: adding workers no longer helps (at most within the incast penalty).
    cap = ps_capacity_steps_per_s("resnet_cifar_32", 1, PS, 12)
    assert one[-1] <= ps_capacity_steps_per_s("resnet_cifar_32", 1, PS, 1) + 1e-9
    assert max(one) < 0.75 * 16 * one[0]
    assert one[15] == pytest.approx(one[11], rel=0.1) and one[11] == pytest.approx(cap, rel=1e-6)
    # A second PS halves each PS's share: the plateau rises.
    assert two[15] > 1.7 * one[15]
    assert two[3] == pytest.approx(one[3], rel=1e-6)  # below the plateau the PS count does not matter


def test_capacity_scales_with_ps_count_and_nic() -> None:
    caps = [ps_capacity_steps_per_s("resnet_cifar_56", n, PS, 4) for n in (1, 2, 3)]
    assert caps[0] < caps[1] < caps[2]
    assert ps_capacity_steps_per_s("resnet_cifar_56", 1, "n1-standard-8", 4) > caps[0]


def test_greedy_sharding_balances_better_than_round_robin() -> None:
    for model, n in [("resnet_cifar_56", 3), ("transformer_base", 3), ("vgg16", 2)]:
        greedy, rr = shard_model(model, n, Sharding.GREEDY), shard_model(model, n, Sharding.ROUND_ROBIN)
        assert sum(greedy.bytes_per_ps) == sum(rr.bytes_per_ps) == get_profile(model).param_bytes
        assert greedy.imbalance <= rr.imbalance
    # VGG-16's kernels and biases alternate: round-robin puts every kernel on PS 0.
    assert shard_model("vgg16", 2, Sharding.ROUND_ROBIN).imbalance == pytest.approx(2.0, rel=1e-3)
    assert shard_model("transformer_base", 3, Sharding.GREEDY).imbalance < 1.01
    assert shard_model("transformer_base", 3, Sharding.ROUND_ROBIN).imbalance > 1.5
    # Greedy: no PS holds more than the mean plus the largest variable.
    plan = shard_sizes([7, 5, 5, 4, 3, 3, 1], 3)
    assert max(plan.bytes_per_ps) <= sum(plan.bytes_per_ps) / 3 + 7
    assert plan.bytes_per_ps == (10, 9, 9)


def test_imbalance_lowers_capacity() -> None:
    greedy = ps_capacity_steps_per_s("transformer_base", 3, PS, 4)  # default network constants
    rr = ps_capacity("transformer_base", 3, PS, 4, DEFAULT_CALIBRATION.net, strategy=Sharding.ROUND_ROBIN)
    assert rr < greedy


def test_sync_step_is_slowest_worker_plus_allreduce() -> None:
    alone = cluster_steps_per_s("resnet_cifar_32", ["v100"], [128], 0, PS, "sync")
    mixed = cluster_steps_per_s("resnet_cifar_32", ["v100", "k80"], [128, 128], 0, PS, "sync")
    k80 = cluster_steps_per_s("resnet_cifar_32", ["k80"], [128], 0, PS, "sync")
    assert mixed < k80 < alone  # the K80 sets the pace, and the all-reduce adds to it
    with pytest.raises(ValueError, match="async"):
        cluster_steps_per_s("resnet_cifar_32", ["v100"], [128], 0, PS, "bulk")


def test_memory_caps() -> None:
    cat = load_catalog()
    for model in ("resnet_cifar_56", "vgg16", "transformer_base"):
        caps = {g: max_batch(model, g) for g in ("k80", "v100", "a100", "h100")}
        assert caps["k80"] < caps["v100"] < caps["a100"] < caps["h100"]
        for g, cap in caps.items():
            assert fits(model, g, cap) and not fits(model, g, cap + 1)
            assert memory_bytes(model, cap) <= usable_bytes(g) <= cat.gpu(g).memory_gb * 1e9
    assert 50 < max_batch("vgg16", "k80") < 200  # VGG-16 at 224x224 on a 12 GB K80: tens of images


def test_distance_between_worker_and_ps_slows_the_worker() -> None:
    from orchestrator.costmodel.cluster import estimate_from_compute
    from orchestrator.costmodel.comm import zone_rtt_s
    from orchestrator.costmodel.compute import DEFAULT_CALIBRATION
    from orchestrator.model.catalog import load_catalog

    assert zone_rtt_s("us-central1-c", "us-central1-c") == 0.0 == zone_rtt_s(None, "us-west1-b")
    near, region, far = (
        zone_rtt_s("us-central1-c", z) for z in ("us-central1-a", "us-west1-b", "europe-west4-a")
    )
    assert 0 < near < region < far

    def rate(zone: str) -> float:
        est = estimate_from_compute(
            "resnet_cifar_32",
            [0.02],
            ["n1-standard-8"],
            1,
            PS,
            "async",
            DEFAULT_CALIBRATION,
            load_catalog(),
            worker_zones=[zone],
            ps_zone="us-central1-c",
        )
        return est.steps_per_s

    assert rate("us-central1-c") > rate("us-west1-b") > rate("europe-west4-a")
