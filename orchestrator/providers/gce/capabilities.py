"""The gce capabilities the registry holds, imported only when called: the registry itself is imported by every
verb, and these read the GCE rules, the catalog and google-auth (google-cloud-compute itself loads at its first
call: providers/gce/compute_api.py)."""

from __future__ import annotations

from typing import Any

from orchestrator.costmodel.launch_plan import LaunchPlan
from orchestrator.model.spec import JobSpec


def dry_run(spec: JobSpec, plan: LaunchPlan) -> dict[str, Any]:
    """The exact Compute API requests a launch would send (providers/gce/dry_run.py)."""
    from orchestrator.providers.gce.dry_run import gce_dry_run  # gce only

    return gce_dry_run(spec, plan=plan)
