"""Every figure in data/ cites where it came from: a public page a user can open, or this project's own
measurement with its provenance (the script that measured it, the method)."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from urllib.parse import urlparse

from orchestrator.model.catalog import load_catalog
from orchestrator.model.paths import data_dir

REPO = data_dir().parent
# A repository file named in a source: the measurement or the script that made it.
_REPO_FILE = re.compile(r"\b((?:data/measurements|bench)/[\w./-]+\.\w+)")


def _is_url(text: str) -> bool:
    url = urlparse(text)
    return url.scheme == "https" and "." in url.netloc and " " not in text


def source_problem(path: Path, row: dict[str, str]) -> str | None:
    """Why a row's source is not one a user can follow, else None."""
    source = (row.get("source") or row.get("source_url") or "").strip()  # gpu_arch.csv names it source_url
    if not source:
        return "no source"
    if _is_url(source.split(" ")[0]):
        return None
    if path.name == "policy.csv" and source.startswith("controller choice:"):
        return None  # a setting of this project, not a figure about the world: the row says why
    named = _REPO_FILE.search(source)
    if named is None or not (REPO / named.group(1)).is_file():
        return f"source {source!r} is neither a URL nor names a file of this repository's measurements"
    if not (row.get("method") or "").strip():
        return "a project measurement without its method"
    return None


def _csv_files() -> list[Path]:
    return sorted(p for p in data_dir().rglob("*.csv") if "raw" not in p.parts)


def test_every_row_of_every_data_csv_cites_a_source_a_user_can_open() -> None:
    problems = []
    files = _csv_files()
    assert {"prices.csv", "gpus.csv", "gce-preemptible-lifetimes-2019.csv"} <= {p.name for p in files}
    for path in files:
        with path.open(newline="") as fh:
            for line, row in enumerate(csv.DictReader(fh), start=2):
                if (why := source_problem(path, row)) is not None:
                    problems.append(f"{path.relative_to(data_dir())}:{line}: {why}")
    assert not problems, "\n".join(problems[:20])


def test_the_check_refuses_rows_without_a_followable_source(tmp_path: Path) -> None:
    prices = tmp_path / "prices.csv"
    assert source_problem(prices, {"source": ""}) == "no source"
    assert "neither a URL" in (source_problem(prices, {"source": "shared/REFERENCE.md"}) or "")
    assert "neither a URL" in (source_problem(prices, {"source": "SkyPilot GCP catalog v8"}) or "")
    assert "neither a URL" in (source_problem(prices, {"source": "controller choice: x"}) or "")
    assert source_problem(prices, {"source": "https://cloud.google.com/compute/gpus-pricing"}) is None
    measured = {"source": "measured by this project, bench/local_host.py", "method": ""}
    assert source_problem(tmp_path / "local_host.csv", measured) == "a project measurement without its method"


def test_the_catalog_carries_a_source_and_a_verified_mark_per_row() -> None:
    cat = load_catalog()
    book = cat.price_book("2026-11")
    rows = [*cat.gpus.values(), *cat.machine_types.values(), *book.gpus.values(), *book.machines.values(),
            *(e for events in cat.lifecycle.values() for e in events)]
    assert all(_is_url(r.source) for r in rows)
    assert all(_is_url(s) for s in cat.zone_sources.values())
    # What has no public figure is marked, never priced as fact.
    g4 = book.machines["g4-standard-48"]
    assert not g4.verified and g4.note.startswith("placeholder")
    assert not book.gpus["a100-80gb"].verified and not book.gpus["h100"].verified and not book.gpus["h200"].verified
    assert book.gpus["t4"].verified and book.machines["a2-highgpu-1g"].verified


def test_b200_is_priced_once_and_the_newest_figures_hold() -> None:
    cat = load_catalog()
    book = cat.price_book("2026-11")
    # The B200 SKU includes the whole a4 VM: 8 B200 = the machine type, no host on top.
    assert book.instance_price("a4-highgpu-8g", "b200", 8, spot=False) == 90.216
    assert book.instance_price("a4-highgpu-8g", "b200", 8, spot=True) == 32.6064
    assert [k for k, _ in book.rows_for("a4-highgpu-8g", "b200", 8)] == ["a4-highgpu-8g"]
    assert [k for k, _ in book.rows_for("n1-standard-4", "t4", 1)] == ["t4", "n1-standard-4"]
    assert cat.machine_type("a3-ultragpu-8g").egress_gbps == cat.machine_type("a4-highgpu-8g").egress_gbps == 3600
    assert cat.fact("spot_price_change_min_interval") == 86400  # daily, not every 30 days
