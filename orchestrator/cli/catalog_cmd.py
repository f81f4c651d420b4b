"""`orchestrator catalog`: GPUs, machine types, zones, prices and retirement dates, with their sources."""

from __future__ import annotations

import datetime as dt
from typing import Any

import typer

from orchestrator.cli.render import console, table
from orchestrator.core.catalog import Catalog, CatalogError, Gpu, PriceBook, load_catalog
from orchestrator.core.errors import UserError


def _status(cat: Catalog, gpu: str, today: dt.date) -> str:
    events = cat.lifecycle.get(gpu, ())
    passed = cat.unavailable(gpu, today)
    if passed is not None:
        return f"{passed.event.replace('_', ' ')} {passed.date.isoformat()}"
    coming = [f"{e.event.replace('_', ' ')} {e.date.isoformat()}" for e in events]
    return "sold" + (f" ({'; '.join(coming)})" if coming else "")


def _gpu_row(cat: Catalog, book: PriceBook, g: Gpu, today: dt.date, sources: bool) -> list[Any]:
    price = book.gpus.get(g.key)
    shapes = [m.name for m in cat.machine_types_for(g.key)]
    return [
        g.key, g.gce_accelerator, f"{g.fp32_tflops:g}", f"{g.fp16_tflops:g}" if g.fp16_tflops else "n/a",
        f"{g.memory_gb:g}", f"{g.memory_bw_gbs:g}",
        f"{price.on_demand:.4g}" if price else "—", f"{price.spot:.4g}" if price else "—",
        ("whole VM" if price.includes_host else "GPU + host") if price else "",
        _status(cat, g.key, today), f"{shapes[0]}…{shapes[-1]}" if len(shapes) > 1 else (shapes or ["N1"])[0],
        len(cat.zones_for(g.key)),
    ] + ([price.source if price else g.source] if sources else [])


def catalog_command(
    gpu: str | None = typer.Option(None, "--gpu", help="only this GPU type (t4, v100, l4, a100, h100, h200, ...)"),
    price_book: str = typer.Option("current", "--price-book", help="dated price book: current (=2026-11) or 2019-02"),
    sources: bool = typer.Option(True, "--sources/--no-sources", help="show the source of every figure"),
) -> None:
    """Print GPU types, machine types, zones, prices and retirement dates (with sources)."""
    cat = load_catalog()
    today = dt.date.today()
    try:
        book = cat.price_book(price_book)
        gpus = [cat.gpu(gpu)] if gpu else list(cat.gpus.values())
    except CatalogError as exc:
        raise UserError(str(exc)) from None
    cols = ["gpu", "GCE accelerator", "FP32 TF/s", "FP16 TF/s", "mem GB", "mem GB/s",
            f"on-demand $/h ({book.name})", "spot $/h", "priced as", "on GCE", "machine types", "zones"]
    console.print(table(f"GPUs — price book {book.name}: {book.description}",
                        cols + (["source"] if sources else []),
                        [_gpu_row(cat, book, g, today, sources) for g in gpus]))
    if gpu:
        console.print(f"zones offering {gpus[0].key}: " + ", ".join(cat.zones_for(gpus[0].key)))
    keys = {g.key for g in gpus}
    mrows = []
    for m in cat.machine_types.values():
        if gpu and m.gpu not in keys:
            continue
        price = book.machines.get(m.name)
        mrows.append([m.name, f"{m.gpu_count} x {m.gpu}" if m.bundled else "—", m.vcpus, f"{m.memory_gb:g}",
                      f"{m.egress_gbps:g}", f"{price.on_demand:.4g}" if price else "—",
                      f"{price.spot:.4g}" if price else "—"]
                     + ([price.source if price else m.source] if sources else []))
    console.print(table("Machine types (A2/A3/A4/G2/G4 priced whole, GPUs included; N1 hosts take attached GPUs)",
                        ["machine type", "GPUs", "vCPU", "mem GB", "egress Gb/s", "on-demand $/h", "spot $/h"]
                        + (["source"] if sources else []), mrows))
    events = [e for key in sorted(cat.lifecycle) for e in cat.lifecycle[key] if not gpu or key in keys]
    if events:
        console.print(table("GCE retirement and end-of-sale dates (no new VMs from the date on)",
                            ["gpu", "GCE accelerator", "event", "date"] + (["source"] if sources else []),
                            [[e.gpu, e.gce_accelerator, e.event, e.date.isoformat()] + ([e.source] if sources else [])
                             for e in events]))
    console.print(f"[dim]price book source: {book.source} (effective {book.effective})[/dim]")
