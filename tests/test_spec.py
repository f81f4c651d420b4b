from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.spec import SpecError, load_spec, parse_duration, validate_spec

REPO = Path(__file__).resolve().parent.parent

GOOD: dict[str, Any] = {
    "name": "hetero",
    "provider": {"kind": "gce", "project": "my-project", "zones": ["us-central1-c", "us-west1-b"]},
    "training": {"job": "resnet-cifar", "train_steps": 1000},
    "cluster": {
        "workers": [{"gpu": "k80", "count": 2, "zone": "us-central1-c"}, {"gpu": "p100", "zone": "us-west1-b"}]
    },
}


def errors_of(doc: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        validate_spec(doc)
    return [str(e) for e in info.value.errors]


def test_examples_validate() -> None:
    for path in sorted((REPO / "examples").glob("*.yaml")):
        spec = load_spec(path)
        assert spec.name


def test_good_spec_and_defaults() -> None:
    spec = validate_spec(GOOD)
    assert spec.ps_count == 1 and spec.worker_count == 3
    assert spec.policy.on_revocation.value == "replace"


def test_unknown_gpu_names_field_and_choices() -> None:
    doc = copy.deepcopy(GOOD)
    doc["cluster"]["workers"][1]["gpu"] = "v200"
    assert errors_of(doc) == [
        "cluster.workers[1].gpu: 'v200' is not a GPU type; known: k80, p100, v100, t4, l4, a100, h100"
    ]


def test_gpu_not_offered_in_zone() -> None:
    doc = copy.deepcopy(GOOD)
    doc["provider"]["zones"].append("europe-west4-a")
    doc["cluster"]["workers"][0]["zone"] = "europe-west4-a"
    (msg,) = errors_of(doc)
    assert msg.startswith("cluster.workers[0]: nvidia-tesla-k80 is not offered in zone europe-west4-a; it is in: ")
    assert "us-central1-c" in msg


def test_every_problem_is_reported_at_once() -> None:
    doc = copy.deepcopy(GOOD)
    doc["cluster"]["workers"][0]["cnt"] = 3
    doc["policy"] = {"deadline": "3 fortnights", "on_revocation": "pray"}
    msgs = errors_of(doc)
    assert any(m.startswith("cluster.workers[0].cnt: unknown field") for m in msgs)
    assert any(m.startswith("policy.deadline:") for m in msgs)
    assert any(m.startswith("policy.on_revocation:") and "replace" in m for m in msgs)


def test_sync_with_parameter_servers_is_rejected() -> None:
    doc = copy.deepcopy(GOOD)
    doc["training"]["mode"] = "sync"
    doc["cluster"]["parameter_servers"] = {"count": 2}
    assert any("all-reduce" in m for m in errors_of(doc))


def test_schedule_names_existing_slots() -> None:
    doc = {
        "name": "x",
        "provider": {"kind": "local", "revocations": "schedule", "schedule": [{"instance": "worker-7", "at_s": 5}]},
        "cluster": {"workers": [{"gpu": "k80"}]},
    }
    (msg,) = errors_of(doc)
    assert msg.startswith("provider.schedule[0].instance: 'worker-7' is not in this cluster")


def test_price_missing_in_book() -> None:
    doc = copy.deepcopy(GOOD)
    doc["provider"]["zones"] = ["us-central1-a"]
    doc["cluster"] = {"workers": [{"gpu": "a100", "zone": "us-central1-a", "machine_type": "a2-highgpu-1g"}]}
    assert any(
        m.startswith("cluster.workers[0].gpu: price book 'current' has no price for GPU 'a100'") for m in errors_of(doc)
    )
    doc["pricing"] = {
        "overrides": {"a100": {"on_demand": 2.93, "spot": 0.88}, "a2-highgpu-1g": {"on_demand": 0.74, "spot": 0.22}}
    }
    validate_spec(doc)


def test_durations() -> None:
    assert parse_duration("6h") == 21600 and parse_duration("90m") == 5400 and parse_duration(30) == 30
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_yaml_errors_are_clean(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


# ---------------------------------------------------------------- property-based: only clean errors

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(
        ["k80", "v100", "local", "gce", "us-central1-c", "6h", "sync", "async", "replace", "resnet-cifar", "-1"]
    ),
)
_values = st.recursive(
    _scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=8), kids, max_size=3)),
    max_leaves=8,
)
_PATHS = [
    ("name",),
    ("provider",),
    ("provider", "kind"),
    ("provider", "zones"),
    ("provider", "project"),
    ("training",),
    ("training", "train_steps"),
    ("training", "mode"),
    ("training", "job"),
    ("cluster",),
    ("cluster", "workers"),
    ("cluster", "workers", 0),
    ("cluster", "workers", 0, "gpu"),
    ("cluster", "workers", 0, "count"),
    ("cluster", "workers", 1, "zone"),
    ("cluster", "parameter_servers"),
    ("policy",),
    ("policy", "deadline"),
    ("policy", "budget_usd"),
    ("pricing", "book"),
    ("storage",),
    ("search",),
    ("search", "gpus"),
]


def _mutate(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out
    for key in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(key, {})
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return out
    last = path[-1]
    if isinstance(node, dict) or isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = value
    return out


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mutations=st.lists(st.tuples(st.sampled_from(_PATHS), _values), min_size=1, max_size=4),
    drop=st.lists(st.sampled_from(["name", "cluster", "training", "provider", "policy"]), max_size=2),
)
def test_malformed_specs_give_only_clean_errors(mutations: list[tuple[tuple[Any, ...], Any]], drop: list[str]) -> None:
    doc: dict[str, Any] = copy.deepcopy(GOOD)
    for path, value in mutations:
        doc = _mutate(doc, path, value)
    for key in drop:
        doc.pop(key, None)
    try:
        validate_spec(doc)
    except SpecError as exc:
        assert exc.errors
        for err in exc.errors:
            text = str(err)
            assert err.message and "Traceback" not in text
            assert "\n" not in err.path


@settings(max_examples=300, deadline=None)
@given(doc=_values)
def test_arbitrary_documents_give_only_clean_errors(doc: Any) -> None:
    try:
        validate_spec(doc)
    except SpecError as exc:
        assert exc.errors and all(e.message for e in exc.errors)
