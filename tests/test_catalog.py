from __future__ import annotations

import csv
import datetime as dt

import pytest

from orchestrator.model.catalog import CatalogError, load_catalog, region_of
from orchestrator.model.paths import data_dir


def test_reference_figures() -> None:
    cat = load_catalog()
    assert cat.gpu("V100").fp32_tflops == 15.7
    assert cat.gpu("k80").memory_bw_gbs == 240
    assert cat.gpu_by_accelerator("nvidia-tesla-p100").key == "p100"
    # 2019 books price whole VMs; for N1 the 2026 book prices the GPU and adds the host.
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
    with pytest.raises(CatalogError, match="'p10O' is not a GPU type; did you mean p100\\? known: k80"):
        cat.gpu("p10O")
    with pytest.raises(CatalogError, match="no price for machine type 'a2-highgpu-1g'"):
        cat.price_book("2019-02").instance_price("a2-highgpu-1g", "a100", 1, spot=True)
    with pytest.raises(CatalogError, match="'2019-03' is not a price book; did you mean 2019-02"):
        cat.price_book("2019-03")


def test_overrides_of_bundled_machine_types() -> None:
    cat = load_catalog()
    # A GPU override prices an accelerator-optimized machine type per GPU (vCPU and memory included) ...
    gpu_only = cat.price_book("current").with_overrides({"h100": (9.0, 3.0)}, set(cat.machine_types))
    assert gpu_only.instance_price("a3-highgpu-2g", "h100", 2, spot=True) == pytest.approx(6.0)
    # ... and a machine-type override prices the whole machine, whatever the GPU rows say.
    both = cat.price_book("current").with_overrides(
        {"a100": (2.93, 0.88), "a2-highgpu-1g": (3.5, 1.1)}, set(cat.machine_types)
    )
    assert both.instance_price("a2-highgpu-1g", "a100", 1, spot=True) == pytest.approx(1.1)
    # N1 hosts still add the attached GPU to the host.
    assert both.instance_price("n1-standard-4", "t4", 1, spot=False) == pytest.approx(0.35 + 0.19)


def test_trace_is_carried_with_its_rows() -> None:
    with (data_dir() / "gce-preemptible-lifetimes-2019.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 152
    revoked = {g: sum(1 for r in rows if r["gpu"] == g and r["revoked"] == "1") for g in ("K80", "P100", "V100")}
    assert revoked == {"K80": 20, "P100": 8, "V100": 5}


def test_current_is_the_newest_dated_book_and_prices_every_2026_gpu() -> None:
    cat = load_catalog()
    book = cat.price_book("current")
    assert book.name == "2026-11" and cat.resolve_book("current") == "2026-11"
    assert "k80" not in book.gpus  # the fake K80 row is gone: K80 is retired
    today = dt.date(2026, 11, 23)
    for gpu in ("t4", "v100", "l4", "rtx-pro-6000", "a100", "a100-80gb", "h100", "h200", "b200"):
        assert cat.unavailable(gpu, today) is None, gpu
        assert book.gpu_hourly(gpu, True) is not None and cat.zones_for(gpu), gpu
        machine = cat.gpu(gpu).default_machine_type
        count = cat.gpus_per_instance(machine)
        assert 0 < book.instance_price(machine, gpu, count, spot=True) < book.instance_price(machine, gpu, count, False)


def test_machine_types_fix_the_gpu_count_and_are_priced_whole() -> None:
    cat = load_catalog()
    assert [m.name for m in cat.machine_types_for("h100")] == [
        "a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g", "a3-highgpu-8g"
    ]
    assert cat.gpus_per_instance("a3-highgpu-2g") == 2 and cat.gpus_per_instance("n1-standard-8") == 1
    book = cat.price_book("2026-11")
    # Whole machine type (host + 2 H100), not the GPU row on top of a host.
    assert book.instance_price("a3-highgpu-2g", "h100", 2, spot=False) == pytest.approx(10.76654)
    assert book.instance_price("g2-standard-4", "l4", 1, spot=True) == pytest.approx(0.28184)


def test_retirement_dates_are_data() -> None:
    cat = load_catalog()
    k80 = cat.unavailable("k80", dt.date(2026, 11, 23))
    assert k80 is not None and k80.date == dt.date(2024, 5, 1) and k80.event == "retired"
    assert cat.unavailable("p100", dt.date(2026, 9, 14)) is None
    assert cat.unavailable("p100", dt.date(2026, 9, 15)) is not None
    assert cat.unavailable("t4", dt.date(2027, 7, 31)) is None
    t4 = cat.unavailable("t4", dt.date(2027, 8, 1))
    assert t4 is not None and t4.event == "end_of_support"  # like P100's: no create, launch or access
    near = cat.closest_current("k80", cat.price_book("current"), today=dt.date(2026, 11, 23))
    assert [key for key, _, _ in near][:1] == ["t4"] and all(od > sp > 0 for _, od, sp in near)
