"""``training.parallelism: auto`` runs the built-in PyTorch job as a pipeline where the planner chooses one; a
``run:`` script (data parallel only) whose model only a pipeline places is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.control.torch_task import pipeline_section
from orchestrator.costmodel.planner import launch_strategy, plan
from orchestrator.costmodel.slots import expand
from orchestrator.model.spec.load import load_spec
from orchestrator.planning.admission import judge_file
from orchestrator.planning.judge import NotLaunchable

REPO = Path(__file__).resolve().parents[1]


def _spec(tmp_path: Path, global_batch: int, extra: str = "") -> Path:
    """The ResNet-32 example (T4, L4, A100 spot) with ``global_batch``; 20,000 holds in no single GPU's memory."""
    text = (REPO / "examples" / "gce-resnet-data-parallel.yaml").read_text()
    text = text.replace("global_batch: 512", f"global_batch: {global_batch}{extra}").replace("train_steps: 64000",
                                                                                          "train_steps: 200")
    path = tmp_path / f"resnet-{global_batch}.yaml"
    path.write_text(text)
    return path


def test_auto_runs_a_pipeline_where_the_planner_chooses_one(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path, 20000))
    chosen = plan(spec).chosen
    assert chosen is not None and chosen.strategy == "pipeline"
    assert launch_strategy(spec, chosen) == "pipeline"
    section = pipeline_section(spec, expand(spec), 20000)
    assert section is not None and len(section.stage_slots) == 3 and section.micro_batches >= 1
    # where data parallel is chosen, auto stays data parallel
    small = load_spec(_spec(tmp_path, 512))
    assert plan(small).chosen.strategy == "data"  # type: ignore[union-attr]
    assert pipeline_section(small, expand(small), 512) is None


def test_a_run_script_whose_model_only_a_pipeline_places_is_refused(tmp_path: Path) -> None:
    path = _spec(tmp_path, 20000, "\n  run: python train.py")
    spec = load_spec(path)
    assert launch_strategy(spec, plan(spec).chosen) is None
    with pytest.raises(NotLaunchable, match="only the built-in PyTorch job runs the pipeline"):
        judge_file(path)
