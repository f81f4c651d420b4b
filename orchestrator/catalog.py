"""GPUs, machine types, zones and dated price books, loaded from the CSV files in ``data/``."""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.paths import data_dir


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
    source: str


@dataclass(frozen=True)
class MachineType:
    name: str
    vcpus: int
    memory_gb: float
    egress_gbps: float
    source: str


@dataclass(frozen=True)
class Price:
    on_demand: float
    spot: float
    includes_host: bool
    source: str

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

    def instance_price(self, machine_type: str, gpu: str | None, gpu_count: int, spot: bool) -> float:
        """USD per hour for one instance. Some books price GPU workers as whole VMs (host included)."""
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
            price = Price(od, sp, includes_host=False, source="spec pricing.overrides")
            if machine_types is not None and key in machine_types:
                machines[key] = price
            else:
                gpus[key] = price
        return PriceBook(self.name, self.effective, self.description, self.source, gpus, machines)


@dataclass(frozen=True)
class Catalog:
    gpus: dict[str, Gpu]
    machine_types: dict[str, MachineType]
    price_books: dict[str, PriceBook]
    gpu_zones: dict[str, tuple[str, ...]]  # gpu key -> zones offering it
    facts: dict[str, float]

    def gpu(self, key: str) -> Gpu:
        try:
            return self.gpus[key.lower()]
        except KeyError:
            raise CatalogError(f"'{key}' is not a GPU type; known: {', '.join(self.gpus)}") from None

    def gpu_by_accelerator(self, accelerator: str) -> Gpu:
        for gpu in self.gpus.values():
            if gpu.gce_accelerator == accelerator:
                return gpu
        raise CatalogError(f"'{accelerator}' is not a known GCE accelerator type")

    def machine_type(self, name: str) -> MachineType:
        try:
            return self.machine_types[name]
        except KeyError:
            known = ", ".join(self.machine_types)
            raise CatalogError(f"'{name}' is not a known machine type; known: {known}") from None

    def price_book(self, name: str) -> PriceBook:
        try:
            return self.price_books[name]
        except KeyError:
            known = ", ".join(self.price_books)
            raise CatalogError(f"'{name}' is not a price book; known: {known}") from None

    def zones_for(self, gpu: str) -> tuple[str, ...]:
        return self.gpu_zones.get(gpu, ())

    def all_zones(self) -> tuple[str, ...]:
        return tuple(sorted({z for zones in self.gpu_zones.values() for z in zones}))

    def fact(self, key: str) -> float:
        return self.facts[key]


def region_of(zone: str) -> str:
    """us-central1-c -> us-central1."""
    return zone.rsplit("-", 1)[0]


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
        )
        for r in _rows(base / "gpus.csv")
    }
    machines = {
        r["name"]: MachineType(r["name"], int(r["vcpus"]), float(r["memory_gb"]), float(r["egress_gbps"]), r["source"])
        for r in _rows(base / "machine_types.csv")
    }
    books: dict[str, PriceBook] = {
        r["book"]: PriceBook(r["book"], r["effective"], r["description"], r["source"])
        for r in _rows(base / "price_books.csv")
    }
    for r in _rows(base / "prices.csv"):
        price = Price(float(r["on_demand_usd_hr"]), float(r["spot_usd_hr"]), r["includes_host"] == "1", r["source"])
        book = books[r["book"]]
        (book.gpus if r["kind"] == "gpu" else book.machines)[r["key"]] = price
    zones: dict[str, list[str]] = {}
    for r in _rows(base / "gpu_zones.csv"):
        zones.setdefault(r["gpu"], []).append(r["zone"])
    facts = {r["key"]: float(r["value"]) for r in _rows(base / "cloud_facts.csv")}
    return Catalog(gpus, machines, books, {k: tuple(v) for k, v in zones.items()}, facts)
