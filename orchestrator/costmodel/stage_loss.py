"""What a pipeline does when one of its stages is revoked: wait for the replacement, or re-partition the model over
the surviving GPUs and go on without it (pure; the simulator and the planner both ask it).

A pipeline step needs every stage, so a lost stage stops the whole pipeline (data parallel survivors keep
training). Two ways on, for the ``remaining`` steps:

* **wait**: no step until the replacement is up and every stage has restored its checkpoint
  (``replacement_s``: boot + start-up; then ``restore_s``), then the old pace. Every survivor is billed while it
  idles, and the replacement from its request.
* **re-partition**: the survivors restore a new partition of the same global batch (any partition resumes any
  checkpoint, ``jobs/torchjob/pipe.py``) after ``restore_s`` and train at the survivors' slower pace, with no
  replacement to pay for. Impossible when no partition of the model fits the survivors' memory.

Each option's time and cost is ``(its delay + remaining x its step) x its hourly price``; the cheaper wins
(``objective: time``: the faster), a tie waits. With a deadline, an option that meets it beats one that misses it.
Later revocations are left out: they hit either option alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

WAIT: Final = "wait"
REPARTITION: Final = "repartition"
ACTIONS: Final = (WAIT, REPARTITION)


@dataclass(frozen=True)
class StageLossOption:
    action: str
    time_s: float  # until the remaining steps are done
    usd: float
    possible: bool


@dataclass(frozen=True)
class StageLossDecision:
    action: str  # wait | repartition
    wait: StageLossOption
    repartition: StageLossOption
    reason: str


def decide_stage_loss(
    remaining_steps: float,
    full_step_s: float,
    survivor_step_s: float | None,
    replacement_s: float,
    restore_s: float,
    usd_per_s_with_replacement: float,
    usd_per_s_survivors: float,
    objective: str = "cost",
    deadline_left_s: float | None = None,
    repartition_delay_s: float = 0.0,
) -> StageLossDecision:
    """``survivor_step_s``: the step of the best partition over the survivors (None: none fits their memory).
    Prices are per second: every instance the pipeline holds with the replacement, and without it.
    ``deadline_left_s``: seconds until the job's deadline (None: no deadline). ``repartition_delay_s``: before the
    survivors can start again without the lost stage (the daemon waits out its notice window, in which every stage
    checkpoints; a replacement's boot overlaps that window)."""
    if remaining_steps < 0 or replacement_s < 0 or restore_s < 0:
        raise ValueError("remaining steps and delays must be >= 0")
    wait_s = replacement_s + restore_s + remaining_steps * full_step_s
    wait = StageLossOption(WAIT, wait_s, wait_s * usd_per_s_with_replacement, True)
    fits = survivor_step_s is not None and survivor_step_s > 0 and math.isfinite(survivor_step_s)
    rep_s = (repartition_delay_s + restore_s + remaining_steps * survivor_step_s
             if fits and survivor_step_s is not None else math.inf)
    rep = StageLossOption(REPARTITION, rep_s, rep_s * usd_per_s_survivors if fits else math.inf, fits)
    if not fits:
        return StageLossDecision(WAIT, wait, rep, "no partition of the model fits the surviving GPUs")
    late = math.inf if deadline_left_s is None else deadline_left_s

    def key(o: StageLossOption) -> tuple[bool, float, float]:
        misses = o.time_s > late
        return (misses, o.time_s, o.usd) if objective == "time" else (misses, o.usd, o.time_s)

    pick = rep if key(rep) < key(wait) else wait
    other = wait if pick is rep else rep
    what = "faster" if objective == "time" else "cheaper"
    if (pick.time_s <= late) != (other.time_s <= late):
        what = "within the deadline"
    return StageLossDecision(
        pick.action, wait, rep,
        f"{pick.action} is {what}: {pick.time_s / 3600:.3g} h, ${pick.usd:.4g} against {other.action}'s "
        f"{other.time_s / 3600:.3g} h, ${other.usd:.4g}")


__all__ = ["ACTIONS", "REPARTITION", "WAIT", "StageLossDecision", "StageLossOption", "decide_stage_loss"]
