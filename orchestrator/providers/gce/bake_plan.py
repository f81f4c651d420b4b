"""A GCE image bake planned before anything costs money: the request checked, everything named, placed, priced.

``plan_bake`` refuses what cannot be baked (a role, a framework, a GPU GCE no longer sells or CUDA 12 cannot
run on) and decides the builder: the GPU's machine type from the catalog (N1 takes one attached GPU; A2, A3,
A4, G2 and G4 types come with theirs), Spot where Google creates no on-demand VM of that type, and a base image
that brings the NVIDIA driver (a Deep Learning VM family), so the baked image trains on first boot.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import datetime

from orchestrator.clock import WALL
from orchestrator.model.catalog import CURRENT_BOOK, Catalog, CatalogError, load_catalog
from orchestrator.model.errors import UserError
from orchestrator.model.gce_rules import STANDARD, load_gce_rules
from orchestrator.model.offerings import retired_message
from orchestrator.providers.bake import FRAMEWORKS, BakePlan
from orchestrator.providers.gce.recipes import PS_RECIPE, WORKER_RECIPE, recipe_path
from orchestrator.providers.gce.requests import DEFAULT_IMAGE

ROLES = ("worker", "ps")
PS_MACHINE_TYPE = "n1-standard-4"
DEFAULT_PS_ZONE = "us-central1-c"
# Workers build on Google's Deep Learning VM base family for the GPU (data/gce_images.csv: the NVIDIA driver
# and CUDA, no framework); the recipe adds the framework. The parameter servers are CPU-only TensorFlow on a
# stock Debian 12 image. On-demand or Spot comes from Google's provisioning rules (data/gce_rules.csv):
# a3-highgpu-1g/2g/4g, A3 Ultra (H200) and A4 (B200) have no plain on-demand, so their builders run on Spot.
PS_BASE_IMAGE = DEFAULT_IMAGE
_JOB_ID_MAX = 40  # jobs.id
_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# The frameworks' CUDA 12 builds dropped Kepler; see images/worker.sh for the versions that still ran on it.
_UNSUPPORTED_GPUS = {
    "k80": (
        "TensorFlow 2.21 and PyTorch 2.13 (CUDA 12) do not run on the K80 (compute capability 3.7; its last "
        "driver is R470, CUDA <= 11.4), and GCE retired the K80 in 2024"
    ),
}


def image_family(role: str, gpu: str | None, framework: str = "tensorflow") -> str:
    """``orchestrator-worker-<gpu>`` (TensorFlow), ``orchestrator-worker-torch-<gpu>``, ``orchestrator-ps``."""
    torch = "-torch" if framework == "pytorch" else ""
    return f"orchestrator-{role}{torch}-{gpu}" if gpu else f"orchestrator-{role}{torch}"


def plan_bake(
    role: str, gpu: str | None, spec_zones: list[str], *, framework: str = "tensorflow", name: str | None = None,
    now: datetime | None = None, say: Callable[[str], None] = print,
) -> BakePlan:
    """Check the request (before anything costs money) and name, place and price everything."""
    if role not in ROLES:
        raise UserError(f"unknown role {role!r}; expected one of: {', '.join(ROLES)}")
    if framework not in FRAMEWORKS:
        raise UserError(f"--framework: unknown framework {framework!r}; expected one of: {', '.join(FRAMEWORKS)}")
    catalog = load_catalog()
    if role == "ps":
        if gpu:
            raise UserError("parameter-server images are CPU-only; drop --gpu (or use --role worker)")
        if framework != "tensorflow":
            raise UserError("--framework pytorch: PyTorch jobs have no parameter servers; bake --role worker")
        zones, machine_type = list(spec_zones) or [DEFAULT_PS_ZONE], PS_MACHINE_TYPE
    else:
        if not gpu:
            raise UserError("a worker image is built for one GPU type: give --gpu (e.g. --gpu l4)")
        gpu = gpu.lower()
        zones, machine_type = _worker_placement(catalog, gpu, spec_zones, say)
    stamp = (now or WALL.utcnow()).strftime("%Y%m%d-%H%M%S")
    family = image_family(role, gpu, framework)
    image = name or f"{family}-{stamp}"
    if not _GCE_NAME.match(image):
        raise UserError(f"{image!r} is not a valid image name: 1-63 lowercase letters, digits and '-', "
                        "starting with a letter")
    # Stamped even when named: a bake retried under the same name gets a builder (and a record) of its own.
    base = f"bake-{name or role + ('-torch' if framework == 'pytorch' else '') + ('-' + gpu if gpu else '')}"
    builder = f"{base[:63 - len(stamp) - 1].rstrip('-')}-{stamp}"
    rules = load_gce_rules()
    spot = not rules.allows(machine_type, STANDARD)
    gpu_count = _gpu_count(catalog, machine_type) if gpu else 0
    price_book, price = _price(catalog, machine_type, gpu, gpu_count, spot, say)
    recipe = recipe_path(WORKER_RECIPE if role == "worker" else PS_RECIPE)
    return BakePlan(role, gpu, image, family, builder, machine_type, tuple(zones), job_id=_bake_id(builder),
                    price_per_hour=price, price_book=price_book, framework=framework, spot=spot,
                    gpu_count=gpu_count,
                    base_image=rules.base_image(gpu) if role == "worker" else PS_BASE_IMAGE,
                    recipe=recipe, recipe_env={"ROLE": role, "GPU": gpu or "", "FRAMEWORK": framework})


def _worker_placement(catalog: Catalog, gpu: str, spec_zones: list[str],
                      say: Callable[[str], None]) -> tuple[list[str], str]:
    """(zones to try, machine type) for a worker image's builder; refuses GPUs GCE does not sell today."""
    current = ", ".join(catalog.current_gpus())  # only what GCE sells today (data/gpu_lifecycle.csv)
    if gpu in _UNSUPPORTED_GPUS:
        raise UserError(f"cannot bake a worker image for {gpu}: {_UNSUPPORTED_GPUS[gpu]}",
                        hint=f"bake for one of: {current}; images/README.md says what a legacy K80 image would need")
    try:
        info = catalog.gpu(gpu)
    except CatalogError as exc:
        raise UserError(str(exc), hint=f"GPUs GCE sells today: {current}") from None
    if (gone := retired_message(catalog, gpu, catalog.price_book(CURRENT_BOOK))) is not None:
        raise UserError(f"cannot bake a worker image for {gpu}: {gone}", hint=f"bake for one of: {current}")
    offered = catalog.zones_for(gpu)
    zones = [z for z in spec_zones if z in offered]
    if not zones:
        # The image is global: where it is built does not matter, only that the GPU is there.
        zones = list(offered)
        if spec_zones:
            say(f"none of provider.zones ({', '.join(spec_zones)}) offers {gpu}; "
                f"building in {zones[0] if zones else '?'} instead")
    if not zones:
        raise UserError(f"the catalog knows no zone offering {gpu}")
    # n1 hosts take any single GPU; a2 / a3 / a4 / g2 / g4 shapes come with theirs (the smallest in the catalog).
    machine_type = "n1-standard-4" if info.default_machine_type.startswith("n1-") else info.default_machine_type
    return zones, machine_type


def _gpu_count(catalog: Catalog, machine_type: str) -> int:
    """GPUs of the builder: the machine type's own (A2/A3/A4/G2/G4), else one attached to an N1 VM."""
    found = catalog.machine_types.get(machine_type)
    return found.gpu_count if found is not None and found.bundled else 1


def _price(catalog: Catalog, machine_type: str, gpu: str | None, gpu_count: int, spot: bool,
           say: Callable[[str], None]) -> tuple[str, float]:
    """(price book, USD per hour) the ledger bills the builder at: today's price of its provisioning model."""
    book = catalog.resolve_book(CURRENT_BOOK)
    try:
        return book, catalog.price_book(book).instance_price(machine_type, gpu, gpu_count, spot=spot)
    except CatalogError as exc:  # a price missing from the book must not stop a bake; the ledger says $0
        say(f"no price for the builder VM ({exc}); the ledger bills it $0")
        return book, 0.0


def _bake_id(builder: str) -> str:
    """The builder's name when it fits jobs.id, else a prefix made unique with a hash of the whole name."""
    if len(builder) <= _JOB_ID_MAX:
        return builder
    digest = hashlib.sha1(builder.encode()).hexdigest()[:6]
    return f"{builder[:_JOB_ID_MAX - 7].rstrip('-')}-{digest}"
