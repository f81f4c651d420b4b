"""Hostile specs (hypothesis, bench/spec_fuzz.py): each is accepted or refused with field-named errors, never a
traceback or a hang, and a refusal leaves no file, folder, process or DB row. The figures are printed
(`pytest -s`) and are the same as `python bench/spec_fuzz.py --examples 1000`. A sample of the named hostile
specs (bench/hostile_specs.py; the bench runs all of them) goes through `plan`, `launch --dry-run` and `launch`.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from orchestrator_testing.bench_cli import load_bench


def _bench(name: str = "spec_fuzz") -> ModuleType:
    return load_bench(name)


def test_named_hostile_specs_are_refused_by_plan_dry_run_and_launch(tmp_path: Path) -> None:
    hostile = _bench("hostile_specs")
    assert len(list(hostile.cases())) >= 220
    suite = hostile.run_suite(tmp_path, every=40)  # 9 of the 338; the bench runs them all
    print(suite.table())
    for kind in ("tracebacks", "hangs", "accepted wrongly", "left anything", "valid spec refused"):
        assert not suite.samples.get(kind), "\n---\n".join(suite.samples[kind])
    for verb, counts in suite.counts.items():
        assert counts["tried"] >= 5, verb
        if "valid" not in verb:
            assert counts["refused cleanly"] == counts["tried"], (verb, counts)
        else:
            assert counts["accepted"] == counts["tried"], (verb, counts)


def test_1000_hostile_specs_are_accepted_or_refused_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    monkeypatch.setenv("ORCHESTRATOR_DB_URL", f"sqlite:///{tmp_path}/orchestrator.db")
    fuzzer = bench.fuzz(1000, tmp_path, subprocess_every=250)  # 4 of them also as `orchestrator launch --dry-run`
    figures = fuzzer.figures()
    print(json.dumps(figures, indent=2))
    for outcome in ("tracebacks", "hangs", "left behind", "subprocess tracebacks"):
        assert not fuzzer.samples.get(outcome), "\n---\n".join(fuzzer.samples[outcome])
    assert figures["specs tried"] >= 1000
    assert figures["tracebacks"] == figures["hangs"] == figures["refusals that left something"] == 0
    assert figures["refused cleanly"] + figures["accepted"] == figures["specs tried"]
    assert figures["accepted"] > 0 and figures["refused cleanly"] > 0  # both paths are exercised
    assert figures["subprocess"].get("tracebacks", 0) == figures["subprocess"].get("hangs", 0) == 0
    assert not figures["db created"]


def test_the_issue_s_hostile_specs_are_refused_with_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.model.spec import SpecError, load_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.py").write_text("print(1)\n")
    head = "name: x\ncluster: {workers: [{gpu: t4}]}\n"
    cmd = "training: {job: command, command: 'true', files: [%s]}\n"
    cases = {
        "cluster": "name: x\ncluster: {workers: [{gpu: t4}]}\ncluster: {workers: [{gpu: v100, count: 64}]}\n",
        "provider.time_scale": head + "provider: {kind: local, time_scale: 1e-300}\n",
        "policy.budget_usd": head + "policy: {budget_usd: .inf}\n",
        "policy.deadline": head + "policy: {deadline: .nan}\n",
        "cluster.workers[0].count": "name: x\ncluster: {workers: [{gpu: t4, count: true}]}\n",
        "storage": head + "storage: /dev/null\n",
        "training.files[0]": head + cmd % "../../etc/passwd",
        "training.files[1]": head + cmd % "ok.py, /etc/passwd",
        "training.files[2]": head + cmd % "ok.py, ok.py, missing.py",
        "provider.inventory": head.replace("name: x\n", "name: x\nprovider: {kind: ssh, inventory: /etc}\n"),
        "name": head.replace("name: x", "name: " + "Y" * 5000),
        "search": "name: x\nsearch: {gpus: [t4, l4, v100, a100, h100], max_workers: 256, max_ps: 16, mixed: true}\n",
        "pricing": head + "pricing: 7\n",
        # issue 21: typed fields with a grammar, one line each naming the field
        "provider.project": head + "provider: {kind: gce, project: ../../x/y/zz, zones: [us-central1-a]}\n",
        "provider.network": head + "provider: {kind: gce, project: my-project, network: \"default\\nx\"}\n",
        "provider.image": head + "provider: {kind: gce, project: my-project, image: \"debian\\n\"}\n",
        "provider.ssh_source_ranges[0]": head + "provider: {kind: gce, project: my-project, "
                                                "ssh_source_ranges: [999.999.999.999/99]}\n",
        "provider.task_port": head + "provider: {kind: gce, project: my-project, task_port: 22}\n",
        "provider.base_port": head + "provider: {kind: local, base_port: 80}\n",
        "policy.deadline ": head + "policy: {deadline: 1e-9}\n",
        "training.data_dir": head + "training: {data_dir: \"a\\nb\"}\n",
        "storage ": head + "storage: /proc\n",
        "!!binary": head.replace("name: x", "name: !!binary aGVsbG8="),  # the reader refuses the tag itself
    }
    for field, text in cases.items():
        path = tmp_path / "spec.yaml"
        path.write_text(text)
        with pytest.raises(SpecError) as info:
            load_spec(path)
        messages = [str(e) for e in info.value.errors]
        field = field.strip()  # a trailing space: a second case for the same field
        assert any(m.startswith(field) or f"'{field}'" in m for m in messages), (field, messages)
        assert any(field in m for m in messages), (field, messages)
        assert all(len(m) < 400 and "\n" not in m for m in messages), messages
        if field == "name":  # a long bad value is cut to 60 chars + '…'
            assert "Y" * 60 + "…" in messages[0] and "Y" * 61 not in messages[0]
    assert not (tmp_path / "runs").exists()
