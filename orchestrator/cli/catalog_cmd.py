"""`orchestrator catalog`: GPUs, machine types, zones, prices and retirement dates, with their sources.

The table fits the terminal (80 columns when piped) with each row's sources as footnote numbers; ``--format
csv`` is the GPU rows and ``--format json`` every section, each row with its full source.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import typer

from orchestrator.cli.listing import Col, check_format, cut, format_option, print_csv, print_json, print_table
from orchestrator.cli.render import console
from orchestrator.clock import WALL
from orchestrator.model.catalog import Catalog, CatalogError, Gpu, LifecycleEvent, MachineType, PriceBook, load_catalog
from orchestrator.model.errors import UserError


def _status(cat: Catalog, gpu: str, today: dt.date) -> str:
    events = cat.lifecycle.get(gpu, ())
    passed = cat.unavailable(gpu, today)
    if passed is not None:
        return f"{passed.event.replace('_', ' ')} {passed.date.isoformat()}"
    coming = [f"{'EOS' if e.event == 'end_of_sale' else e.event} {e.date.isoformat()}" for e in events]
    return "; ".join(coming) or "sold"  # EOS: end of sale, footnoted


def _fields(prefix: str, obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A dataclass's fields as record keys: a field the catalog gains (a URL, a `verified` mark) shows up too."""
    if obj is None:
        return {}
    return {prefix + k: v for k, v in dataclasses.asdict(obj).items() if k not in skip}


def gpu_record(cat: Catalog, book: PriceBook, g: Gpu, today: dt.date) -> dict[str, Any]:
    price = book.gpus.get(g.key)
    shapes = [m.name for m in cat.machine_types_for(g.key)]
    return {
        "gpu": g.key, "gce_accelerator": g.gce_accelerator, "name": g.name, "memory_gb": g.memory_gb,
        "on_demand_usd_hr": price.on_demand if price else None, "spot_usd_hr": price.spot if price else None,
        "status": _status(cat, g.key, today), "price_book": book.name,
        "priced_as": ("whole VM" if price.includes_host else "GPU + host") if price else None,
        **_fields("", g, skip=("key", "gce_accelerator", "name", "memory_gb", "source")),
        "machine_types": " ".join(shapes) or "N1 (attached)", "zones": len(cat.zones_for(g.key)),
        "source": g.source,
        **_fields("price_", price, skip=("on_demand", "spot", "includes_host")),
    }


def machine_record(book: PriceBook, m: MachineType) -> dict[str, Any]:
    price = book.machines.get(m.name)
    return {**_fields("", m), "on_demand_usd_hr": price.on_demand if price else None,
            "spot_usd_hr": price.spot if price else None, "price_book": book.name,
            **_fields("price_", price, skip=("on_demand", "spot"))}


def _usd(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


class _Notes:
    """Sources as numbered footnotes: a table cell holds the numbers, the notes the full text."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}

    def ref(self, *sources: str | None) -> str:
        refs = []
        for s in sources:
            if s and s not in self.numbers:
                self.numbers[s] = len(self.numbers) + 1
            if s and str(self.numbers[s]) not in refs:
                refs.append(str(self.numbers[s]))
        return ",".join(refs)

    def print(self) -> None:
        for text, n in self.numbers.items():
            console.print(cut(f"[{n}] {text}", console.width), style="dim", highlight=False, markup=False,
                          soft_wrap=True)


def catalog_command(
    gpu: str | None = typer.Option(None, "--gpu", help="only this GPU type (t4, v100, l4, a100, h100, h200, ...)"),
    price_book: str = typer.Option("current", "--price-book", help="dated price book: current (=2026-11) or 2019-02"),
    sources: bool = typer.Option(True, "--sources/--no-sources", help="show the source of every figure"),
    fmt: str = format_option("csv: the GPU rows; json: GPUs, machine types and retirement dates"),
) -> None:
    """Print GPU types, machine types, prices and retirement dates, each with its source."""
    check_format(fmt)
    cat = load_catalog()
    today = WALL.now().date()
    try:
        book = cat.price_book(price_book)
        gpus = [cat.gpu(gpu)] if gpu else list(cat.gpus.values())
    except CatalogError as exc:
        raise UserError(str(exc)) from None
    keys = {g.key for g in gpus}
    records = [gpu_record(cat, book, g, today) for g in gpus]
    machines = [machine_record(book, m) for m in cat.machine_types.values() if not gpu or m.gpu in keys]
    events = [e for key in sorted(cat.lifecycle) for e in cat.lifecycle[key] if not gpu or key in keys]
    if fmt == "csv":
        print_csv(records)
    elif fmt == "json":
        print_json({"price_book": _fields("", book, skip=("gpus", "machines", "bundled")), "gpus": records,
                    "machine_types": machines, "retirements": [_fields("", e) for e in events]})
    else:
        _print_tables(cat, book, records, machines, events, sources)


def _print_tables(cat: Catalog, book: PriceBook, records: list[dict[str, Any]], machines: list[dict[str, Any]],
                  events: list[LifecycleEvent], sources: bool) -> None:
    notes = _Notes()
    src = [Col("src")] if sources else []
    print_table(f"GPUs, price book {book.name} ({book.effective}): memory GB, USD per hour",
                [Col("gpu", whole=True), Col("GCE name", whole=True), Col("GB", right=True),
                 Col("od", right=True), Col("spot", right=True), Col("status"), *src],
                [[r["gpu"], r["gce_accelerator"], f"{r['memory_gb']:g}", _usd(r["on_demand_usd_hr"]),
                  _usd(r["spot_usd_hr"]), r["status"]] + ([notes.ref(r.get("price_source") or r["source"])]
                                                          if sources else []) for r in records])
    if len(records) == 1:
        console.print(f"zones offering {records[0]['gpu']}: " + ", ".join(cat.zones_for(records[0]["gpu"])))
    console.print()
    print_table("Machine types (A2/A3/A4/G2/G4 priced whole, GPUs included; N1 hosts take attached GPUs)",
                [Col("machine type", whole=True), Col("GPUs"), Col("vCPU", right=True), Col("mem GB", right=True),
                 Col("Gb/s", right=True), Col("od $/h", right=True), Col("spot $/h", right=True)],
                [[m["name"], f"{m['gpu_count']} x {m['gpu']}" if m["gpu"] and m["gpu_count"] else "—",
                  m["vcpus"], f"{m['memory_gb']:g}", f"{m['egress_gbps']:g}", _usd(m["on_demand_usd_hr"]),
                  _usd(m["spot_usd_hr"])] for m in machines])
    if events:
        console.print()
        print_table("GCE retirement and end-of-sale dates (no new VMs from the date on)",
                    [Col("gpu", whole=True), Col("GCE name", whole=True), Col("event"), Col("date"), *src],
                    [[e.gpu, e.gce_accelerator, e.event.replace("_", " "), e.date.isoformat()]
                     + ([notes.ref(e.source)] if sources else []) for e in events])
    console.print()
    console.print(f"od = on-demand; EOS = end of sale; price book: {book.description}", style="dim",
                  highlight=False)
    if sources:
        console.print(f"price book source: {book.source}. src: the price's source (a GPU's specs, every machine "
                      "type's and every figure's source, in full: --format csv or json):", style="dim",
                      highlight=False)
        notes.print()
