from __future__ import annotations

import csv

import pytest

from orchestrator.catalog import CatalogError, load_catalog, region_of
from orchestrator.paths import data_dir


def test_every_data_row_has_a_source() -> None:
    for path in data_dir().glob("*.csv"):
        if path.name.startswith("gce-preemptible"):
            continue  # the trace's source is in SOURCES.md
        with path.open() as fh:
            for row in csv.DictReader(fh):
                assert row.get("source"), f"{path.name}: row without a source: {row}"


def test_reference_figures() -> None:
    cat = load_catalog()
    assert cat.gpu("V100").fp32_tflops == 15.7
    assert cat.gpu("k80").memory_bw_gbs == 240
    assert cat.gpu_by_accelerator("nvidia-tesla-p100").key == "p100"
    # 2019 books price whole VMs; current books price the GPU and add the host.
    assert cat.price_book("2019-02").instance_price("n1-standard-4", "k80", 1, spot=True) == 0.256
    assert cat.price_book("2019-02").instance_price("n1-standard-4", None, 0, spot=False) == 0.143
    assert cat.price_book("current").instance_price("n1-standard-8", "v100", 1, spot=True) == pytest.approx(
        1.0885 + 0.1045
    )
    assert "us-central1-c" in cat.zones_for("k80")
    assert region_of("europe-west4-a") == "europe-west4"


def test_unknown_lookups_name_the_alternatives() -> None:
    cat = load_catalog()
    with pytest.raises(CatalogError, match="known: k80, p100"):
        cat.gpu("v200")
    with pytest.raises(CatalogError, match="no price for GPU 'a100'"):
        cat.price_book("current").instance_price("a2-highgpu-1g", "a100", 1, spot=True)
    book = cat.price_book("current").with_overrides(
        {"a100": (2.93, 0.88), "a2-highgpu-1g": (0.74, 0.22)}, set(cat.machine_types)
    )
    assert book.instance_price("a2-highgpu-1g", "a100", 1, spot=True) == pytest.approx(1.10)


def test_trace_is_carried_with_its_rows() -> None:
    with (data_dir() / "gce-preemptible-lifetimes-2019.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 152
    revoked = {g: sum(1 for r in rows if r["gpu"] == g and r["revoked"] == "1") for g in ("K80", "P100", "V100")}
    assert revoked == {"K80": 20, "P100": 8, "V100": 5}
