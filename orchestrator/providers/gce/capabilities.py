"""The gce capabilities the registry holds that would pull the Google Cloud SDK (~2 s) at import: imported
only when called (the registry itself is imported by every verb)."""

from __future__ import annotations

from typing import Any

from orchestrator.costmodel.launch_plan import LaunchPlan
from orchestrator.model.spec import JobSpec


def dry_run(spec: JobSpec, plan: LaunchPlan) -> dict[str, Any]:
    """The exact Compute API requests a launch would send (providers/gce/dry_run.py)."""
    from orchestrator.providers.gce.dry_run import gce_dry_run  # google-cloud-compute: ~2 s, gce only

    return gce_dry_run(spec, plan=plan)
