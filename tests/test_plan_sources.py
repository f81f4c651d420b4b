"""`plan` says when it prices from an unverified figure or a placeholder, and warns when a job could run
into its GPU's Compute Engine end of support (T4/P4: 2027-08-01, no create, launch or access after it)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from orchestrator.costmodel.planner import plan
from orchestrator.model.catalog import load_catalog
from orchestrator.model.spec import validate_spec


def _spec(gpu: str, machine: str, deadline: str, zone: str = "us-central1-a", overrides: Any = None) -> Any:
    doc: dict[str, Any] = {
        "name": "sources",
        "provider": {"kind": "gce", "project": "my-project", "zones": [zone]},
        "training": {"job": "resnet-cifar", "hparam_set": "resnet_cifar_32", "train_steps": 2000,
                     "mode": "sync", "batch_per_worker": 128},
        "cluster": {"parameter_servers": {"count": 0},
                    "workers": [{"gpu": gpu, "machine_type": machine, "count": 1, "spot": True, "zone": zone}]},
        "policy": {"deadline": deadline},
        "pricing": {"book": "2026-11", **({"overrides": overrides} if overrides else {})},
    }
    return validate_spec(doc)


def test_plan_names_a_placeholder_and_an_unverified_price_and_the_fix() -> None:
    g4 = plan(_spec("rtx-pro-6000", "g4-standard-48", "12h", zone="us-central1-b"), load_catalog())
    assert any("price of g4-standard-48 in book 2026-11 is a placeholder" in n
               and "set pricing.overrides.g4-standard-48" in n for n in g4.warnings), g4.warnings
    h100 = plan(_spec("h100", "a3-highgpu-1g", "12h"), load_catalog())
    assert any("price of a3-highgpu-1g in book 2026-11 is unverified" in n for n in h100.warnings), h100.warnings
    # A user's own price is a fact the plan can use without a mark; a confirmed row needs none either.
    own = plan(_spec("h100", "a3-highgpu-1g", "12h", overrides={"a3-highgpu-1g": {"on_demand": 6, "spot": 3}}))
    t4 = plan(_spec("t4", "n1-standard-4", "12h"))
    assert not own.warnings and not t4.warnings


def test_plan_warns_when_a_t4_job_could_run_past_its_end_of_support() -> None:
    today = dt.date(2026, 11, 25)
    long = plan(_spec("t4", "n1-standard-4", "300d"), load_catalog(), today=today)
    assert len(long.warnings) == 1  # the T4 and N1 host prices are confirmed: only the end of support
    assert long.warnings[0].startswith("nvidia-tesla-t4 reaches its Compute Engine end of support on 2027-08-01")
    assert "its deadline, 300 days from 2026-11-25" in long.warnings[0]
    assert not plan(_spec("t4", "n1-standard-4", "12h"), today=today).warnings
    eve = plan(_spec("t4", "n1-standard-4", "2d"), today=dt.date(2027, 7, 31))
    assert eve.warnings and eve.to_dict()["warnings"] == list(eve.warnings)  # `plan --json` carries them
    assert not plan(_spec("l4", "g2-standard-4", "300d", zone="us-central1-a"), today=today).warnings
    # The dry run shows the same warnings (cli/launch_checks.py print_dry_run prints PlanResult.warnings).


def test_a_gce_t4_spec_is_refused_after_its_end_of_support() -> None:
    from orchestrator.model.offerings import retired_message

    cat = load_catalog()
    msg = retired_message(cat, "t4", cat.price_book("current"), today=dt.date(2027, 8, 1))
    assert msg is not None and msg.startswith("nvidia-tesla-t4 was at end of support on Compute Engine 2027-08-01")
    assert retired_message(cat, "t4", cat.price_book("current"), today=dt.date(2027, 7, 31)) is None
