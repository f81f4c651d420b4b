"""What the pictures say: one colour per slot across the report's panels, throughput broken where no instance
ran, and a simulate CDF that says "all runs hit the deadline" instead of drawing one vertical line."""

from __future__ import annotations

import math
from pathlib import Path

from orchestrator.cli.plots import GPU_COLOURS, broken_at_long_gaps, gather, slot_colours, with_gaps
from orchestrator.store.db import open_session
from tests.obs_helpers import finished_job

REPO = Path(__file__).resolve().parent.parent


def test_each_slot_has_one_colour_and_its_line_breaks_across_the_revocation(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'obs.db'}"
    with open_session(url) as session:
        data = gather(session, finished_job(session, tmp_path / "runs"))
    colours = slot_colours(data)
    assert colours["worker-0"] == GPU_COLOURS["k80"] and colours["worker-1"] == GPU_COLOURS["v100"]
    assert colours["ps-0"] == colours["chief-0"]  # CPU grey; every GPU slot differs
    revoked = next(b.revoked for b in data.bars if b.revoked is not None)
    assert revoked is not None
    shown = with_gaps(data, "worker-0", data.worker_rates["worker-0"])
    gaps = [i for i, (_, v) in enumerate(shown) if math.isnan(v)]
    assert len(gaps) == 1  # one break, where the revoked k80 stopped and its replacement took over
    before, after = shown[gaps[0] - 1][0], shown[gaps[0] + 1][0]
    assert before < revoked <= after
    # a slot's rate of 0 (its replacement not yet training) is a gap too, not a line along the axis
    zeroed = [(t, 0.0 if 45 < t < 60 else v) for t, v in data.worker_rates["worker-0"]]
    assert all(not 45 < t < 60 or math.isnan(v) for t, v in with_gaps(data, "worker-0", zeroed))


def test_the_cluster_line_breaks_where_nothing_trained_for_long() -> None:
    waiting = [(115.0, 50.0)]  # the first report after 67 s without training
    points = [(float(t), 150.0) for t in range(0, 50, 2)] + waiting + [(float(t), 160.0) for t in range(117, 140, 2)]
    shown = broken_at_long_gaps(points)
    breaks = [t for t, v in shown if math.isnan(v)]
    assert breaks == [(48.0 + 115.0) / 2]  # waiting 48-115 s: no line across it
    assert [p for p in shown if not math.isnan(p[1])] == points
    assert broken_at_long_gaps(points[:1]) == points[:1] and broken_at_long_gaps([]) == []


def test_a_cdf_of_runs_that_all_hit_the_deadline_is_said_not_drawn() -> None:
    from orchestrator.cli.simulate_cmd import cdf_notes
    from orchestrator.costmodel.revocation.model import load_revocation_model
    from orchestrator.model.spec import load_spec
    from orchestrator.sim.from_spec import cluster_from_spec
    from orchestrator.sim.montecarlo import run_monte_carlo

    cluster = cluster_from_spec(load_spec(REPO / "examples" / "reproduce-icac19.yaml"))  # 20.6 h > 12 h here
    mc = run_monte_carlo(cluster, 20, 0, model=load_revocation_model(None), kind="bathtub")
    time_note, cost_note = cdf_notes(mc)
    assert time_note == "reproduce-icac19: all runs hit the deadline (12.00h); none finished"
    assert cost_note is not None and "(stopped at the deadline)" in cost_note
    cloud = run_monte_carlo(cluster_from_spec(load_spec(REPO / "examples" / "reproduce-icac19.yaml"),
                                              as_cloud=True), 50, 0, model=load_revocation_model(None),
                            kind="bathtub")
    assert cdf_notes(cloud) == (None, None)  # runs that differ: the CDFs are drawn
