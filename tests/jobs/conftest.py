"""Fixtures for the jobs/ payload tests (helpers live in tfjob_cluster.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tfjob_cluster import Cluster, free_ports, training


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def factory(mode: str, workers: int = 2, **train_over: Any) -> Cluster:
        n = workers + (2 if mode == "async" else 0)
        ports = free_ports(n)
        addr = [f"127.0.0.1:{p}" for p in ports]
        if mode == "async":
            spec = {"chief": [addr[0]], "worker": addr[1 : 1 + workers], "ps": [addr[-1]]}
        else:
            spec = {"worker": addr}
        c = Cluster(tmp_path / f"c{len(made)}", mode, training(**train_over), spec)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.kill_all()
