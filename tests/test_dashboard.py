"""`orchestrator dashboard` on a finished local job (fast-forwarded: the real daemon on a virtual clock), looked at in
headless Chromium (Debian's chromium)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator_testing.processes import stop
from tests.e2e_helpers import REPO, tiny_spec

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SAVE_ENV = "ORCHESTRATOR_SAVE_SCREENSHOT"  # set to a path (e.g. docs/dashboard.png) to keep the screenshot


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: `apt-get install -y chromium` (.ci/run installs it)")
    return found


def browse(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
                              capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def finished_local_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], str]]:
    """A local job with a revocation, driven by the real daemon's passes on the virtual clock (tests/fastforward.py):
    its results DB and storage as a launch leaves them, in seconds. The real launch's own rows are the README demo's
    test (tests/test_local_e2e.py), which also reads an instance's log back from storage."""
    from tests.fastforward import fast_forward, spec_of

    root = tmp_path_factory.mktemp("dash")
    with pytest.MonkeyPatch.context() as monkeypatch:
        run = fast_forward(spec_of(tiny_spec("dash", root / "runs", schedule=[("worker-0", 40)], steps=160)), root,
                           monkeypatch)
    assert run.job["status"] == "succeeded", run.timeline()
    env = {"ORCHESTRATOR_HOME": str(root / "home"), "ORCHESTRATOR_DB_URL": f"sqlite:///{root}/results.db"}
    yield env, run.job["id"]


@pytest.fixture(scope="module")
def dashboard(finished_local_job: tuple[dict[str, str], str]) -> Iterator[str]:
    env, _ = finished_local_job
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "dashboard", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, **env})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "dashboard on http://127.0.0.1:PORT/ ..."
        assert "http://" in line, line + (proc.stderr.read() if proc.stderr else "")
        yield line.split()[2]
    finally:
        stop(proc, timeout_s=10)


def test_jobs_page_lists_the_finished_job(dashboard: str, finished_local_job: tuple[dict[str, str], str]) -> None:
    _, job_id = finished_local_job
    dom = browse(dashboard, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f'href="/job/{job_id}"' in dom.stdout and ">succeeded<" in dom.stdout
    assert 'http-equiv="refresh"' not in dom.stdout  # nothing is running: no refreshing


def test_job_page_shows_status_events_metrics_and_plot(dashboard: str,
                                                       finished_local_job: tuple[dict[str, str], str],
                                                       tmp_path: Path) -> None:
    _, job_id = finished_local_job
    page = f"{dashboard}job/{job_id}"
    dom = browse(page, "--dump-dom").stdout
    assert f"<h1>{job_id} " in dom and 'id="job-status">succeeded<' in dom
    assert f"worker-0 ({job_id}-worker-0-0)" in dom  # events name their instance
    assert "training -&gt; deleting" in dom and "every instance deleted" in dom
    assert "<td>step</td>" in dom and "<td>eval</td>" in dom  # training metrics rows
    assert f'src="/job/{job_id}/plot.png' in dom
    with urllib.request.urlopen(f"{page}/plot.png", timeout=60) as resp:
        assert resp.headers["Content-Type"] == "image/png" and resp.read(8) == b"\x89PNG\r\n\x1a\n"
    shot = tmp_path / "dashboard.png"
    out = browse(page, f"--screenshot={shot}", "--window-size=1280,900")
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    assert struct.unpack(">II", shot.read_bytes()[16:24]) == (1280, 900)
    if os.environ.get(SAVE_ENV):
        shutil.copyfile(shot, os.environ[SAVE_ENV])


def test_unknown_job_is_404(dashboard: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{dashboard}job/nope", timeout=30)
    assert err.value.code == 404


@pytest.fixture(scope="module")
def quick_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The dashboard over a finished job's real rows (tests/obs_helpers.py): no launch needed."""
    from orchestrator.store.db import open_session
    from tests.obs_helpers import finished_job

    root = tmp_path_factory.mktemp("dash-quick")
    url = f"sqlite:///{root / 'r.db'}"
    with open_session(url) as session:
        job_id = finished_job(session, root / "runs")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "dashboard", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "ORCHESTRATOR_DB_URL": url})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "http://" in line, line + (proc.stderr.read() if proc.stderr else "")
        yield line.split()[2], job_id
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_unknown_pages_are_the_dashboards_own_with_a_link_back(quick_dashboard: tuple[str, str],
                                                              tmp_path: Path) -> None:
    base, _ = quick_dashboard
    for path, said in (("job/nope", "no job &#39;nope&#39; in this results DB"), ("nothing/here", "no such page")):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}{path}", timeout=30)
        body = err.value.read().decode()
        assert err.value.code == 404 and said in body and 'href="/">Back to all jobs</a>' in body, body
    dom = browse(f"{base}job/nope", "--dump-dom")
    assert dom.returncode == 0 and 'id="not-found">no job' in dom.stdout and "Back to all jobs" in dom.stdout
    shot = tmp_path / "unknown.png"
    out = browse(f"{base}job/nope", f"--screenshot={shot}", "--window-size=900,400")
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    if os.environ.get(SAVE_ENV):
        shutil.copyfile(shot, Path(os.environ[SAVE_ENV]).with_name("dashboard-unknown.png"))


def test_the_cluster_column_breaks_between_parts_never_inside_one(quick_dashboard: tuple[str, str],
                                                                  tmp_path: Path) -> None:
    base, job_id = quick_dashboard
    dom = browse(base, "--dump-dom").stdout
    cell = dom.split('class="wrap">', 1)[1].split("</td>", 1)[0]
    parts = cell.split("<wbr>")
    assert len(parts) > 1 and all(p.endswith("+") for p in parts[:-1]), cell  # a break only after a "+"
    css = urllib.request.urlopen(base, timeout=30).read().decode()
    assert "anywhere" not in css and "break-all" not in css  # nothing lets the browser split a word
    shot = tmp_path / "narrow.png"  # a narrow window: the cluster wraps at "+", never "(spo" / "t)"
    assert browse(base, f"--screenshot={shot}", "--window-size=700,400").returncode == 0 and shot.exists()
    if os.environ.get(SAVE_ENV):
        shutil.copyfile(shot, Path(os.environ[SAVE_ENV]).with_name("dashboard-narrow.png"))


def test_pages_of_a_running_job_refresh_themselves(tmp_path: Path) -> None:
    from orchestrator.cli.dashboard import create_app
    from orchestrator.store.db import open_session
    from orchestrator.store.models import Job
    from tests.obs_helpers import finished_job

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_session(url) as session:
        job_id = finished_job(session, tmp_path / "runs")
        job = session.get(Job, job_id)
        assert job is not None
        job.status = "running"  # as seen mid-run
        session.commit()
    client = create_app(url).test_client()
    for path in ("/", f"/job/{job_id}"):
        page = client.get(path)
        assert page.status_code == 200 and b'http-equiv="refresh" content="5"' in page.data
    svg = client.get(f"/job/{job_id}/plot.svg")
    assert svg.status_code == 200 and svg.mimetype == "image/svg+xml" and b"<svg" in svg.data
    assert client.get(f"/job/{job_id}/plot.gif").status_code == 404


def test_port_in_use_is_a_one_line_usage_error() -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "dashboard", "--port", str(port)],
                             capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 2 and "--port" in out.stderr and "Traceback" not in out.stderr
