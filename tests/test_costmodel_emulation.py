"""Emulated local GPUs follow measured curves (not the cost model); planner and simulator share one
accounting; the study's chief-on-worker-0 setup in slots, planner, simulator and ledger prices."""

from __future__ import annotations

import ast
import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.costmodel.calibration import load_measurements
from orchestrator.costmodel.slots import expand
from orchestrator.model.paths import data_dir
from orchestrator.model.spec import validate_spec
from orchestrator.planning.local_run import plan_job as plan
from orchestrator.providers.local.emulation import (
    curve_s,
    emulated_step_s,
    emulation_sleep,
    reference_batch,
    reference_step_s,
)
from orchestrator.providers.local.step_model import step_model_for
from orchestrator.sim.engine import NoRevocations, ScheduleLifetimes, simulate
from orchestrator.sim.from_spec import cluster_from_spec

REPO = Path(__file__).resolve().parent.parent


def local_spec(**cluster: Any) -> dict[str, Any]:
    return {
        "name": "emu",
        "provider": {"kind": "local", "time_scale": 1, "revocations": "none", "emulation_k80_step_s": 0.216},
        "training": {"job": "resnet-cifar", "hparam_set": "resnet_cifar_32", "mode": "async", "train_steps": 6400,
                     "batch_per_worker": 128, "checkpoint_every": 1000},
        "cluster": {"parameter_servers": {"count": 1}, "chief": cluster.get("chief", {}),
                    "workers": [{"gpu": "k80", "count": 2, "spot": True}, {"gpu": "v100", "count": 1}]},
        "pricing": {"book": "2019-02"},
    }


def test_emulated_h100_traces_the_measured_curve() -> None:
    # The curve is one session's: the 2026-11-23 run, which has every batch from 32 to 2048.
    measured = {m.batch: float(m.step_time_s or 0) for m in load_measurements(data_dir() / "measurements")
                if m.gpu == "h100" and m.key == "pytorch-eager" and m.model == "resnet_cifar_32"
                and m.source.endswith("2026-11-23, bench/gpu/torchbench.py curve")}
    # With the K80 sleeping its real 216 ms, an emulated H100 sleeps the H100's measured step time.
    for batch in (32, 128, 512, 2048):
        assert emulated_step_s("h100", batch, 0.216) == pytest.approx(measured[batch], rel=1e-9)
    assert measured[512] < curve_s(768) < measured[1024]  # interpolated between measured batches
    assert curve_s(4096) > measured[2048]  # extrapolated with the last measured slope


def test_ratios_come_from_measurements_with_their_source() -> None:
    k80, v100 = reference_step_s("k80"), reference_step_s("v100")
    assert "transient-deep-learning" in k80.source and k80.step_s == pytest.approx(0.216)
    assert "no measurement" in reference_step_s("t4").source  # datasheet ratio, flagged
    sleep = emulation_sleep(validate_spec(local_spec()))
    assert sleep("k80", 128) == pytest.approx(0.216) and sleep("v100", 128) == pytest.approx(v100.step_s, rel=1e-3)
    assert sleep(None, 128) == 0.0


def test_emulation_does_not_use_the_cost_model() -> None:
    tree = ast.parse((REPO / "orchestrator" / "providers" / "local" / "emulation.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "collections.abc", "dataclasses", "orchestrator.model.catalog",
                        "orchestrator.model.paths", "orchestrator.model.spec"}  # no cost model, not even its reader


def test_a_compute_bound_gpu_steps_longer_with_its_batch() -> None:
    """A K80 / P100 / V100 at batch 128 is far above the H100's ~13 ms overhead floor: the emulation reads the
    H100 curve at the batch of equal work, so its step grows with its batch, and at a small batch it falls to
    that floor. At the reference batch each GPU sleeps its measured ratio to the K80."""
    from orchestrator.providers.local.emulation import equivalent_batch

    for gpu in ("k80", "p100", "v100"):
        t = reference_step_s(gpu).step_s
        assert curve_s(equivalent_batch(gpu)) == pytest.approx(t, rel=1e-9)  # the inverse of the measured curve
        assert emulated_step_s(gpu, 128, 0.216) == pytest.approx(t, rel=1e-9)
        assert emulated_step_s(gpu, 64, 0.216) < 0.6 * t and emulated_step_s(gpu, 256, 0.216) > 1.6 * t
        assert emulated_step_s(gpu, 1, 0.216) == pytest.approx(curve_s(32), rel=0.1)  # the overhead floor
    assert equivalent_batch("h100") == 128  # the curve's own GPU keeps its own (overhead-bound) shape


def test_a_pinned_split_emulates_the_same_gpus_as_the_global_batch_it_sums_to() -> None:
    doc = yaml.safe_load((REPO / "examples" / "local-torch-resplit.yaml").read_text())
    split = copy.deepcopy(doc)
    del split["training"]["global_batch"]
    split["cluster"]["workers"] = [{**g, "batch": b} for g, b in zip(doc["cluster"]["workers"], [28, 50, 18],
                                                                     strict=True)]
    as_global, as_split = emulation_sleep(validate_spec(doc)), emulation_sleep(validate_spec(split))
    assert reference_batch(validate_spec(split)) == reference_batch(validate_spec(doc)) == 32
    assert as_split("v100", 28) == as_global("v100", 28) and as_split("k80", 18) == as_global("k80", 18)


def test_the_local_providers_step_model_is_the_emulation_and_a_clouds_the_cost_models() -> None:
    """One step-model interface: a local spec's is the emulation (providers/local), sleeping what its workers sleep
    and splitting by the measured speeds; a cloud spec's is the cost model's, with no emulation."""
    from orchestrator.costmodel.stepmodel import CalibratedStep
    from orchestrator.providers.local.step_model import EmulatedStep

    doc = yaml.safe_load((REPO / "examples" / "local-torch-resplit.yaml").read_text())
    spec = validate_spec(doc)
    steps = step_model_for(spec)
    assert isinstance(steps, EmulatedStep) and steps.wall_clock and steps.source == "local-emulation"
    assert steps.time_scale == spec.provider.time_scale and steps.reference_batch == reference_batch(spec)
    sleep = emulation_sleep(spec)
    for gpu, batch in (("v100", 28), ("p100", 50), ("k80", 18), (None, 32)):
        assert steps.sleep_s(gpu, batch) == sleep(gpu, batch)
    assert steps.split_speeds(["k80", "v100"]) == [1.0 / emulated_step_s(g, 128, 1.0) for g in ("k80", "v100")]
    off = validate_spec({**doc, "provider": {**doc["provider"], "emulation_k80_step_s": 0}})
    assert step_model_for(off).sleep_s("v100", 28) == 0.0 and step_model_for(off).split_speeds(["k80"])
    chosen = step_model_for(validate_spec(yaml.safe_load((REPO / "examples" / "gce-l4x4-spot.yaml").read_text())))
    assert isinstance(chosen, CalibratedStep) and not chosen.wall_clock and chosen.split_speeds(["k80"]) is None


def test_the_cost_model_never_asks_whether_a_provider_emulates_gpus() -> None:
    """The cost model asks the step model it is handed (``wall_clock``, ``sleep_s``, ``split_speeds``), never the
    spec's provider, and never imports the local provider's emulation."""
    for path in sorted((REPO / "orchestrator" / "costmodel").rglob("*.py")):
        text = path.read_text()
        assert "emulates_gpus" not in text, path
        assert "providers" not in {n.module.split(".")[1] for n in ast.walk(ast.parse(text))
                                   if isinstance(n, ast.ImportFrom) and n.module and "." in n.module}, path


def test_planner_and_simulator_agree_without_revocations() -> None:
    spec = validate_spec(local_spec())
    chosen = plan(spec)[0].chosen
    assert chosen is not None
    res = simulate(cluster_from_spec(spec), NoRevocations())
    assert chosen.base_time_s == pytest.approx(res.wall_time_s, rel=0.02)
    assert chosen.hourly_usd * chosen.base_time_s / 3600 == pytest.approx(res.cost_usd, rel=0.02)


def test_chief_on_worker0_has_no_bill_and_falls_with_worker0() -> None:
    own = validate_spec(local_spec())
    shared = validate_spec(local_spec(chief={"on_worker0": True}))
    # No chief slot (no VM, no bill): worker 0's slot hosts it.
    assert [s.name for s in expand(shared) if s.role.value == "chief" or s.hosts_chief] == ["worker-0"]
    p_own, p_shared = plan(own)[0].chosen, plan(shared)[0].chosen
    assert p_own is not None and p_shared is not None
    assert p_shared.cost_usd < p_own.cost_usd and p_shared.to_cluster().chief.on_worker0
    c = replace(cluster_from_spec(shared), schedule=None)
    assert "chief-0" not in [s.name for s in c.slots] and c.slots[1].hosts_chief
    base = simulate(c, NoRevocations())
    hit0 = simulate(c, ScheduleLifetimes(c, [("worker-0", 300.0)]))
    hit1 = simulate(c, ScheduleLifetimes(c, [("worker-1", 300.0)]))
    assert hit0.steps_lost > 0 and hit1.steps_lost == 0  # worker 0 takes the chief (and progress) with it
    assert hit0.wall_time_s > hit1.wall_time_s > base.wall_time_s


def test_gce_launch_takes_chief_on_worker0_with_no_chief_vm() -> None:
    doc = local_spec(chief={"on_worker0": True})
    doc["provider"] = {"kind": "gce", "project": "my-project", "zones": ["us-central1-c"]}
    doc["cluster"]["workers"] = [{"gpu": "v100", "count": 2}]
    slots = expand(validate_spec(doc))
    assert [s.role.value for s in slots].count("chief") == 0
    assert [s.hosts_chief for s in slots if s.role.value == "worker"] == [True, False]


def test_local_host_is_fitted_from_local_jobs() -> None:
    import yaml

    from orchestrator.costmodel.accounting import fit_local_host, local_host, local_worker_steps
    from orchestrator.costmodel.compute import Calibration

    doc = local_spec()
    spec = validate_spec(doc)
    truth = Calibration(local_host={**local_host(), "cpu_step_s": 0.4, "cpu_step_fixed_s": 0.0})
    gpus, batches = ["k80", "k80", "v100"], [128, 128, 128]
    steps = local_worker_steps(spec, gpus, batches, truth, steps=step_model_for(spec))
    run = {"spec_yaml": yaml.safe_dump(doc), "created_at": 0.0, "first_step_at": 40.0, "last_step_at": 140.0,
           "ended_at": 145.0, "workers": [{"gpu": g, "batch": b, "step_time_s": t}
                                          for g, b, t in zip(gpus, batches, steps, strict=True)]}
    host = fit_local_host([run], step_model_for)
    assert host["cpu_step_s"] == pytest.approx(0.4, rel=0.01) and host["teardown_s"] == pytest.approx(5.0)
    rate = sum(1.0 / t for t in steps)
    assert host["startup_s"] == pytest.approx(40.0 - 70.0 - 10 / rate)  # created -> step 0, less the boot


def test_each_frameworks_cpu_step_is_fitted_apart_and_sync_steps_in_lockstep() -> None:
    import yaml

    from orchestrator.costmodel.accounting import fit_local_host, local_host, local_worker_steps
    from orchestrator.costmodel.compute import Calibration

    tf_doc = local_spec()
    torch_doc = {**local_spec(), "name": "emu-torch",
                 "training": {"framework": "pytorch", "hparam_set": "resnet_tiny", "train_steps": 500,
                              "global_batch": 96, "checkpoint_every": 100},
                 "cluster": {"workers": [{"gpu": "v100", "count": 1}, {"gpu": "k80", "count": 2, "spot": True}]}}
    truth = Calibration(local_host={**local_host(), "cpu_step_s": 0.4, "cpu_step_fixed_s": 0.0,
                                    "torch_cpu_step_s": 0.08, "torch_cpu_step_batch": 32.0})
    runs = []
    for doc, batches in ((tf_doc, [128, 128, 128]), (torch_doc, [48, 24, 24])):
        spec = validate_spec(doc)
        gpus = ["k80", "k80", "v100"] if doc is tf_doc else ["v100", "k80", "k80"]
        steps = local_worker_steps(spec, gpus, batches, truth, steps=step_model_for(spec))
        if doc is torch_doc:  # lockstep: every worker reports the cluster's step, its slowest worker's
            assert steps[1] == pytest.approx(steps[2]) and steps[0] != pytest.approx(steps[1])
            steps = [max(steps)] * 3
        runs.append({"spec_yaml": yaml.safe_dump(doc), "created_at": 0.0, "first_step_at": 40.0,
                     "last_step_at": 140.0, "ended_at": 145.0,
                     "workers": [{"gpu": g, "batch": b, "step_time_s": t}
                                 for g, b, t in zip(gpus, batches, steps, strict=True)]})
    host = fit_local_host(runs, step_model_for)
    assert host["cpu_step_s"] == pytest.approx(0.4, rel=0.01)
    assert host["torch_cpu_step_s"] == pytest.approx(0.08, rel=0.01)
    assert host["torch_startup_s"] != host["startup_s"]  # TF's start-up less its async first steps


def test_simulated_local_run_replays_the_providers_seeded_draws() -> None:
    from orchestrator.sim.montecarlo import run_monte_carlo

    doc = local_spec()
    doc["provider"].update(revocations="model", time_scale=1200, seed=3)
    c = cluster_from_spec(validate_spec(doc))
    assert c.time_scale == 1200 and not c.preemptible and c.lifetime_fn is not None
    mc = run_monte_carlo(c, 50, 1)
    assert mc.revocations.min() == mc.revocations.max()  # one outcome: the provider's own draws
    assert mc.summary()["revocation_model"] == "local provider's seeded draws"
    cloud = cluster_from_spec(validate_spec(doc), as_cloud=True)
    assert cloud.lifetime_fn is None and cloud.time_scale == 1.0 and cloud.boot_delay_s == 70.0


def test_model_calibrate_from_db_fits_a_pytorch_only_host(tmp_path: Path) -> None:
    """`model calibrate --from-db` on a DB whose only finished local job is PyTorch: the torch CPU step is fitted
    and printed, and TensorFlow's figures are left to data/local_host.csv."""
    import os
    import subprocess
    import sys

    import yaml

    from orchestrator.store.db import open_session
    from orchestrator.store.models import Job, Metric

    doc = {**local_spec(), "name": "emu-torch",
           "training": {"framework": "pytorch", "hparam_set": "resnet_tiny", "train_steps": 500,
                        "global_batch": 96, "checkpoint_every": 100},
           "cluster": {"workers": [{"gpu": "v100", "count": 1}, {"gpu": "k80", "count": 2, "spot": True}]}}
    (tmp_path / "home").mkdir(exist_ok=True)  # conftest's ORCHESTRATOR_HOME, where the DB file goes
    with open_session() as session:
        session.add(Job(id="emu-torch-1", name="emu-torch", provider="local", mode="sync", cluster_shape="3",
                        spec_yaml=yaml.safe_dump(doc), storage_uri=str(tmp_path), price_book="2019-02",
                        status="succeeded", train_steps=500, created_at=0.0, ended_at=200.0,
                        updated_at=200.0))
        session.add_all([Metric(job_id="emu-torch-1", kind="step", step=s, at=at)
                         for s, at in ((10, 80.0), (500, 195.0))])
        session.add_all([Metric(job_id="emu-torch-1", kind="worker", worker=w, gpu=g, batch=b, step=200,
                                step_time_s=0.2, at=120.0)
                         for w, g, b in ((0, "v100", 48), (1, "k80", 24), (2, "k80", 24))])
        session.commit()
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "model", "calibrate", "--from-db"],
                         capture_output=True, text=True, env=os.environ.copy(), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "finished local job(s): CPU step pytorch" in text and "tensorflow" not in text
