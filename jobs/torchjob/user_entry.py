"""One rank of a user's ``run:`` command: ``user_entry.py --task task.json -- CMD ARGS...`` (under torchrun).

Runs the command with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) plus ORCHESTRATOR_*,
passes its output through, and appends every line global rank 0 prints that is a JSON object with
``"orchestrator_metric": 1`` to the job's ``metrics.jsonl`` (then the controller stores it in the DB).
The command's exit code is this rank's exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchjob.runtime import die_with_parent, log  # noqa: E402
from torchjob.task import TaskError, load  # noqa: E402

KINDS = {"step", "eval", "checkpoint", "world"}


def metric_record(line: str) -> dict[str, object] | None:
    """The metrics.jsonl record for one printed line, or None if it is not a metric line."""
    line = line.strip()
    if not (line.startswith("{") and "orchestrator_metric" in line):
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.pop("orchestrator_metric", None) in (None, 0, False):
        return None
    step = rec.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    kind = rec.get("kind")
    if kind not in KINDS:
        rec["kind"] = "eval" if "accuracy" in rec and "loss" not in rec else "step"
    rec.setdefault("t", round(time.time(), 3))
    return rec


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        log("usage: user_entry.py --task task.json -- CMD [ARGS...]")
        return 2
    cmd = argv[argv.index("--") + 1:]
    die_with_parent()
    _set_rank_batch(argv)
    rank0 = os.environ.get("RANK", "0") == "0"
    metrics_path = Path(os.environ.get("ORCHESTRATOR_METRICS_FILE", "metrics.jsonl"))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1, preexec_fn=die_with_parent)
    assert proc.stdout is not None
    last: dict[str, object] = {}
    with open(metrics_path, "a", encoding="utf-8") if rank0 else open(os.devnull, "w") as out:  # noqa: SIM115
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            rec = metric_record(line) if rank0 else None
            if rec is not None:
                out.write(json.dumps(rec, separators=(",", ":")) + "\n")
                out.flush()
                last.update({k: rec[k] for k in ("step", "loss", "accuracy") if k in rec})
    code = proc.wait()
    if code == 0 and rank0:
        write_result(metrics_path.parent / "result.json", last)
    return code


def _set_rank_batch(argv: list[str]) -> None:
    """ORCHESTRATOR_LOCAL_BATCH_SIZE for this local rank: its share of the node's batch (node.py set local rank 0's)."""
    if "--task" not in argv[: argv.index("--")]:
        return
    try:
        task = load(argv[argv.index("--task") + 1])
    except (TaskError, IndexError) as e:
        log(f"cannot read the task for the rank's batch: {e}")
        return
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if 0 <= local_rank < task.nproc_per_node:
        os.environ["ORCHESTRATOR_LOCAL_BATCH_SIZE"] = str(task.rank_batch(local_rank))


def write_result(path: Path, last: dict[str, object]) -> None:
    """The job's result when the command succeeds on rank 0: the last metrics it printed."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"step": last.get("step"), "accuracy": last.get("accuracy"),
                               "loss": last.get("loss"), "framework": "pytorch", "run": True}) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
