"""GPUs, machine types, zones and dated price books, loaded from the CSV files in ``data/``."""

from __future__ import annotations

import csv
import datetime as dt
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.clock import WALL
from orchestrator.model.names import unknown_name
from orchestrator.model.paths import data_dir


class CatalogError(LookupError):
    """A lookup the catalog cannot answer; the message says what is known instead."""


@dataclass(frozen=True)
class Gpu:
    key: str
    gce_accelerator: str
    name: str
    fp32_tflops: float
    fp16_tflops: float
    memory_gb: float
    memory_bw_gbs: float
    default_machine_type: str
    source: str  # the public page (URL) the figures come from
    verified: bool = True  # False: not re-checked against the source, a default a user can override
    note: str = ""


@dataclass(frozen=True)
class MachineType:
    name: str
    vcpus: int
    memory_gb: float
    egress_gbps: float
    source: str
    gpu: str | None = None  # accelerator-optimized types (A2/A3/A4/G2/G4) come with a fixed GPU model ...
    gpu_count: int = 0  # ... and count; N1 hosts have none (GPUs are attached)
    verified: bool = True
    note: str = ""

    @property
    def bundled(self) -> bool:
        """The GPUs come with the machine type: GCE attaches them, the price covers them."""
        return self.gpu is not None and self.gpu_count > 0


@dataclass(frozen=True)
class LifecycleEvent:
    """A GPU's retirement (``retired``) or end of support (``end_of_support``): from ``date`` on, VMs
    with it can no longer be created, launched or accessed on Compute Engine."""

    gpu: str
    gce_accelerator: str
    event: str
    date: dt.date
    source: str
    verified: bool = True
    note: str = ""

    def describe(self) -> str:
        what = "retired from Compute Engine" if self.event == "retired" else "at end of support on Compute Engine"
        return f"{what} {self.date.isoformat()}"


@dataclass(frozen=True)
class Price:
    on_demand: float
    spot: float
    includes_host: bool
    source: str  # the public page (URL), or OVERRIDE_SOURCE
    verified: bool = True  # False: not confirmed by the source, or a placeholder (``note`` says which)
    note: str = ""

    def rate(self, spot: bool) -> float:
        return self.spot if spot else self.on_demand


@dataclass(frozen=True)
class PriceBook:
    name: str
    effective: str
    description: str
    source: str
    gpus: dict[str, Price] = field(default_factory=dict)
    machines: dict[str, Price] = field(default_factory=dict)
    # machine type -> (gpu, count) for types whose price includes their GPUs (A2/A3/A4/G2/G4)
    bundled: dict[str, tuple[str, int]] = field(default_factory=dict)

    def instance_price(self, machine_type: str, gpu: str | None, gpu_count: int, spot: bool) -> float:
        """USD per hour for one instance. Some books price GPU workers as whole VMs (host included);
        accelerator-optimized machine types are priced whole, GPUs included."""
        if machine_type in self.bundled:
            return self._bundled_price(machine_type, spot)
        if gpu is not None and gpu_count > 0:
            gpu_price = self.gpus.get(gpu)
            if gpu_price is None:
                raise CatalogError(
                    f"price book '{self.name}' has no price for GPU '{gpu}'; it prices: "
                    f"{', '.join(sorted(self.gpus))} (set pricing.overrides.{gpu} or pick another book)"
                )
            if gpu_price.includes_host:
                return round(gpu_price.rate(spot) * gpu_count, 6)
            return round(gpu_price.rate(spot) * gpu_count + self.machine_price(machine_type, spot), 6)
        return self.machine_price(machine_type, spot)

    def _bundled_price(self, machine_type: str, spot: bool) -> float:
        gpu, count = self.bundled[machine_type]
        whole, override = self.machines.get(machine_type), self.gpus.get(gpu)
        if whole is not None and whole.source == OVERRIDE_SOURCE:
            return whole.rate(spot)  # the machine type's own override: the whole machine
        if override is not None and override.source == OVERRIDE_SOURCE:
            # A per-GPU override prices the whole machine type by its GPUs (vCPU and memory included).
            return round(override.rate(spot) * count, 6)
        return self.machine_price(machine_type, spot)

    def rows_for(self, machine_type: str, gpu: str | None, gpu_count: int) -> list[tuple[str, Price]]:
        """The (key, price row) pairs ``instance_price`` reads for one instance (for their sources)."""
        found: list[tuple[str, Price | None]]
        if machine_type in self.bundled:
            bundled_gpu, _ = self.bundled[machine_type]
            override = self.gpus.get(bundled_gpu)
            whole = self.machines.get(machine_type)
            by_gpu = override is not None and override.source == OVERRIDE_SOURCE
            by_gpu = by_gpu and not (whole is not None and whole.source == OVERRIDE_SOURCE)
            found = [(bundled_gpu, override)] if by_gpu else [(machine_type, whole)]
        elif gpu is not None and gpu_count > 0:
            price = self.gpus.get(gpu)
            found = [(gpu, price)]
            if price is not None and not price.includes_host:
                found.append((machine_type, self.machines.get(machine_type)))
        else:
            found = [(machine_type, self.machines.get(machine_type))]
        return [(key, price) for key, price in found if price is not None]

    def machine_price(self, machine_type: str, spot: bool) -> float:
        price = self.machines.get(machine_type)
        if price is None:
            raise CatalogError(
                f"price book '{self.name}' has no price for machine type '{machine_type}'; it prices: "
                f"{', '.join(sorted(self.machines))}"
            )
        return price.rate(spot)

    def with_overrides(
        self, overrides: dict[str, tuple[float, float]], machine_types: set[str] | None = None
    ) -> PriceBook:
        """(on-demand, spot) prices from the spec replace or extend the book's GPU or machine-type rows."""
        gpus, machines = dict(self.gpus), dict(self.machines)
        for key, (od, sp) in overrides.items():
            price = Price(od, sp, includes_host=False, source=OVERRIDE_SOURCE)
            if machine_types is not None and key in machine_types:
                machines[key] = price
            else:
                gpus[key] = price
        return PriceBook(self.name, self.effective, self.description, self.source, gpus, machines, self.bundled)

    def gpu_hourly(self, gpu: str, spot: bool) -> float | None:
        """One GPU's price for display and comparison: the GPU row (host included or not), or None."""
        price = self.gpus.get(gpu)
        return None if price is None else price.rate(spot)


OVERRIDE_SOURCE = "spec pricing.overrides"
CURRENT_BOOK = "current"  # alias: the dated book with the latest effective date


@dataclass(frozen=True)
class Catalog:
    gpus: dict[str, Gpu]
    machine_types: dict[str, MachineType]
    price_books: dict[str, PriceBook]
    gpu_zones: dict[str, tuple[str, ...]]  # gpu key -> zones offering it
    facts: dict[str, float]
    lifecycle: dict[str, tuple[LifecycleEvent, ...]] = field(default_factory=dict)
    zone_sources: dict[tuple[str, str], str] = field(default_factory=dict)  # (gpu, zone) -> public page

    def gpu(self, key: str) -> Gpu:
        try:
            return self.gpus[key.lower()]
        except KeyError:
            raise CatalogError(unknown_name(key, "a GPU type", self.gpus)) from None

    def gpu_by_accelerator(self, accelerator: str) -> Gpu:
        for gpu in self.gpus.values():
            if gpu.gce_accelerator == accelerator:
                return gpu
        raise CatalogError(f"'{accelerator}' is not a known GCE accelerator type")

    def machine_type(self, name: str) -> MachineType:
        try:
            return self.machine_types[name]
        except KeyError:
            raise CatalogError(unknown_name(name, "a known machine type", self.machine_types)) from None

    def price_book(self, name: str) -> PriceBook:
        try:
            return self.price_books[self.resolve_book(name)]
        except KeyError:
            raise CatalogError(unknown_name(name, "a price book", [CURRENT_BOOK, *self.price_books])) from None

    def resolve_book(self, name: str) -> str:
        """``current`` -> the newest dated book (e.g. ``2026-11``); other names unchanged."""
        if name != CURRENT_BOOK:
            return name
        return max(self.price_books.values(), key=lambda b: b.effective).name

    # ---- what GCE sells today

    def unavailable(self, gpu: str, today: dt.date | None = None) -> LifecycleEvent | None:
        """The retirement / end of support that keeps GCE VMs from getting this GPU, if it has passed."""
        day = today or WALL.now().date()
        passed = [e for e in self.lifecycle.get(gpu, ()) if e.date <= day]
        return min(passed, key=lambda e: e.date) if passed else None

    def current_gpus(self, today: dt.date | None = None) -> list[str]:
        return [g for g in self.gpus if self.unavailable(g, today) is None]

    def closest_current(
        self, gpu: str, book: PriceBook, count: int = 3, today: dt.date | None = None
    ) -> list[tuple[str, float, float]]:
        """The current GPUs most like ``gpu`` (FP32 throughput and memory, log scale) that ``book``
        prices: (key, on-demand, spot) per GPU, closest first."""
        ref = self.gpus[gpu]

        def distance(key: str) -> float:
            other = self.gpus[key]
            return abs(math.log(other.fp32_tflops / ref.fp32_tflops)) + abs(math.log(other.memory_gb / ref.memory_gb))

        out = []
        for key in sorted(self.current_gpus(today), key=distance):
            od, sp = book.gpu_hourly(key, False), book.gpu_hourly(key, True)
            if key != gpu and od is not None and sp is not None:
                out.append((key, od, sp))
        return out[:count]

    def machine_types_for(self, gpu: str) -> list[MachineType]:
        """The accelerator-optimized machine types that carry ``gpu``, fewest GPUs first."""
        return sorted((m for m in self.machine_types.values() if m.gpu == gpu), key=lambda m: m.gpu_count)

    def gpus_per_instance(self, machine_type: str) -> int:
        """GPUs one instance of this type gets: the type's fixed count, else 1 attached GPU (N1)."""
        found = self.machine_types.get(machine_type)
        return found.gpu_count if found is not None and found.bundled else 1

    def coming(self, gpu: str, today: dt.date, until: dt.date) -> LifecycleEvent | None:
        """The first retirement / end of support of ``gpu`` after ``today`` and no later than ``until``."""
        ahead = [e for e in self.lifecycle.get(gpu, ()) if today < e.date <= until]
        return min(ahead, key=lambda e: e.date) if ahead else None

    def zones_for(self, gpu: str) -> tuple[str, ...]:
        return self.gpu_zones.get(gpu, ())

    def all_zones(self) -> tuple[str, ...]:
        return tuple(sorted({z for zones in self.gpu_zones.values() for z in zones}))

    def fact(self, key: str) -> float:
        return self.facts[key]


def region_of(zone: str) -> str:
    """us-central1-c -> us-central1."""
    return zone.rsplit("-", 1)[0]


def _verified(row: dict[str, str]) -> bool:
    """The row's ``verified`` column (1/0); a file without one vouches for its rows by their source."""
    return row.get("verified", "1").strip() != "0"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@functools.cache
def load_catalog(root: Path | None = None) -> Catalog:
    base = root or data_dir()
    gpus = {
        r["key"]: Gpu(
            key=r["key"],
            gce_accelerator=r["gce_accelerator"],
            name=r["name"],
            fp32_tflops=float(r["fp32_tflops"]),
            fp16_tflops=float(r["fp16_tflops"]),
            memory_gb=float(r["memory_gb"]),
            memory_bw_gbs=float(r["memory_bw_gbs"]),
            default_machine_type=r["default_machine_type"],
            source=r["source"],
            verified=_verified(r),
            note=r.get("note", ""),
        )
        for r in _rows(base / "gpus.csv")
    }
    machines = {
        r["name"]: MachineType(
            r["name"], int(r["vcpus"]), float(r["memory_gb"]), float(r["egress_gbps"]), r["source"],
            gpu=r.get("gpu") or None, gpu_count=int(r.get("gpu_count") or 0),
            verified=_verified(r), note=r.get("note", ""),
        )
        for r in _rows(base / "machine_types.csv")
    }
    bundled = {m.name: (m.gpu, m.gpu_count) for m in machines.values() if m.gpu is not None and m.bundled}
    books: dict[str, PriceBook] = {
        r["book"]: PriceBook(r["book"], r["effective"], r["description"], r["source"], bundled=dict(bundled))
        for r in _rows(base / "price_books.csv")
    }
    for r in _rows(base / "prices.csv"):
        price = Price(float(r["on_demand_usd_hr"]), float(r["spot_usd_hr"]), r["includes_host"] == "1", r["source"],
                      _verified(r), r.get("note", ""))
        book = books[r["book"]]
        (book.gpus if r["kind"] == "gpu" else book.machines)[r["key"]] = price
    zones: dict[str, list[str]] = {}
    zone_sources: dict[tuple[str, str], str] = {}
    for r in _rows(base / "gpu_zones.csv"):
        zones.setdefault(r["gpu"], []).append(r["zone"])
        zone_sources[(r["gpu"], r["zone"])] = r["source"]
    facts = {r["key"]: float(r["value"]) for r in _rows(base / "cloud_facts.csv")}
    lifecycle: dict[str, list[LifecycleEvent]] = {}
    path = base / "gpu_lifecycle.csv"
    for r in _rows(path) if path.exists() else []:
        event = LifecycleEvent(r["gpu"], r["gce_accelerator"], r["event"], dt.date.fromisoformat(r["date"]),
                               r["source"], _verified(r), r.get("note", ""))
        lifecycle.setdefault(r["gpu"], []).append(event)
    return Catalog(
        gpus, machines, books, {k: tuple(v) for k, v in zones.items()}, facts,
        {k: tuple(v) for k, v in lifecycle.items()}, zone_sources,
    )
