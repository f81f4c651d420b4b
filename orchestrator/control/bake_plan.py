"""An image bake planned before anything costs money: the request checked, everything named and priced.

``plan_bake`` refuses what cannot be baked (a role, a GPU GCE no longer sells or TF 2.21 cannot run on) and
names the image, its family, the builder VM and the bake's record (control/bake_record.py), and prices the
builder at today's on-demand rate (what the ledger bills).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.core.catalog import CURRENT_BOOK, Catalog, CatalogError, load_catalog
from orchestrator.core.errors import UserError
from orchestrator.core.offerings import retired_message
from orchestrator.core.paths import _bundled

ROLES = ("worker", "ps")
PS_MACHINE_TYPE = "n1-standard-4"
DEFAULT_PS_ZONE = "us-central1-c"
_JOB_ID_MAX = 40  # jobs.id
_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# TF 2.21 needs CUDA 12, which dropped Kepler; see images/worker.sh for the versions that still ran on it.
_UNSUPPORTED_GPUS = {
    "k80": (
        "TensorFlow 2.21 (CUDA 12) does not run on the K80 (compute capability 3.7; its last driver is R470, "
        "CUDA <= 11.4), and GCE retired the K80 in 2024"
    ),
}


@dataclass(frozen=True)
class BakePlan:
    role: str
    gpu: str | None
    image: str  # image name
    family: str
    builder: str  # builder VM name; also its SSH key's name
    machine_type: str
    zones: tuple[str, ...]  # tried in order on stockouts / quota
    job_id: str = ""  # the bake's pseudo-job (and the builder's job label): the builder name, cut to fit jobs.id
    price_per_hour: float = 0.0  # on-demand, today's price book: what the ledger bills
    price_book: str = CURRENT_BOOK

    @property
    def shape(self) -> str:
        """What job_summary.cluster_shape shows for the bake."""
        return f"builder {self.machine_type}{'+1x' + self.gpu if self.gpu else ''}"


def image_family(role: str, gpu: str | None) -> str:
    return f"orchestrator-{role}-{gpu}" if gpu else f"orchestrator-{role}"


def recipe_path(role: str) -> Path:
    """``images/<role>.sh`` from the checkout (or the wheel's bundled copy)."""
    try:
        path = _bundled("images") / f"{role}.sh"
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    if not path.is_file():
        raise UserError(f"no image recipe {path}")
    return path


def plan_bake(
    role: str,
    gpu: str | None,
    spec_zones: list[str],
    *,
    name: str | None = None,
    now: datetime | None = None,
    say: Callable[[str], None] = print,
) -> BakePlan:
    """Check the request (before anything costs money) and name everything."""
    if role not in ROLES:
        raise UserError(f"unknown role {role!r}; expected one of: {', '.join(ROLES)}")
    catalog = load_catalog()
    if role == "ps":
        if gpu:
            raise UserError("parameter-server images are CPU-only; drop --gpu (or use --role worker)")
        zones = list(spec_zones) or [DEFAULT_PS_ZONE]
        machine_type = PS_MACHINE_TYPE
    else:
        if not gpu:
            raise UserError("a worker image is built for one GPU type: give --gpu (e.g. --gpu v100)")
        gpu = gpu.lower()
        zones, machine_type = _worker_placement(catalog, gpu, spec_zones, say)
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    family = image_family(role, gpu)
    image = name or f"{family}-{stamp}"
    if not _GCE_NAME.match(image):
        raise UserError(
            f"{image!r} is not a valid image name: 1-63 lowercase letters, digits and '-', "
            "starting with a letter"
        )
    # Stamped even when named: a bake retried under the same name gets a builder (and a record) of its own.
    base = f"bake-{name or role + ('-' + gpu if gpu else '')}"
    builder = f"{base[:63 - len(stamp) - 1].rstrip('-')}-{stamp}"
    price_book, price = _on_demand_price(catalog, machine_type, gpu, say)
    return BakePlan(role, gpu, image, family, builder, machine_type, tuple(zones), job_id=_bake_id(builder),
                    price_per_hour=price, price_book=price_book)


def _worker_placement(catalog: Catalog, gpu: str, spec_zones: list[str],
                      say: Callable[[str], None]) -> tuple[list[str], str]:
    """(zones to try, machine type) for a worker image's builder; refuses GPUs GCE does not sell today."""
    current = ", ".join(catalog.current_gpus())  # only what GCE sells today (data/gpu_lifecycle.csv)
    if gpu in _UNSUPPORTED_GPUS:
        raise UserError(
            f"cannot bake a worker image for {gpu}: {_UNSUPPORTED_GPUS[gpu]}",
            hint=f"bake for one of: {current}; images/README.md says what a legacy K80 image would need",
        )
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
            say(
                f"none of provider.zones ({', '.join(spec_zones)}) offers {gpu}; "
                f"building in {zones[0] if zones else '?'} instead"
            )
    if not zones:
        raise UserError(f"the catalog knows no zone offering {gpu}")
    # n1 hosts take any single GPU; a2 / g2 / a3 shapes come with theirs.
    machine_type = "n1-standard-4" if info.default_machine_type.startswith("n1-") else info.default_machine_type
    return zones, machine_type


def _on_demand_price(catalog: Catalog, machine_type: str, gpu: str | None,
                     say: Callable[[str], None]) -> tuple[str, float]:
    """(price book, USD per hour) the ledger bills the builder at: today's on-demand price."""
    book = catalog.resolve_book(CURRENT_BOOK)
    try:
        return book, catalog.price_book(book).instance_price(machine_type, gpu, 1 if gpu else 0, spot=False)
    except CatalogError as exc:  # a price missing from the book must not stop a bake; the ledger says $0
        say(f"no price for the builder VM ({exc}); the ledger bills it $0")
        return book, 0.0


def _bake_id(builder: str) -> str:
    """The builder's name when it fits jobs.id, else a prefix made unique with a hash of the whole name."""
    if len(builder) <= _JOB_ID_MAX:
        return builder
    digest = hashlib.sha1(builder.encode()).hexdigest()[:6]
    return f"{builder[:_JOB_ID_MAX - 7].rstrip('-')}-{digest}"
