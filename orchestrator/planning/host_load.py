"""What else runs on this machine, measured when a local run is planned or launched.

The local provider's workers share this host's cores with everything else. The host model
(costmodel/host_share.py) takes that as a number, ``background``: other processes wanting a core. It is
measured here, not in the pure model: the kernel's count of runnable tasks (/proc/stat ``procs_running``)
sampled over a short window, less this process. The 1-minute load average is shown beside it, but it lags
by a minute and counts tasks waiting on disk, so the instantaneous count is the one used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.clock import WALL, Clock
from orchestrator.costmodel import DEFAULT_CALIBRATION, Calibration
from orchestrator.model.errors import UserError

WINDOW_S = 0.5  # long enough to see a busy loop, short enough not to be noticed in `plan`
SAMPLES = 11


@dataclass(frozen=True)
class HostLoad:
    background: float  # other runnable processes, mean over the window (this one excluded)
    loadavg_1m: float
    cores: int
    measured: bool  # False: given by --host-load

    def describe(self) -> str:
        how = "measured now" if self.measured else "given by --host-load"
        return (f"{self.background:.1f} other runnable processes on this {self.cores}-core host ({how}; "
                f"1-min load average {self.loadavg_1m:.1f})")


def _procs_running(stat: Path) -> int | None:
    try:
        for line in stat.read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def measure(window_s: float = WINDOW_S, samples: int = SAMPLES, stat: Path = Path("/proc/stat"),
            clock: Clock = WALL) -> HostLoad:
    """Other runnable processes right now: the mean of ``samples`` reads of procs_running over ``window_s``,
    less one (this process, running while it reads). Without /proc: the 1-minute load average."""
    counts = []
    for i in range(samples):
        n = _procs_running(stat)
        if n is None:
            break
        counts.append(n)
        if i < samples - 1:
            clock.sleep(window_s / (samples - 1))  # the host's own load: sampled in real time
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    background = sum(counts) / len(counts) - 1 if counts else load1
    return HostLoad(round(max(background, 0.0), 2), load1, os.cpu_count() or 1, True)


def host_load(option: str) -> HostLoad:
    """``--host-load``: ``measure`` (the default), or a number of other runnable processes (0: an idle host)."""
    if option == "measure":
        return measure()
    try:
        value = float(option)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1000:
        raise UserError(f"--host-load: '{option}' is neither 'measure' nor a number of other runnable processes "
                        "(0 = an idle host)")
    return HostLoad(value, os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0, os.cpu_count() or 1, False)


def with_load(calibration: Calibration | None, load: HostLoad) -> Calibration:
    """The calibration the local host model reads, with this host's other work in it."""
    calib = calibration or DEFAULT_CALIBRATION
    return replace(calib, local_host={**calib.local_host, "background": load.background})
