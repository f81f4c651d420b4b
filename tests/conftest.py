"""Shared fixtures: a real SQLite file and a real PostgreSQL database per test session."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator_testing.credentials import write_key
from orchestrator_testing.processes import SESSION_ENV, kill_all, left_behind

PG_ADMIN_URL = os.environ.get("ORCHESTRATOR_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REPO = Path(__file__).resolve().parent.parent


# Every process a test starts inherits this marker (unless given a built environment: then its folder, under
# the session's temporary root, or its parent chain gives it away); pytest_sessionfinish looks for them.
_SESSION_ID = uuid.uuid4().hex
os.environ[SESSION_ENV] = _SESSION_ID
_TMP_ROOT: list[Path] = []
LEFT_BEHIND_GRACE_S = 10.0  # a process stopped by the last test's teardown may take a moment to go


@pytest.fixture(scope="session", autouse=True)
def _session_tmp_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    _TMP_ROOT.append(tmp_path_factory.getbasetemp())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a process a test started is still running at the end (and stop it)."""
    root = _TMP_ROOT[0] if _TMP_ROOT else None
    deadline = time.monotonic() + LEFT_BEHIND_GRACE_S
    left = left_behind(_SESSION_ID, root)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = left_behind(_SESSION_ID, root)
    if not left:
        return
    lines = "\n".join(f"  {pid}: {cmd}" for pid, cmd in sorted(left.items()))
    print(f"\nFAILED: {len(left)} process(es) started by the tests were still running at the end "
          f"(stopped now: SIGTERM, then SIGKILL):\n{lines}", flush=True)
    kill_all(sorted(left))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# The real-process tier's order for .ci/run's 3 xdist workers (2 cores + 1). xdist hands each worker two tests ahead,
# so the two long poles (pipeline 226 s, hetero ~205 s at 300 steps; fresh-clone CI 2026-12-06) go where each worker's
# first two are, each with a short one, and the rest in the order that fills the workers best: 334 s against 356 s
# for the previous order in a replay of that CI's durations (337 s mean, 373 s worst with each test +-20%).
REAL_TIER_ORDER = (
    "test_a_pipeline_survives_the_revocation_of_a_stage",
    "test_sigterm_of_a_bench_that_launches_leaves_nothing_running", "test_torch_hetero_shrinks_and_grows",
    "test_the_survivors_keep_their_processes_through_the_revocation_of_worker_0",
    "test_local_job_survives_a_revocation", "test_gce_job_with_stockout_and_preemption",
    "test_replica_groups_on_gce_lose_worker_0_and_the_survivors_keep_their_processes",
    "test_survivors_continue_after_a_sigkill_inside_an_allreduce", "test_own_script_runs_to_exit_zero",
    "test_replica_groups_on_inventory_hosts_reach_their_lighthouse_through_ssh",
)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The real-process tier (``-m "slow and ..."``, .ci/run) imports only the test files that mark a test slow:
    the others' imports (TensorFlow, torch, the Compute client: about 12 s of CPU a worker) buy it nothing."""
    name = collection_path.name
    if not str(config.option.markexpr).startswith("slow") or not (name.startswith("test_") and name.endswith(".py")):
        return None
    return "mark.slow" not in collection_path.read_text()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests (real training processes, minutes each) first, in REAL_TIER_ORDER: under pytest-xdist
    (.ci/run) the long ones start at once and the short ones fill the other workers around them, instead of a few
    minutes' test running alone at the end."""
    rank = {name: i for i, name in enumerate(REAL_TIER_ORDER)}
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 rank.get(getattr(item, "originalname", item.name), len(rank))))


@pytest.fixture(scope="session")
def throwaway_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A service-account key no Google project knows (orchestrator_testing/credentials.py)."""
    return write_key(tmp_path_factory.mktemp("adc") / "key.json")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, throwaway_key: Path) -> None:
    # Never touch the developer's own DB or instances.
    monkeypatch.setenv("ORCHESTRATOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORCHESTRATOR_DB_URL", f"sqlite:///{tmp_path / 'home' / 'orchestrator.db'}")
    # Credentials as a user's machine has them (never the developer's own): GCE itself is called with them
    # (a dry run sends nothing); a loopback endpoint, e.g. the Compute API emulator, with none.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(throwaway_key))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'results.db'}"


@contextlib.contextmanager
def _throwaway_pg(prefix: str) -> Iterator[str]:
    """A new database on the real PostgreSQL server, dropped afterwards. Fails (never skips) when it is
    unreachable."""
    from sqlalchemy import create_engine, text

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001 - the message must say what to start
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is unreachable ({exc}); start it with "
                    "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start")
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    yield url
    from orchestrator.store.db import get_engine

    get_engine(url).dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """One throwaway PostgreSQL database for the session."""
    with _throwaway_pg("orch_test") as url:
        yield url


@pytest.fixture
def own_pg() -> Iterator[str]:
    """A throwaway PostgreSQL database for one test (tests that need an empty one)."""
    with _throwaway_pg("orch_ha") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    url: str = request.getfixturevalue("pg_url")
    from orchestrator.store.db import downgrade, upgrade

    upgrade(url)
    downgrade(url, "base")  # every test starts from an empty schema
    return url
