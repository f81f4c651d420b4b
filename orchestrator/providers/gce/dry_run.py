"""`launch --dry-run` for gce specs: the exact Compute API requests a launch would send, as JSON.

The bodies come from ``providers.gce.requests`` — the functions ``GceProvider`` itself sends — with the
settings ``providers.gce.backend.build`` gives the provider, so the dry run shows what the real launch
sends. Nothing is sent: no client is built and no credentials are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.costmodel.launch_plan import LaunchPlan, plan_spec
from orchestrator.costmodel.slots import Slot
from orchestrator.model import timings
from orchestrator.model.catalog import load_catalog
from orchestrator.model.gce_rules import load_gce_rules
from orchestrator.model.instances import InstanceRequest, instance_name
from orchestrator.model.spec import GceProvider, JobSpec, OnRevocation
from orchestrator.model.torch_spec import payload_framework
from orchestrator.providers.gce.advice import advice_request, spot_shapes, zone_shapes
from orchestrator.providers.gce.backend import firewall_ports, instance_metadata, request_settings
from orchestrator.providers.gce.network import address_learner, job_rules
from orchestrator.providers.gce.requests import (
    GceRequestSettings,
    accelerator_type,
    cloud_max_run_s,
    instance_resource,
)

GB_MONTH_HOURS = 730.0  # GCE bills disks per GB-month; one month = 730 h


PUBLIC_KEY = "<the job's ed25519 public key, generated at launch>"


def _metadata(spec: JobSpec, provider: GceProvider, name: str) -> dict[str, str]:
    return instance_metadata(provider.ssh_user, PUBLIC_KEY, spec.storage, name)


def _request(spec: JobSpec, provider: GceProvider, job_id: str, slot: Slot, max_run_s: int) -> InstanceRequest:
    name = instance_name(job_id, slot.role, slot.index, 0)
    return InstanceRequest(
        name=name, job_id=job_id, role=slot.role, index=slot.index, generation=0, zone=slot.zone,
        machine_type=slot.machine_type, spot=slot.spot, gpu=slot.gpu, gpu_count=slot.gpu_count if slot.gpu else 0,
        price_per_hour=slot.price_per_hour, metadata=_metadata(spec, provider, name), max_run_s=max_run_s,
        flex_start=slot.flex_start and not slot.spot,
    )


def _ssh_ranges(provider: GceProvider) -> list[str]:
    """What the job's SSH rule would allow (the learned address; 0.0.0.0/32, nobody, if none answers)."""
    return provider.ssh_source_ranges or [f"{address_learner(provider.api_endpoint)() or '0.0.0.0'}/32"]


def gce_dry_run(spec: JobSpec, job_id: str | None = None, plan: LaunchPlan | None = None) -> dict[str, Any]:
    """Everything a launch of ``spec`` (a gce spec with a pinned cluster) would send, in order."""
    provider = spec.provider.as_gce()
    if provider is None:
        raise ValueError("gce_dry_run needs a gce spec")
    framework = payload_framework(spec)
    settings = request_settings(provider, framework)  # = the launch's backend (providers/registry.py)
    job_id = job_id or f"{spec.name}-dryrun"
    plan = plan or plan_spec(spec)  # the launch's plan: the same slots and prices
    slots = plan.slots
    hourly = plan.cluster_usd_per_hour
    policy = spec.policy
    inserts, disks = [], []
    disk_price = load_catalog().fact("pd_balanced_usd_per_gb_month")
    for slot in slots:
        max_run = cloud_max_run_s(deadline_s=policy.deadline, elapsed_s=0.0, budget_usd=policy.budget_usd,
                                  spent_usd=0.0, cluster_usd_per_hour=hourly, flex_start=slot.flex_start)
        body = instance_resource(_request(spec, provider, job_id, slot, max_run), settings)
        route = load_gce_rules().image_route(settings.image_for(slot.gpu), provider.project,
                                             installer=settings.installs_driver(slot.gpu)).route
        inserts.append({"method": "POST", "path": f"projects/{provider.project}/zones/{slot.zone}/instances",
                        "zone": slot.zone, "framework": framework, "image": settings.image_for(slot.gpu),
                        "image_route": route, "first_boot_setup": settings.boot_setup(slot.gpu),
                        "boot_s": timings.BOOT_S + timings.image_boot_extra_s(route)
                        + (timings.SPOT_EXTRA_BOOT_S if slot.spot else 0.0),
                        "boot_s_source": timings.image_boot_source(route),
                        "body": body})
        kept = settings.termination_action == "STOP" and (slot.spot or "maxRunDuration" in body["scheduling"])
        disks.append({
            "instance": body["name"], "zone": slot.zone, "type": settings.disk_for(slot.machine_type),
            "sizeGb": settings.disk_size_gb,
            "created_with": "instances.insert (boot disk, autoDelete: true)",
            "usd_per_hour": round(settings.disk_size_gb * disk_price / GB_MONTH_HOURS, 6),
            "after_preemption_or_time_limit": "kept and billed until the controller deletes the VM" if kept
            else "deleted with the VM",
        })
    advice = _advice(provider, slots, settings, framework) if policy.on_revocation == OnRevocation.DEADLINE else []
    firewalls = [{"method": "POST", "path": f"projects/{provider.project}/global/firewalls", "body": rule}
                 for rule in job_rules(settings.network, job_id, firewall_ports(provider, framework),
                                                _ssh_ranges(provider))]
    return {
        "dry_run": True, "requests_sent": 0, "project": provider.project,
        "job_id": f"{job_id} (a launch uses <name>-<6 hex digits>)", "cluster": plan.shape,
        "price_book": plan.price_book, "cluster_usd_per_hour": round(hourly, 6),
        "termination_action": settings.termination_action,
        "firewalls.insert": firewalls, "instances.insert": inserts, "disks": disks,
        # read-only, by the daemon during the run (on_revocation: deadline): can the spot VMs be had now?
        "advice.capacity": advice,
    }


def _advice(provider: GceProvider, slots: Sequence[Slot], settings: GceRequestSettings,
            framework: str) -> list[dict[str, Any]]:
    """The capacity-advice calls the daemon makes during an ``on_revocation: deadline`` run (read-only)."""
    # One call per spot shape (can spot be had anywhere it may run), and one per zone of a shape that may run in
    # several (which zone: decide.deadline_zones).
    # A PyTorch job's shape of two or more spot VMs in one zone is also counted (decide.deadline_elastic): while the
    # whole size scores below the threshold, the daemon asks for 1, 2, ... of them as well.
    elastic = framework == "pytorch"
    return [{"method": "POST", "api_version": "beta",  # SPOT advice is answered on the beta API (gce/advice.py)
             "path": f"projects/{provider.project}/regions/{shape.region}/advice/capacity",
             "every_s": timings.DEADLINE_TICK_S, "spot_when_obtainability_at_least": timings.SPOT_OBTAINABLE,
             "body": advice_request(asked, size),
             **({"also_sizes_when_below": list(range(1, size))} if elastic and size > 1 and len(shape.zones) == 1
                else {})}
            for shape, size in spot_shapes(slots, settings.bundled, accelerator_type).items()
            for asked in (shape, *(zone_shapes(shape) if len(shape.zones) > 1 else ()))]
