"""Image baking as a provider capability: what ``orchestrator image bake`` needs of a provider kind.

control/images.py runs a bake step by step (record it, create the builder, reach it over SSH, run the
recipe, image its disk, delete the builder) against an ``ImageBuilder``, which the provider kind registers
(providers/registry.py; gce: providers/gce/bake.py). It plans the bake before anything costs money, builds the
builder's provider and its create request (through the kind's own request builder, as a launch does), and
says how to reach the builder and how to use the image.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from orchestrator.model.instances import InstanceRequest, ObservedInstance
from orchestrator.providers.base import Provider
from orchestrator.transport.base import Endpoint

FRAMEWORKS = ("tensorflow", "pytorch")


@dataclass(frozen=True)
class BakePlan:
    """One bake, checked, named and priced before anything costs money."""

    role: str
    gpu: str | None
    image: str  # image name
    family: str
    builder: str  # builder VM name; also its SSH key's name
    machine_type: str
    zones: tuple[str, ...]  # tried in order on stockouts / quota
    job_id: str = ""  # the bake's pseudo-job (and the builder's job label): the builder name, cut to fit jobs.id
    price_per_hour: float = 0.0  # what the ledger bills the builder at (spot or on-demand, today's book)
    price_book: str = ""
    framework: str = "tensorflow"
    spot: bool = False  # the builder's provisioning (Spot where the machine family has no on-demand)
    gpu_count: int = 0  # GPUs the builder's machine type has (1 on N1; the type's own on A2/A3/A4/G2/G4)
    base_image: str = ""  # what the builder boots (a route that brings the GPU driver, for workers)
    recipe: Path = field(default_factory=Path)  # the script pushed and run on the builder
    recipe_env: dict[str, str] = field(default_factory=dict)

    @property
    def shape(self) -> str:
        """What job_summary.cluster_shape shows for the bake."""
        gpus = f"+{self.gpu_count}x{self.gpu}" if self.gpu else ""
        return f"builder {self.machine_type}{gpus}{' spot' if self.spot else ''}"

    @property
    def what(self) -> str:
        return f"{self.role} image{f' ({self.framework}) for {self.gpu}' if self.gpu else ''}"


class ImageBuilder(Protocol):
    """A provider kind's part of a bake (registered by kind)."""

    kind: str  # the results DB's jobs.provider of the bake
    ssh_user: str

    def plan(self, role: str, gpu: str | None, framework: str, name: str | None,
             say: Callable[[str], None]) -> BakePlan:
        """Refuse what cannot be baked (a UserError) and name, place and price everything."""

    def provider(self, plan: BakePlan) -> Provider:
        """A provider for the builder (its own network rules), booting ``plan.base_image``; closed by the caller."""

    def request(self, plan: BakePlan, zone: str, public_key: str, labels: dict[str, str],
                max_run_s: int) -> InstanceRequest:
        """The builder's create request in ``zone`` (sent through the kind's request builder)."""

    def endpoint(self, provider: Provider, plan: BakePlan, observed: ObservedInstance, zone: str,
                 key_path: str) -> Endpoint:
        """How to reach the running builder over SSH (its host keys pinned)."""

    def usage(self, plan: BakePlan) -> str:
        """How to use the image in a spec (printed after a successful bake)."""
