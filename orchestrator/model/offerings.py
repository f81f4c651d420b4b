"""What Compute Engine can give today: retired GPUs, machine-type shapes, flex-start families.

Pure checks on the catalog (no I/O), used by spec validation, the planner and ``image bake``; each
returns the message a user sees (naming the fix), or None when the request is fine.
"""

from __future__ import annotations

import datetime as dt
import math

from orchestrator.model.catalog import CURRENT_BOOK, OVERRIDE_SOURCE, Catalog, Price, PriceBook
from orchestrator.model.gce_rules import load_gce_rules

_PLACEHOLDER = "placeholder"  # how a price row's note marks a figure no public page gives (data/SOURCES.md)


def price_note(book: PriceBook, gpu: str) -> str:
    """'$0.2818/h spot, $0.7068/h on-demand (whole g2-standard-4)' for one GPU in ``book``."""
    price = book.gpus.get(gpu)
    if price is None:
        return "not priced"
    what = "whole VM" if price.includes_host else "GPU only, host VM on top"
    what += "" if price.verified else ", unverified"
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


def unverified_price_notes(book: PriceBook, rows: list[tuple[str, Price]]) -> list[str]:
    """One line per price row used that no public figure confirms (a placeholder says so), naming the fix."""
    seen: dict[str, Price] = {}
    for key, price in rows:
        if not price.verified and price.source != OVERRIDE_SOURCE:
            seen.setdefault(key, price)
    out = []
    for key, p in seen.items():
        placeholder = p.note.startswith(_PLACEHOLDER)
        why = p.note.removeprefix(_PLACEHOLDER).strip(": ")
        out.append(f"the price of {key} in book {book.name} is {'a placeholder' if placeholder else 'unverified'} "
                   f"({why}; {'look it up at' if placeholder else 'source:'} {p.source}); "
                   f"set pricing.overrides.{key} to the price you pay")
    return out


def lifecycle_warnings(
    catalog: Catalog, gpus: list[str], today: dt.date, horizon_s: float, why: str
) -> list[str]:
    """A GPU whose GCE retirement / end of support falls while this job could still be running."""
    days = math.ceil(horizon_s / 86400) if math.isfinite(horizon_s) else 0
    until = today + dt.timedelta(days=days)
    out = []
    for gpu in dict.fromkeys(gpus):
        event = catalog.coming(gpu, today, until)
        if event is not None:
            out.append(
                f"{event.gce_accelerator} reaches its Compute Engine "
                f"{'retirement' if event.event == 'retired' else 'end of support'} on {event.date.isoformat()} "
                f"({event.source}): from then on VMs with it can no "
                f"longer be created, launched or accessed, and this job could still be running ({why}, "
                f"{days} days from {today.isoformat()}); finish before {event.date.isoformat()} or pick "
                f"another GPU"
            )
    return out
