"""Issue 54 item 3: on torchft replica groups the planner counts a revocation as the survivors' quorum pause and the
lost group's share of the pace while its replacement boots, not a restart of the world (elastic torchrun)."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.costmodel.planner import PlanResult, plan
from orchestrator.model.spec import JobSpec, validate_spec
from orchestrator.sim.from_spec import cluster_from_spec
from orchestrator.sim.montecarlo import run_monte_carlo

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _spec(example: str, fault_tolerance: str) -> JobSpec:
    """The gce example on torchrun or on replica groups (``training.fault_tolerance``)."""
    raw = yaml.safe_load((EXAMPLES / example).read_text())
    raw["training"]["fault_tolerance"] = fault_tolerance
    return validate_spec(raw)


def _plan(example: str, fault_tolerance: str) -> PlanResult:
    return plan(_spec(example, fault_tolerance))


def _overheads(result: PlanResult) -> dict[tuple[tuple[str | None, str | None, bool], ...], float]:
    return {tuple((w.gpu, w.zone, w.spot) for w in c.workers): c.revocation_overhead_s for c in result.candidates}


def test_a_pinned_mixed_cluster_on_replica_groups_expects_less_revocation_overhead() -> None:
    ft, run = _plan("gce-resnet-data-parallel.yaml", "torchft").chosen, _plan("gce-resnet-data-parallel.yaml",
                                                                                "torchrun").chosen
    assert ft is not None and run is not None
    assert 0 < ft.revocation_overhead_s < run.revocation_overhead_s and ft.cost_usd < run.cost_usd


def test_the_simulator_prices_a_revocation_as_the_planner_does_on_both() -> None:
    """The same lifetimes (seed) simulated on replica groups and on torchrun: each run with a revocation costs less
    on replica groups, none more. (The simulator restarted a cloud torchrun world in 0 s, its start-up, while
    replica groups paused the notice window plus the quorum: torchft came out dearer.)"""
    runs = {ft: run_monte_carlo(cluster_from_spec(_spec("gce-resnet-data-parallel.yaml", ft)), runs=600, seed=1)
            for ft in ("torchft", "torchrun")}
    ft, run = runs["torchft"], runs["torchrun"]
    hit = run.revocations > 0
    assert hit.any() and (ft.cost_usd[~hit] == run.cost_usd[~hit]).all()
    assert (ft.cost_usd[hit] < run.cost_usd[hit]).all(), (ft.cost_usd[hit] - run.cost_usd[hit]).max()


def test_every_searched_spot_cluster_on_replica_groups_expects_less_revocation_overhead() -> None:
    ft, run = _overheads(_plan("gce-current-gpus.yaml", "torchft")), _overheads(_plan("gce-current-gpus.yaml",
                                                                                     "torchrun"))
    spot = [k for k in ft if any(s for _, _, s in k) and k in run]
    assert spot and all(ft[k] < run[k] for k in spot), [(k, ft[k], run[k]) for k in spot if ft[k] >= run[k]][:3]


def test_replica_groups_on_gce_are_admitted_and_open_their_ports_to_the_job_s_own_vms() -> None:
    """torchft on gce (its workers reach the Lighthouse through SSH forwards, control/lighthouse.reach): the dry run
    opens the run-time ports between the job's tagged VMs only, and nothing to any address range but SSH."""
    from orchestrator.providers.gce.dry_run import gce_dry_run

    raw = yaml.safe_load((EXAMPLES / "gce-resnet-data-parallel.yaml").read_text())
    raw["training"]["fault_tolerance"] = "torchft"
    inserts = gce_dry_run(validate_spec(raw))["firewalls.insert"]
    rules = {r["body"]["name"].rsplit("-", 1)[-1]: r["body"] for r in inserts}
    assert rules["internal"]["allowed"] == [{"IPProtocol": "tcp", "ports": ["1024-65535"]}]
    assert rules["internal"]["sourceTags"] == rules["internal"]["targetTags"]
    assert "sourceRanges" not in rules["internal"] and rules["ssh"]["allowed"][0]["ports"] == ["22"]


def _judged_warnings(example: str, tmp_path: Path, **training: object) -> list[str]:
    from orchestrator.planning.admission import judge_file

    raw = yaml.safe_load((EXAMPLES / example).read_text())
    raw["training"].update(training)
    if raw["provider"]["kind"] == "local":
        raw["storage"] = str(tmp_path / "runs")
    path = tmp_path / example
    path.write_text(yaml.safe_dump(raw))
    return list(judge_file(path).result.warnings)


def test_an_all_spot_torchrun_job_is_warned_that_worker_0_holds_the_rendezvous(tmp_path: Path) -> None:
    (warning,) = [w for w in _judged_warnings("local-torch-ft.yaml", tmp_path, fault_tolerance="torchrun")
                  if "rendezvous" in w]
    assert warning.startswith("cluster.workers: every worker is spot, so torchrun's rendezvous store lives on "
                              "worker 0") and "fault_tolerance: torchft" in warning  # the fix, on any provider
    assert not [w for w in _judged_warnings("local-torch-ft.yaml", tmp_path) if "rendezvous" in w]  # replica groups
    # an on-demand worker holds the store (the hetero example's V100): nothing to say
    assert not [w for w in _judged_warnings("local-torch-hetero.yaml", tmp_path) if "rendezvous" in w]
