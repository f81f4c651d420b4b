"""What Compute Engine can give today: retired GPUs, machine-type shapes, flex-start families.

Pure checks on the catalog (no I/O), used by spec validation, the planner and ``image bake``; each
returns the message a user sees (naming the fix), or None when the request is fine.
"""

from __future__ import annotations

import datetime as dt

from orchestrator.core.catalog import CURRENT_BOOK, Catalog, PriceBook
from orchestrator.core.gce_rules import load_gce_rules


def price_note(book: PriceBook, gpu: str) -> str:
    """'$0.2818/h spot, $0.7068/h on-demand (whole g2-standard-4)' for one GPU in ``book``."""
    price = book.gpus.get(gpu)
    if price is None:
        return "not priced"
    what = "whole VM" if price.includes_host else "GPU only, host VM on top"
    return f"${price.spot:.4g}/h spot, ${price.on_demand:.4g}/h on-demand ({what})"


def retired_message(catalog: Catalog, gpu: str, book: PriceBook, today: dt.date | None = None) -> str | None:
    """Why GCE cannot give ``gpu`` any more, with the closest current GPUs and their prices."""
    event = catalog.unavailable(gpu, today)
    if event is None:
        return None
    near = catalog.closest_current(gpu, book, today=today)
    if len(near) < 2:  # e.g. the 2019-02 book prices none of today's GPUs: suggest from the newest book
        book = catalog.price_book(CURRENT_BOOK)
        near = catalog.closest_current(gpu, book, today=today)
    options = "; ".join(f"{key}: {price_note(book, key)}" for key, _, _ in near)
    return (
        f"{event.gce_accelerator} was {event.describe()} (source: data/gpu_lifecycle.csv), so a gce launch "
        f"cannot get it; closest current GPUs in price book {book.name}: {options}. "
        "Use the local provider or `orchestrator simulate` (pricing.book: 2019-02) to reproduce 2019 runs"
    )


def machine_type_message(catalog: Catalog, gpu: str, machine_type: str | None) -> str | None:
    """A machine type that cannot carry ``gpu`` on GCE (G2 is L4 only; L4 needs G2; ...)."""
    shapes = catalog.machine_types_for(gpu)
    found = catalog.machine_types.get(machine_type) if machine_type else None
    if found is not None and found.bundled and found.gpu != gpu:
        return (
            f"{machine_type} comes with {found.gpu_count} x {found.gpu}, not {gpu}; set gpu: {found.gpu} "
            f"or pick one of: {', '.join(m.name for m in shapes) or 'an N1 type (n1-standard-4, n1-standard-8)'}"
        )
    if shapes and machine_type is not None and (found is None or not found.bundled):
        return (
            f"{gpu} is sold only with its accelerator-optimized machine types (the GPU count is fixed by the "
            f"type): {', '.join(f'{m.name} ({m.gpu_count} GPU)' for m in shapes)}"
        )
    return None


def flex_start_message(machine_type: str) -> str | None:
    """Dynamic Workload Scheduler (provisioningModel=FLEX_START) serves the families data/gce_rules.csv marks."""
    rule = load_gce_rules().family(machine_type)
    if rule is not None and rule.flex_start:
        return None
    return (
        f"provisioning: flex_start is not offered for {machine_type} (data/gce_rules.csv: G2, A2, A3 and A4 "
        "have it; G4 and A4X do not); use e.g. g2-standard-4 (L4), a3-highgpu-1g (H100) or a4-highgpu-8g "
        "(B200), or drop provisioning"
    )
