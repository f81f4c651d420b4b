"""Revocation hazard of spot (preemptible) instances, per GPU type and zone.

``data/revocation_summary.csv`` gives, per type, the fraction ``p`` of preemptible VMs revoked before
GCE's 24 h limit. Taking revocations as a constant-hazard process over those 24 h gives the rate
``lambda = -ln(1 - p) / 24 h`` per instance. Where the 2019 lifetime trace
(``data/gce-preemptible-lifetimes-2019.csv``) has VMs of that type in that zone, the zone's fraction is
blended with the type's (``(revoked + k p) / (n + k)``, ``k`` = ``ZONE_PRIOR_VMS`` pseudo-VMs) so a
zone's few observations refine, not replace, the type's figure. GPU types the summary lacks use the
mean of the GPU rows (flagged as assumed). CPU-only instances (PS, chief) use the ``cpu`` row.

Known simplification: the measured hazard is front-loaded (e.g. V100: 27% in the first hour), which a
constant rate understates for short jobs; the simulator (``orchestrator/sim``) models lifetimes fully.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.model.paths import data_dir

DAY_S = 86400.0
ZONE_PRIOR_VMS = 10.0
CPU = "cpu"


@dataclass(frozen=True)
class RevocationRates:
    p24: dict[str, float]  # type -> P(revoked before 24 h)
    zone_counts: dict[tuple[str, str], tuple[int, int]]  # (type, zone) -> (VMs, revoked)
    _hazards: dict[tuple[str | None, str | None], float] = field(
        default_factory=dict, compare=False, repr=False
    )

    def p_revoked_24h(self, kind: str | None, zone: str | None = None) -> tuple[float, bool]:
        """(probability, assumed) for a GPU key, or None / 'cpu' for a CPU-only instance."""
        key = (kind or CPU).lower()
        assumed = key not in self.p24
        gpu_rows = [v for k, v in self.p24.items() if k != CPU]
        base = self.p24.get(key, sum(gpu_rows) / len(gpu_rows) if gpu_rows else 0.3)
        if zone is not None and (key, zone) in self.zone_counts:
            n, revoked = self.zone_counts[(key, zone)]
            return (revoked + ZONE_PRIOR_VMS * base) / (n + ZONE_PRIOR_VMS), assumed
        return base, assumed

    def hazard_per_s(self, kind: str | None, zone: str | None = None) -> float:
        key = (kind, zone)
        if key not in self._hazards:
            p, _ = self.p_revoked_24h(kind, zone)
            self._hazards[key] = -math.log(max(1e-12, 1.0 - min(p, 0.999999))) / DAY_S
        return self._hazards[key]

    def assumed(self, kind: str | None) -> bool:
        """True when the type has no revocation data (its rate is the mean of the GPU rows)."""
        return (kind or CPU).lower() not in self.p24


@functools.cache
def load_revocation_rates(root: Path | None = None) -> RevocationRates:
    base = root or data_dir()
    with (base / "revocation_summary.csv").open(newline="") as fh:
        p24 = {r["gpu"].lower(): float(r["revoked_before_24h"]) for r in csv.DictReader(fh)}
    counts: dict[tuple[str, str], tuple[int, int]] = {}
    trace = base / "gce-preemptible-lifetimes-2019.csv"
    if trace.exists():
        with trace.open(newline="") as fh:
            for r in csv.DictReader(fh):
                key = (r["gpu"].lower(), r["zone"])
                n, rev = counts.get(key, (0, 0))
                counts[key] = (n + 1, rev + int(r["revoked"]))
    return RevocationRates(p24, counts)
