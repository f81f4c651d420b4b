"""The daemon's Prometheus endpoint: DB-backed gauges at scrape time, latency histograms, deploy/ files."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from orchestrator.control import metrics
from orchestrator.model.status import InstanceStatus as S
from orchestrator.storage import open_storage
from orchestrator.store import queries
from orchestrator.store.db import open_session
from orchestrator.store.models import Instance
from tests.obs_helpers import finished_job

REPO = Path(__file__).resolve().parent.parent


def _scrape(url: str, port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def test_metrics_endpoint_reads_the_db_at_scrape_time(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    with open_session(url) as session:
        job_id = finished_job(session, tmp_path / "runs", t0=time.time() - 200)
    registry = CollectorRegistry()
    port = metrics.serve(0, registry=registry, url=url)
    body = _scrape(url, port)
    assert 'orchestrator_db_up 1.0' in body
    assert 'orchestrator_jobs{state="succeeded"} 1.0' in body
    assert 'orchestrator_revocations_total{gpu="k80",provider="local",zone="local"} 1.0' in body
    spend = re.search(rf'orchestrator_job_spend_usd{{job="{job_id}",name="obs",provider="local",'
                      r'state="succeeded"} ([0-9.e-]+)', body)
    assert spend is not None and float(spend.group(1)) > 0
    assert f'orchestrator_job_step{{job="{job_id}"}} 200.0' in body
    assert f'orchestrator_job_budget_usd{{job="{job_id}"}} 5.0' in body
    # a row written by anyone (another daemon, a foreground launch) shows at the next scrape
    with open_session(url) as session:
        inst = session.scalars(select(Instance).where(Instance.name == f"{job_id}-worker-1-0")).one()
        inst.status = S.TRAINING.value
        session.commit()
    assert ('orchestrator_instances{billing="on-demand",gpu="v100",provider="local",state="training",'
            'zone="local"} 1.0') in _scrape(url, port)


def _count(h: object) -> float:
    for fam in h.collect():  # type: ignore[attr-defined]
        for sample in fam.samples:
            if sample.name.endswith("_count"):
                return float(sample.value)
    return 0.0


def test_latencies_are_observed_once_from_new_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    storage = tmp_path / "runs"
    with open_session(url) as session:
        job_id = finished_job(session, storage, t0=time.time() - 500)
        watch = metrics.LatencyWatch()
        watch.observe(session)  # the first look only sets the watermark: history is not replayed
        before = _count(metrics.REPLACEMENT_LATENCY), _count(metrics.NOTICE_TO_CHECKPOINT)
        now = time.time()
        old = session.scalars(select(Instance).where(Instance.name == f"{job_id}-worker-1-0")).one()
        old.revoked_at = now - 30
        new = Instance(job_id=job_id, name=f"{job_id}-worker-1-1", role="worker", slot_index=1, generation=1,
                       gpu="v100", machine_type="local", zone="local", spot=True, price_per_hour=1.0,
                       status=S.READY.value, requested_at=now - 29, updated_at=now - 29)
        session.add(new)
        session.flush()
        queries.switch_status(session, new, S.TRAINING, "start", now=now - 18)
        open_storage(str(storage), job_id).write_notice(old.name, json.dumps({"instance": old.name,
                                                                              "at": now - 31.5}))
        queries.note(session, job_id, "checkpoint", "checkpoint at step 99 after a preemption notice", now=now - 30)
        session.commit()
        watch.observe(session)
        watch.observe(session)  # nothing new: nothing counted twice
        passes = _count(metrics.PASS_SECONDS)
        with metrics.pass_metrics(session, watch):
            pass
    assert _count(metrics.REPLACEMENT_LATENCY) - before[0] == 1
    assert _count(metrics.NOTICE_TO_CHECKPOINT) - before[1] == 1
    assert _count(metrics.PASS_SECONDS) - passes == 1
    buckets = {s.labels["le"]: s.value for f in metrics.NOTICE_TO_CHECKPOINT.collect() for s in f.samples
               if s.name.endswith("_bucket")}
    assert buckets["1.0"] < buckets["2.0"]  # 1.5 s from notice to checkpoint


def test_deploy_compose_and_grafana_dashboard_parse_and_use_real_metric_names() -> None:
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "daemon", "prometheus", "grafana"} <= set(services)
    daemon = " ".join(map(str, services["daemon"]["command"]))
    # Prometheus scrapes it from another container: the metrics listen beyond loopback there (by default not).
    assert "--metrics-port 9100 --metrics-host 0.0.0.0" in daemon
    prom = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert "daemon:9100" in targets
    dash = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "orchestrator.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 8
    known = {"orchestrator_jobs", "orchestrator_instances", "orchestrator_revocations_total",
             "orchestrator_job_spend_usd", "orchestrator_job_budget_usd", "orchestrator_job_step",
             "orchestrator_job_train_steps", "orchestrator_pass_duration_seconds_bucket",
             "orchestrator_notice_to_checkpoint_seconds_bucket", "orchestrator_replacement_latency_seconds_bucket",
             "orchestrator_db_up"}
    used = {m for e in exprs for m in re.findall(r"orchestrator_[a-z_]+", e)}
    assert used <= known, used - known
    assert {"orchestrator_notice_to_checkpoint_seconds_bucket", "orchestrator_replacement_latency_seconds_bucket",
            "orchestrator_pass_duration_seconds_bucket", "orchestrator_job_spend_usd"} <= used
    for path in (REPO / "deploy" / "grafana" / "provisioning").rglob("*.yaml"):
        assert yaml.safe_load(path.read_text())["apiVersion"] == 1
