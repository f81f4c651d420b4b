"""`orchestrator catalog`: GPUs, machine types, zones and prices, with their sources."""

from __future__ import annotations

import typer

from orchestrator.catalog import CatalogError, load_catalog
from orchestrator.cli.render import console, table
from orchestrator.errors import UserError


def catalog_command(
    gpu: str | None = typer.Option(None, "--gpu", help="only this GPU type (k80, p100, v100, t4, l4, a100, h100)"),
    price_book: str = typer.Option("current", "--price-book", help="dated price book: current or 2019-02"),
    sources: bool = typer.Option(True, "--sources/--no-sources", help="show the source of every figure"),
) -> None:
    """Print GPU types, host machine types, zones and prices (with sources)."""
    cat = load_catalog()
    try:
        book = cat.price_book(price_book)
        gpus = [cat.gpu(gpu)] if gpu else list(cat.gpus.values())
    except CatalogError as exc:
        raise UserError(str(exc)) from None
    rows = []
    for g in gpus:
        price = book.gpus.get(g.key)
        rows.append([
            g.key, g.gce_accelerator, f"{g.fp32_tflops:g}", f"{g.fp16_tflops:g}" if g.fp16_tflops else "n/a",
            f"{g.memory_gb:g}", f"{g.memory_bw_gbs:g}",
            f"{price.on_demand:.4g}" if price else "—", f"{price.spot:.4g}" if price else "—",
            ("VM" if price.includes_host else "GPU") if price else "",
            len(cat.zones_for(g.key)),
        ] + ([g.source] if sources else []))
    cols = ["gpu", "GCE accelerator", "FP32 TF/s", "FP16 TF/s", "mem GB", "mem GB/s",
            f"on-demand $/h ({book.name})", "spot $/h", "priced as", "zones"] + (["source"] if sources else [])
    console.print(table(f"GPUs — price book {book.name}: {book.description}", cols, rows))
    if gpu:
        console.print(f"zones offering {gpus[0].key}: " + ", ".join(cat.zones_for(gpus[0].key)))
    mrows = []
    for m in cat.machine_types.values():
        price = book.machines.get(m.name)
        mrows.append([m.name, m.vcpus, f"{m.memory_gb:g}", f"{m.egress_gbps:g}",
                      f"{price.on_demand:.4g}" if price else "—", f"{price.spot:.4g}" if price else "—"]
                     + ([price.source if price else m.source] if sources else []))
    console.print(table("Host machine types", ["machine type", "vCPU", "mem GB", "egress Gb/s", "on-demand $/h",
                                               "spot $/h"] + (["source"] if sources else []), mrows))
    console.print(f"[dim]price book source: {book.source} (effective {book.effective})[/dim]")
