"""Google's provisioning rules for Compute Engine VMs and its GPU image routes, loaded from ``data/``.

``data/gce_rules.csv`` (one row per machine family or type, a source URL on each): the provisioning models
GCE accepts, the boot disk types it boots from, gVNIC, flex-start and the GPUs an N1 VM may carry.
``data/gce_images.csv``: which images carry an NVIDIA driver (Deep Learning VM, accelerator OS) and which do
not (stock OS images), and the default image per GPU and framework.

The spec check, the planner, the request builder, ``launch --dry-run`` and the Compute API emulator all ask
this module, so what one refuses the others refuse too. Pure: reads the bundled CSVs, nothing else.
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass

from orchestrator.model.paths import data_dir

STANDARD, SPOT, FLEX_START, RESERVATION = "STANDARD", "SPOT", "FLEX_START", "RESERVATION"
ROUTE_BAKED = "baked"  # an image of the user's own (e.g. from `orchestrator image bake`): assumed to carry a driver
ROUTE_INSTALLER = "installer"  # a stock image plus Google's driver installer at boot
ROUTE_DLVM, ROUTE_DLVM_BASE = "dlvm", "dlvm-base"  # a Deep Learning VM family with / without the framework
# Routes whose VMs get the payload's framework and packages at first boot (images/gpu-worker.sh from the
# startup script): every image with Google's driver but no orchestrator payload, and the installer route.
BOOT_SETUP_ROUTES = frozenset({ROUTE_DLVM, ROUTE_DLVM_BASE, "accelerator-os", ROUTE_INSTALLER})
FRAMEWORK_NAMES = {"tensorflow": "TensorFlow", "pytorch": "PyTorch"}
_URL_PREFIX = re.compile(r"^https?://[^/]+/compute/(?:v1|beta|alpha)/")


@dataclass(frozen=True)
class FamilyRule:
    prefix: str  # a machine family ("a3-ultragpu") or one machine type ("a3-highgpu-2g")
    provisioning: frozenset[str]
    boot_disks: tuple[str, ...]  # the first is the default
    gvnic_required: bool
    flex_start: bool
    gpus_per_vm: dict[str, tuple[int, ...]]  # N1: accelerator type -> GPU counts GCE attaches
    source: str

    @property
    def default_disk(self) -> str:
        return self.boot_disks[0]


@dataclass(frozen=True)
class ImageRoute:
    image: str  # a full image path, or a prefix such as "projects/debian-cloud/"
    route: str  # dlvm | dlvm-base | accelerator-os | stock | baked | installer
    driver: bool
    gpus: tuple[str, ...]  # GPU keys this image is the default for
    frameworks: tuple[str, ...]  # what a VM on it trains with (inside, or installed at first boot); (): unknown
    source: str

    @property
    def boot_setup(self) -> bool:
        """The VM installs the payload's framework / packages at first boot (the startup script)."""
        return self.route in BOOT_SETUP_ROUTES


_MODEL_NAMES = {STANDARD: "on-demand", SPOT: "Spot", FLEX_START: "Flex-start",
                RESERVATION: "from a reservation (not used by orchestrator)"}


def url(source: str) -> str:
    """The public page of a data row's source (its first word; the rest is a note)."""
    return source.split()[0] if source else ""


@dataclass(frozen=True)
class GceRules:
    families: tuple[FamilyRule, ...]
    images: tuple[ImageRoute, ...]
    flex_min_run_s: float  # data/cloud_facts.csv: flex_start_min_run / flex_start_max_run
    flex_max_run_s: float

    def flex_run_s(self, seconds: float) -> int:
        """A Flex-start VM's maxRunDuration within Google's bounds (10 min .. 7 days)."""
        return int(min(self.flex_max_run_s, max(self.flex_min_run_s, seconds)))

    # ---- machine families

    def family(self, machine_type: str) -> FamilyRule | None:
        """The most specific rule for ``machine_type`` (a row for the type itself beats its family's)."""
        found = [f for f in self.families if machine_type == f.prefix or machine_type.startswith(f.prefix + "-")]
        return max(found, key=lambda f: len(f.prefix), default=None)

    def provisioning_message(self, machine_type: str, model: str) -> str | None:
        """Why GCE refuses ``machine_type`` under ``model`` (STANDARD / SPOT / FLEX_START), with the fix."""
        rule = self.family(machine_type)
        if rule is None or model in rule.provisioning:
            return None
        offered = ", ".join(_MODEL_NAMES[m] for m in _MODEL_NAMES if m in rule.provisioning)
        fixes = [fix for m, fix in ((SPOT, "spot: true"), (FLEX_START, "provisioning: flex_start"))
                 if m in rule.provisioning and m != model]
        return (f"GCE does not create {machine_type} {_MODEL_NAMES[model]}, only {offered} ({url(rule.source)}); "
                f"set {' or '.join(fixes) or 'another machine type'}")

    def allows(self, machine_type: str, model: str) -> bool:
        return self.provisioning_message(machine_type, model) is None

    def boot_disk(self, machine_type: str, chosen: str | None = None) -> str:
        """The boot disk type: the spec's choice, else the family's default (pd-balanced where unknown)."""
        if chosen:
            return chosen
        rule = self.family(machine_type)
        return rule.default_disk if rule else "pd-balanced"

    def disk_message(self, machine_type: str, disk: str) -> str | None:
        rule = self.family(machine_type)
        if rule is None or disk in rule.boot_disks:
            return None
        return (f"{machine_type} boots only from {' or '.join(rule.boot_disks)}, not {disk} ({url(rule.source)}); "
                f"set provider.boot_disk_type: {rule.default_disk} or leave it out")

    def gvnic_required(self, machine_type: str) -> bool:
        rule = self.family(machine_type)
        return rule is not None and rule.gvnic_required

    def gpu_count_message(self, machine_type: str, accelerator: str, count: int) -> str | None:
        """An N1 VM carries 1, 2, 4 (or 8) GPUs of a type; other counts are refused."""
        rule = self.family(machine_type)
        if rule is None:
            return None
        allowed = rule.gpus_per_vm.get(accelerator)
        if not allowed or count in allowed:
            return None
        return f"{machine_type} takes {' / '.join(map(str, allowed))} x {accelerator}, not {count} ({url(rule.source)})"

    # ---- images

    def image_route(self, image: str, project: str = "", installer: bool = False) -> ImageRoute:
        """How an image gets its NVIDIA driver: the most specific row of data/gce_images.csv, else the
        user's own baked image. ``installer``: a stock image gets Google's installer at boot."""
        path = normalize_image(image, project)
        found = [r for r in self.images if path == r.image or (r.image.endswith("/") and path.startswith(r.image))]
        route = max(found, key=lambda r: len(r.image), default=None)
        if route is None:
            return ImageRoute(path, ROUTE_BAKED, True, (), (), "your own image (orchestrator image bake)")
        if installer and not route.driver:
            return ImageRoute(path, ROUTE_INSTALLER, True, (), (), INSTALLER_SOURCE)
        return route

    def default_image(self, gpu: str | None, framework: str | None = None) -> str:
        """The image a VM boots when the spec names none: the first default row (one with GPUs listed) with a
        driver for this GPU and ``framework`` (pytorch: Google's PyTorch family; tensorflow, for which Google
        has no current family: the base family, TensorFlow installed at first boot); a CPU-only VM takes the
        framework's first row, so every task of a job has the same libraries."""
        rows = [r for r in self.images
                if r.driver and r.gpus and r.frameworks and (framework is None or framework in r.frameworks)]
        for row in rows:
            if gpu is None or gpu in row.gpus:
                return row.image
        if not rows:
            raise LookupError(f"data/gce_images.csv has no default image for framework {framework}")
        return rows[0].image

    def base_image(self, gpu: str | None) -> str:
        """The Deep Learning VM base family (driver + CUDA, no framework) for ``gpu``: what `image bake`
        builds on, so a baked image carries exactly the framework its recipe installs."""
        for row in self.images:
            if row.route == ROUTE_DLVM_BASE and row.gpus and (gpu is None or gpu in row.gpus):
                return row.image
        raise LookupError(f"data/gce_images.csv has no {ROUTE_DLVM_BASE} image for {gpu}")

    def framework_message(self, image: str, project: str, framework: str, gpu: str | None) -> str | None:
        """An image known to lack the job's framework (a Deep Learning VM family of the other framework)
        cannot train it: say so, with the family that does and the bake command."""
        route = self.image_route(image, project)
        if not route.frameworks or framework in route.frameworks:
            return None
        name = FRAMEWORK_NAMES.get(framework, framework)
        right = self.default_image(gpu, framework)
        return (f"{normalize_image(image, project)} has no {name} ({url(route.source)}); leave provider.image out "
                f"({right.rsplit('/', 1)[-1]} is chosen for {framework} jobs), or bake one: orchestrator image bake "
                f"--role worker --gpu {gpu or 'GPU'} --framework {framework} --spec SPEC")

    def image_message(self, image: str, project: str, gpu: str | None, installer: bool = False) -> str | None:
        """A GPU VM on an image known to have no NVIDIA driver cannot train: say so, with the fix."""
        if gpu is None:
            return None
        route = self.image_route(image, project, installer)
        if route.driver:
            return None
        return (f"{normalize_image(image, project)} has no NVIDIA driver for {gpu} ({url(route.source)}); "
                "leave provider.image out (a Deep Learning VM image with the job's framework is chosen), name an image "
                "with a driver, or set provider.gpu_driver: installer (Google's installer at boot, several minutes "
                "more)")


INSTALLER_SOURCE = "https://github.com/GoogleCloudPlatform/compute-gpu-installation (cuda_installer.pyz)"


def normalize_image(image: str, project: str = "") -> str:
    """``projects/<p>/global/images/...`` for any way a spec names an image (URL, global/..., images/...)."""
    path = _URL_PREFIX.sub("", image)
    if path.startswith("global/"):
        return f"projects/{project}/{path}"
    if not path.startswith("projects/"):
        return f"projects/{project}/global/images/{path.removeprefix('images/')}"
    return path


def _counts(text: str) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for item in text.split():
        accelerator, _, counts = item.partition(":")
        out[accelerator] = tuple(int(c) for c in counts.split("/"))
    return out


@functools.cache
def load_gce_rules() -> GceRules:
    with (data_dir() / "gce_rules.csv").open(newline="") as fh:
        families = tuple(
            FamilyRule(prefix=r["prefix"], provisioning=frozenset(r["provisioning"].split()),
                       boot_disks=tuple(r["boot_disks"].split()), gvnic_required=r["gvnic"] == "required",
                       flex_start=r["flex_start"] == "yes", gpus_per_vm=_counts(r["gpus_per_vm"]), source=r["source"])
            for r in csv.DictReader(fh))
    with (data_dir() / "gce_images.csv").open(newline="") as fh:
        images = tuple(
            ImageRoute(image=r["image"], route=r["route"], driver=r["driver"] == "yes", gpus=tuple(r["gpus"].split()),
                       frameworks=tuple(r["frameworks"].split()), source=r["source"])
            for r in csv.DictReader(fh))
    with (data_dir() / "cloud_facts.csv").open(newline="") as fh:
        facts = {r["key"]: float(r["value"]) for r in csv.DictReader(fh)}
    return GceRules(families, images, facts["flex_start_min_run"], facts["flex_start_max_run"])
