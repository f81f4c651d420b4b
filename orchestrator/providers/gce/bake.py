"""GCE's part of ``orchestrator image bake`` (the kind's ``ImageBuilder``, providers/bake.py).

The builder is a VM of its own job: its own network tag and firewall rules (SSH from this controller), made
by its create and deleted with it; it opens no training ports, so an open network does not matter. Its create
request goes through ``requests.instance_resource`` like every launch's (disk type, NIC, provisioning model),
on Spot when the machine type has no on-demand, with ``maxRunDuration`` so GCE bounds its spend. The host
keys its guest agent publishes through the API are pinned.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from orchestrator.model.errors import UserError
from orchestrator.model.instances import InstanceRequest, ObservedInstance, Role
from orchestrator.model.spec import GceProvider as GceSpec
from orchestrator.providers.bake import BakePlan
from orchestrator.providers.base import Provider
from orchestrator.providers.gce.backend import TF_PORTS
from orchestrator.providers.gce.bake_plan import plan_bake
from orchestrator.transport.base import Endpoint


class GceImageBuilder:
    """Bakes images in the spec's project (``provider.project``, ``zones``, ``credentials``, ``network``)."""

    kind = "gce"

    def __init__(self, spec: GceSpec) -> None:
        self.spec = spec
        self.ssh_user = spec.ssh_user  # as providers.gce.backend reaches a job's VMs

    def plan(self, role: str, gpu: str | None, framework: str, name: str | None,
             say: Callable[[str], None]) -> BakePlan:
        return plan_bake(role, gpu, list(self.spec.zones), framework=framework, name=name, say=say)

    def provider(self, plan: BakePlan) -> Provider:
        from orchestrator.providers.gce.network import IsolatedGceProvider  # gce bakes only

        gce = self.spec
        return IsolatedGceProvider(
            gce.project, ports=TF_PORTS, ssh_ranges=gce.ssh_source_ranges, allow_open_network=True,
            credentials=gce.credentials, api_endpoint=gce.api_endpoint, image=plan.base_image, network=gce.network)

    def request(self, plan: BakePlan, zone: str, public_key: str, labels: dict[str, str],
                max_run_s: int) -> InstanceRequest:
        return InstanceRequest(
            name=plan.builder, job_id=plan.job_id, role=Role.WORKER if plan.role == "worker" else Role.PS, index=0,
            generation=0, zone=zone, machine_type=plan.machine_type,
            spot=plan.spot,  # on-demand where GCE has it (a revoked builder wastes the bake), else Spot
            gpu=plan.gpu, gpu_count=plan.gpu_count, price_per_hour=plan.price_per_hour, labels=labels,
            metadata={"ssh-keys": f"{self.ssh_user}:{public_key}", "block-project-ssh-keys": "true",
                      "enable-guest-attributes": "TRUE"},  # the guest agent publishes the host keys
            max_run_s=max_run_s,  # spend stays bounded if this process dies: GCE deletes the builder itself
        )

    def endpoint(self, provider: Provider, plan: BakePlan, observed: ObservedInstance, zone: str,
                 key_path: str) -> Endpoint:
        host_keys: Callable[[str, str], list[str]] | None = getattr(provider, "host_keys", None)  # a GceProvider's
        if host_keys is None:
            raise UserError(f"{provider!r} cannot tell the builder's SSH host keys; bake with a GceProvider")
        return Endpoint(workdir=observed.workdir or "orchestrator", host=observed.host or "127.0.0.1",
                        port=observed.ssh_port or 22, user=self.ssh_user, key_path=key_path,
                        host_key_source=partial(host_keys, plan.builder, zone))  # pinned

    def usage(self, plan: BakePlan) -> str:
        return (f"image {plan.image} created in family {plan.family}; use it with\n"
                f"  provider.image: projects/{self.spec.project}/global/images/family/{plan.family}")


def image_builder(spec: GceSpec) -> GceImageBuilder:
    return GceImageBuilder(spec)
