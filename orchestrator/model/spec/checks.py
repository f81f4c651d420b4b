"""Semantic checks of a parsed spec against the catalog: zones, machine types, prices, GPUs.

Each check appends ``FieldError``s in the order the spec is read (provider, pricing, search, cluster), so a
user sees every problem at once, each at its field path.
"""

from __future__ import annotations

from orchestrator.model.catalog import Catalog, CatalogError, Gpu, PriceBook
from orchestrator.model.gce_rules import FLEX_START, SPOT, STANDARD, load_gce_rules
from orchestrator.model.names import did_you_mean, unknown_name
from orchestrator.model.offerings import flex_start_message, machine_type_message, retired_message
from orchestrator.model.spec.base import LOCAL_ZONE, FieldError
from orchestrator.model.spec.job import Cluster, JobSpec, OnRevocation, WorkerGroup
from orchestrator.model.spec.training import TrainingMode, payload_framework
from orchestrator.model.specfile import MAX_CANDIDATES, search_size


def check_against_catalog(spec: JobSpec, catalog: Catalog) -> list[FieldError]:
    """Every problem the catalog finds in ``spec``; [] when it can be planned and launched."""
    return _CatalogCheck(spec, catalog).run()


class _CatalogCheck:
    """One pass over a spec; ``errors`` collects what is wrong, each with its field path."""

    def __init__(self, spec: JobSpec, catalog: Catalog) -> None:
        self.spec = spec
        self.catalog = catalog
        self.cloud = spec.provider.is_cloud
        self.allowed_zones = spec.provider.allowed_zones
        self.errors: list[FieldError] = []
        self.book: PriceBook | None = None

    def run(self) -> list[FieldError]:
        for i, z in enumerate(self.allowed_zones):
            self._zone_known(f"provider.zones[{i}]", z)
        self.book = self._price_book()
        self._search()
        cluster = self.spec.cluster
        if cluster is not None:
            self._cpu_roles(cluster)
            for i, group in enumerate(cluster.workers):
                self._worker_group(f"cluster.workers[{i}]", group)
            self._ps_count(cluster)
            self._also_gpus(cluster)
            self._local_schedule()
            self._global_batch()
        self._gce_image()
        return self.errors

    def _error(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path=path, message=message))

    # ---- shared checks

    def _zone_known(self, path: str, zone: str | None) -> None:
        if zone is None or zone == LOCAL_ZONE:
            return
        if zone not in self.catalog.all_zones():
            self._error(path, unknown_name(zone, "a known zone", self.catalog.all_zones()))
        elif self.allowed_zones and zone not in self.allowed_zones:
            self._error(path, f"'{zone}' is not in provider.zones; {did_you_mean(zone, self.allowed_zones)}"
                              f"allowed: {', '.join(self.allowed_zones)}")

    def _machine_ok(self, path: str, name: str) -> bool:
        if name in self.catalog.machine_types:
            return True
        self._error(path, unknown_name(name, "a machine type", self.catalog.machine_types))
        return False

    def _priced(self, path: str, machine: str, gpu: str | None, spot: bool) -> None:
        if self.book is None:
            return
        try:
            self.book.instance_price(machine if self.cloud else "local", gpu, 1 if gpu else 0, spot)
        except CatalogError as exc:
            self._error(path, str(exc))

    def _retired(self, gpu: str) -> str | None:
        """Why a cloud can no longer give this GPU type, else None."""
        if not self.cloud or self.book is None:
            return None
        return retired_message(self.catalog, gpu, self.book)

    def _unknown_gpu(self, path: str, key: str) -> bool:
        if key in self.catalog.gpus:
            return False
        self._error(path, unknown_name(key, "a GPU type", self.catalog.gpus))
        return True

    # ---- the parts of the spec, in the order they are read

    def _price_book(self) -> PriceBook | None:
        """The spec's price book with its overrides; None (and an error) if the book is unknown."""
        pricing = self.spec.pricing
        try:
            book: PriceBook | None = self.catalog.price_book(pricing.book)
        except CatalogError as exc:
            self._error("pricing.book", str(exc))
            book = None
        machine_types = self.catalog.machine_types
        for key in pricing.overrides:
            if key not in self.catalog.gpus and key not in machine_types:
                self._error(f"pricing.overrides.{key}",
                            f"'{key}' is neither a GPU type nor a machine type; "
                            f"{did_you_mean(key, [*self.catalog.gpus, *machine_types])}GPU types: "
                            f"{', '.join(self.catalog.gpus)}")
        if book is None:
            return None
        return book.with_overrides({k: (v.on_demand, v.spot) for k, v in pricing.overrides.items()}, set(machine_types))

    def _search(self) -> None:
        search = self.spec.search
        if search is None:
            return
        for i, key in enumerate(search.gpus):
            if not self._unknown_gpu(f"search.gpus[{i}]", key) and (gone := self._retired(key)):
                self._error(f"search.gpus[{i}]", gone)
        for i, z in enumerate(search.zones):
            self._zone_known(f"search.zones[{i}]", z)

    def _cpu_roles(self, cluster: Cluster) -> None:
        """The parameter servers' and the chief's zones, machine types and prices."""
        is_async = self.spec.mode == TrainingMode.ASYNC
        roles: list[tuple[str, str, str | None, bool]] = []
        if self.spec.ps_count > 0:
            ps = cluster.parameter_servers
            roles.append(("cluster.parameter_servers", ps.machine_type, ps.zone, ps.spot))
        if is_async and not cluster.chief.on_worker0:
            ch = cluster.chief
            roles.append(("cluster.chief", ch.machine_type, ch.zone, ch.spot))
        for path, machine, zone, spot in roles:
            self._zone_known(f"{path}.zone", zone)
            if self._machine_ok(f"{path}.machine_type", machine):
                self._priced(f"{path}.machine_type", machine, None, spot)
                self._gce_rules(path, machine, None, SPOT if spot else STANDARD)

    def _worker_group(self, path: str, group: WorkerGroup) -> None:
        if self._unknown_gpu(f"{path}.gpu", group.gpu):
            return
        gpu = self.catalog.gpus[group.gpu]
        machine = group.machine_type or gpu.default_machine_type
        machine_known = group.machine_type is None or self._machine_ok(f"{path}.machine_type", group.machine_type)
        if gone := self._retired(gpu.key):
            self._error(f"{path}.gpu", gone)
            return
        if self.cloud and (wrong := machine_type_message(self.catalog, gpu.key, group.machine_type)):
            self._error(f"{path}.machine_type", wrong)
            return
        if group.provisioning == "flex_start" and (not self.cloud or flex_start_message(machine)):
            self._error(f"{path}.provisioning",
                        flex_start_message(machine) or "provisioning: flex_start needs provider kind: gce")
        model = FLEX_START if group.provisioning == "flex_start" else SPOT if group.spot else STANDARD
        self._gce_rules(path, machine, gpu.key, model)
        self._zone_known(f"{path}.zone", group.zone)
        self._worker_zone_offers(path, group, gpu)
        if machine_known:  # an unknown machine type is already reported: no second error for its price
            self._priced(f"{path}.gpu", machine, gpu.key, group.spot)

    def _also_gpus(self, cluster: Cluster) -> None:
        """policy.also_gpus: GPU types the spot workers can be created on there (known, sold, priced, on spot;
        on a cloud, in an allowed zone), each differing from a spot group's own."""
        spot = [g for g in cluster.workers if g.spot]
        if self.spec.policy.also_gpus and not spot:
            self._error("policy.also_gpus", "no worker group is spot, so none moves; drop also_gpus or make a "
                        "group spot: true")
        for i, key in enumerate(self.spec.policy.also_gpus):
            path = f"policy.also_gpus[{i}]"
            if self._unknown_gpu(path, key):
                continue
            if gone := self._retired(key):
                self._error(path, gone)
                continue
            if any(g.gpu == key for g in spot):
                self._error(path, f"'{key}' is a spot worker group's own GPU type; list only the types it may "
                                  "move to (its other zones go in provider.zones)")
                continue
            machine = self.catalog.gpus[key].default_machine_type
            offered = set(self.catalog.zones_for(key))
            if self.cloud and self.allowed_zones and not offered & set(self.allowed_zones):
                self._error(path, f"no zone in provider.zones offers {key}; add one that does, or drop it")
                continue
            self._priced(path, machine, key, True)
            self._gce_rules(path, machine, key, SPOT)

    def _gce_rules(self, path: str, machine: str, gpu: str | None, model: str) -> None:
        """Google's provisioning rules (data/gce_rules.csv) and image routes (data/gce_images.csv): what
        GCE would refuse, or would create but could not train on, is refused here."""
        gce = self.spec.provider.as_gce()
        if gce is None:
            return
        rules = load_gce_rules()
        flex_reported = model == FLEX_START and flex_start_message(machine) is not None  # by _worker_group
        if not flex_reported and (wrong := rules.provisioning_message(machine, model)) is not None:
            self._error(f"{path}.provisioning" if model == FLEX_START else f"{path}.spot", wrong)
        fallback = self.spec.policy.on_revocation == OnRevocation.FALLBACK_ON_DEMAND
        if model == SPOT and fallback and not rules.allows(machine, STANDARD):
            self._error("policy.on_revocation", f"fallback-on-demand would replace a preempted {machine} with an "
                        f"on-demand one, which GCE does not create; use on_revocation: replace or shrink")
        if gce.boot_disk_type and (wrong := rules.disk_message(machine, gce.boot_disk_type)):
            self._error("provider.boot_disk_type", wrong)
        deadline = self.spec.policy.deadline
        if model == FLEX_START and deadline is not None and deadline < rules.flex_min_run_s:
            self._error("policy.deadline",
                        f"a Flex-start VM runs at least {rules.flex_min_run_s / 60:g} minutes, the deadline is "
                        f"{deadline / 60:g} minutes; raise policy.deadline to {rules.flex_min_run_s / 60:g}m or more, "
                        "or drop provisioning: flex_start")

    def _gce_image(self) -> None:
        """A gce spec's GPU VMs boot an image with an NVIDIA driver (data/gce_images.csv), or the user asked
        for Google's installer, and an image known to carry only the other framework is not named: a VM that
        cannot train is refused before it is billed."""
        gce = self.spec.provider.as_gce()
        if gce is not None and gce.service_account == "none" and self.spec.storage.startswith("gs://"):
            self._error("provider.service_account", "with no service account the VMs cannot write to "
                        f"{self.spec.storage}; name one (a per-job account with storage access) or leave it out")
        if gce is None or gce.image is None:  # None: the route's default image, which has a driver
            return
        cluster, search = self.spec.cluster, self.spec.search
        gpus = [g.gpu for g in cluster.workers] if cluster else list(search.gpus if search else [])
        known = list(dict.fromkeys(g for g in gpus if g in self.catalog.gpus))
        rules = load_gce_rules()
        no_driver = rules.image_message(gce.image, gce.project, ", ".join(known), gce.gpu_driver == "installer")
        framework = payload_framework(self.spec.training)
        other = rules.framework_message(gce.image, gce.project, framework, next(iter(known), None))
        if wrong := (no_driver if known else None) or other:
            self._error("provider.image", wrong)

    def _worker_zone_offers(self, path: str, group: WorkerGroup, gpu: Gpu) -> None:
        """The group's zone offers its GPU type; on a cloud, an unplaced group has an allowed zone that does."""
        offered = self.catalog.zones_for(gpu.key)
        zone = group.zone
        if zone and zone != LOCAL_ZONE and zone in self.catalog.all_zones() and zone not in offered:
            self._error(path, f"{gpu.gce_accelerator} is not offered in zone {zone}; it is in: {', '.join(offered)}")
        if self.cloud and zone is None and not any(z in offered for z in self.allowed_zones):
            where = f"provider.zones ({', '.join(self.allowed_zones)})" if self.allowed_zones else "no zone given"
            self._error(f"{path}.zone",
                        f"no zone for {gpu.gce_accelerator}: {where}; it is offered in: {', '.join(offered)}")

    def _ps_count(self, cluster: Cluster) -> None:
        count = cluster.parameter_servers.count
        if self.spec.mode == TrainingMode.SYNC and count:
            self._error("cluster.parameter_servers.count",
                        "synchronous training uses all-reduce, not parameter servers; set 0 or training.mode: async")
        if self.spec.mode == TrainingMode.ASYNC and count == 0:
            self._error("cluster.parameter_servers.count", "async training needs at least 1 parameter server")

    def _local_schedule(self) -> None:
        """Every scheduled revocation of a local spec names a slot of this cluster."""
        local = self.spec.provider.as_local()
        if local is None:
            return
        spec = self.spec
        slots = {f"ps-{i}" for i in range(spec.ps_count)} | {f"worker-{i}" for i in range(spec.worker_count)}
        if spec.mode == TrainingMode.ASYNC:
            slots.add("chief-0")
        clocks: dict[str, str] = {}
        for i, item in enumerate(local.schedule):
            if item.instance not in slots:
                self._error(f"provider.schedule[{i}].instance",
                            f"'{item.instance}' is not in this cluster; slots: {', '.join(sorted(slots))}")
            clock = "at_s" if item.at_s is not None else "at_step"
            if clocks.setdefault(item.instance, clock) != clock:
                self._error(f"provider.schedule[{i}]", f"{item.instance} mixes at_s and at_step entries; "
                            "give each slot's revocations on one clock")
        steps = spec.training.train_steps
        late = [(f"provider.schedule[{i}].at_step", item.at_step) for i, item in enumerate(local.schedule)]
        late += [(f"provider.slowdowns[{i}].at_step", slow.at_step) for i, slow in enumerate(local.slowdowns)]
        for path, at in late:
            if at is not None and at > steps:
                self._error(path, f"{at} is after the job's last step (training.train_steps: {steps}), so it would "
                            f"never happen; give a step from 1 to {steps}")
        for i, slow in enumerate(local.slowdowns):
            if slow.worker >= spec.worker_count:
                self._error(f"provider.slowdowns[{i}].worker",
                            f"{slow.worker} is not a worker slot of this cluster (0..{spec.worker_count - 1})")
            elif getattr(spec.training, "framework", "tensorflow") != "pytorch":
                self._error(f"provider.slowdowns[{i}]", "slowdowns are emulated by the PyTorch job only; "
                            "set training.framework: pytorch or drop provider.slowdowns")

    def _global_batch(self) -> None:
        total, workers = self.spec.training.global_batch, self.spec.worker_count
        if total is not None and total < workers:
            self._error("training.global_batch", f"{total} is smaller than the {workers} workers; give each >= 1")


def search_too_big(spec: JobSpec, catalog: Catalog) -> list[FieldError]:
    """A search of 11 GPU types x 256 mixed workers would keep `plan` and `launch` busy for days."""
    s = spec.search
    if s is None or spec.cluster is not None:
        return []
    zones = s.zones or spec.provider.allowed_zones
    if not zones and spec.provider.is_cloud:
        zones = sorted({z for g in s.gpus if g in catalog.gpus for z in catalog.zones_for(g)})
    ps = s.max_ps if spec.mode == TrainingMode.ASYNC else 1
    size = search_size(len(set(s.gpus)), s.min_workers, s.max_workers, s.mixed, len(zones), len(set(s.spot)), ps)
    if size <= MAX_CANDIDATES:
        return []
    return [FieldError(path="search", message=f"about {size:,} candidate clusters (GPU types x workers x zones x "
                       f"spot x parameter servers); the planner takes at most {MAX_CANDIDATES:,}: lower "
                       "max_workers or max_ps, list fewer gpus or zones, or set mixed: false")]
